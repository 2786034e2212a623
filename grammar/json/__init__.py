"""JSON Schema -> automata: one converter (schema) over per-type parts (strings, numbers, arrays, objects, ...)."""

from .schema import CompiledSchema, compile_schema, normalize_schema, schema_to_regex

__all__ = ["CompiledSchema", "compile_schema", "normalize_schema", "schema_to_regex"]
