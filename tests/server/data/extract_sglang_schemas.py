"""Extract SGLang's request schemas (field names and defaults) from its installed source, without importing it.

    python tests/server/data/extract_sglang_schemas.py [SITE_PACKAGES_SGLANG_DIR] > tests/server/data/sglang_schemas.json

Reads the class bodies with `ast` (importing sglang.srt needs CUDA-side packages), so it runs wherever
the `sglang` package files are present (e.g. `pip install --no-deps sglang==0.5.23`). Output: for each
request schema, {field: default}, where a default that is not a literal is the string "<expr: SOURCE>"
and a field without a default is "<required>". tests/server/test_server_wire_schema.py compares
sglpy's wire tables (runtime/server/wire_tables.py) with the committed JSON, so the test never needs
sglang installed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import sys

# (output name, file under the sglang package, class names whose fields are merged, base classes first)
SCHEMAS = [
    ("generate", "srt/managers/io_struct.py", ["GenerateReqInput"]),
    ("sampling_params", "api/v1/api_types.py", ["SamplingParams"]),
    ("completions", "srt/entrypoints/openai/protocol.py", ["PDRoutingFields", "CompletionRequest"]),
    ("chat_completions", "srt/entrypoints/openai/protocol.py", ["PDRoutingFields", "ChatCompletionRequest"]),
    ("chat_message", "srt/entrypoints/openai/protocol.py", ["ChatCompletionMessageGenericParam"]),
    ("stream_options", "srt/entrypoints/openai/protocol.py", ["StreamOptions"]),
]
REQUIRED = "<required>"


def _constants(tree: ast.Module) -> dict:
    """Module-level NAME = <literal or simple arithmetic> assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = _literal(node.value, out)
            except ValueError:
                pass
    return out


def _literal(node: ast.AST, consts: dict):
    """The value of a literal expression (names resolved from `consts`); ValueError otherwise."""
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.LShift, ast.Pow, ast.Mult, ast.Add)):
        a, b = _literal(node.left, consts), _literal(node.right, consts)
        return {ast.LShift: lambda: a << b, ast.Pow: lambda: a ** b, ast.Mult: lambda: a * b,
                ast.Add: lambda: a + b}[type(node.op)]()
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        raise ValueError(ast.unparse(node)) from None


def _default(value: ast.AST | None, consts: dict):
    if value is None:
        return REQUIRED
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) in ("field", "Field"):
        kw = {k.arg: k.value for k in value.keywords}
        if "default" in kw:
            return _default(kw["default"], consts)
        if value.args:
            return _default(value.args[0], consts)
        if "default_factory" in kw:
            factory = ast.unparse(kw["default_factory"])
            return {"list": [], "dict": {}, "set": []}.get(factory, f"<expr: {factory}()>")
        return REQUIRED
    try:
        return _literal(value, consts)
    except ValueError as e:
        return f"<expr: {e}>"


def class_fields(tree: ast.Module, name: str, consts: dict) -> dict:
    """Annotated fields of class `name` (private `_x` attributes and ClassVars skipped), in order."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            field = node.target.id
            if field.startswith("_") or "ClassVar" in ast.unparse(node.annotation):
                continue
            out[field] = _default(node.value, consts)
    return out


def extract(root: pathlib.Path) -> dict:
    """{schema: {field: default}} for every schema in SCHEMAS, read from the sglang package at `root`."""
    result = {}
    for out_name, rel, classes in SCHEMAS:
        tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        consts = _constants(tree)
        fields: dict = {}
        for cls in classes:
            fields.update(class_fields(tree, cls, consts))
        result[out_name] = fields
    return result


def main() -> None:
    if len(sys.argv) > 1:
        root = pathlib.Path(sys.argv[1])
    else:
        spec = importlib.util.find_spec("sglang")  # locates the package without running sglang/__init__
        if spec is None or not spec.submodule_search_locations:
            sys.exit("sglang is not installed; give its package directory")
        root = pathlib.Path(list(spec.submodule_search_locations)[0])
    version = "unknown"
    for meta in root.parent.glob("sglang-*.dist-info/METADATA"):
        version = next((line.split(":", 1)[1].strip() for line in meta.read_text().splitlines()
                        if line.startswith("Version:")), version)
    json.dump({"sglang_version": version, "schemas": extract(root)}, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
