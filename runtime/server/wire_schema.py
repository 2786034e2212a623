"""Wire schemas: one typed field table per route, checked once at the door (types, ranges, defaults, support).

A `Schema` lists every field a route accepts: SGLang's own fields (at SGLang's defaults), the ones
sglang-router adds, and sglpy's few extensions. Each `WireField` says how its value is checked and
whether this server implements it (`IMPL`), accepts it without effect for a documented reason
(`NOOP`), or accepts only its default (`DEFAULT_ONLY`: any other value is a 400 naming it).
`null` means "the default" for every field, as in SGLang. The tables themselves are in wire_tables.py;
docs/server.md renders them with `markdown()`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Callable

from .http_common import ApiError

REQUIRED = object()  # the default of a field that must be given
MAX_INT64 = (1 << 63) - 1


class Support(enum.Enum):
    IMPL = "implemented"
    NOOP = "accepted, no effect"
    DEFAULT_ONLY = "default only"


@dataclass(frozen=True)
class Check:
    """A type/range predicate and the phrase used in its error message ("must be <desc>")."""

    pred: Callable[[Any], bool]
    desc: str
    plural: str = ""  # how a list of these is described ("ints"); empty: "(desc) items"

    def __call__(self, v) -> bool:
        return self.pred(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_INT64 - 1 <= v <= MAX_INT64


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


BOOL = Check(lambda v: isinstance(v, bool), "a bool (true/false)", "bools")
INT = Check(_is_int, "an int", "ints")
NUM = Check(_is_num, "a finite number", "numbers")
STR = Check(lambda v: isinstance(v, str), "a string", "strings")
DICT = Check(lambda v: isinstance(v, dict), "an object", "objects")
LIST = Check(lambda v: isinstance(v, list), "a list")
ANY = Check(lambda v: True, "any JSON value")


def int_range(lo: int | None = None, hi: int | None = None) -> Check:
    """An int in [lo, hi] (either bound optional)."""
    parts = [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""]
    desc = "an int " + " and ".join(p for p in parts if p) if any(parts) else "an int"
    if lo is not None and lo == hi:
        desc = f"{lo}"
    return Check(lambda v: _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi), desc)


def list_of(item: Check, max_len: int | None = None, non_empty: bool = False) -> Check:
    """A list whose items all pass `item` (at most `max_len`)."""
    what = item.plural or f"({item.desc}) items"
    desc = f"a {'non-empty ' if non_empty else ''}list of {what}" + (f" (at most {max_len})" if max_len else "")
    return Check(lambda v: isinstance(v, list) and all(item(x) for x in v) and (max_len is None or len(v) <= max_len)
                 and (not non_empty or len(v) > 0), desc, f"lists of {what}")


def dict_of(key: Check, value: Check, desc: str) -> Check:
    """An object whose keys pass `key` and values pass `value`."""
    return Check(lambda v: isinstance(v, dict) and all(key(k) and value(x) for k, x in v.items()), desc)


def one_of(*checks: Check) -> Check:
    """Any of `checks`."""
    return Check(lambda v: any(c(v) for c in checks), " or ".join(c.desc for c in checks))


INT_LIST = list_of(INT)
STR_LIST = list_of(STR)
STR_OR_LIST = one_of(STR, STR_LIST)
BOOL_OR_LIST = one_of(BOOL, list_of(BOOL))
INT_OR_LIST = one_of(INT, list_of(INT))
IDS = one_of(INT_LIST, list_of(INT_LIST))
STR_DICT = dict_of(STR, STR, "an object of strings")


@dataclass(frozen=True)
class WireField:
    """One request field: its check, SGLang's default, whether we implement it, and one line of doc."""

    name: str
    check: Check
    default: Any
    support: Support
    doc: str
    origin: str = "sglang"  # sglang | router (added by sglang-router) | openai | sglpy (our extension)
    also_default: tuple = ()  # other values that mean the same as the default here
    null_is_value: bool = False  # null is a real value (max_new_tokens: no cap), not "the default"

    def is_default(self, v) -> bool:
        """Whether `v` asks for nothing beyond the default (null, the default, an empty value, a list of those)."""
        if v is None or _same(v, self.default) or any(_same(v, d) for d in self.also_default):
            return True
        if self.default in (None, False) or _same(self.default, []) or _same(self.default, {}):
            if v is False or (isinstance(v, (list, dict, str)) and not v):
                return True
            if isinstance(v, list):  # a per-item list of defaults
                return all(self.is_default(x) for x in v)
        return False


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b  # true is not 1
    return type(a) is type(b) and a == b if isinstance(a, (list, dict, str)) else a == b


@dataclass(frozen=True)
class Schema:
    """The fields of one route's request object (or of a nested object such as sampling_params)."""

    name: str  # how error messages name the object, e.g. "sampling_params"
    fields: tuple[WireField, ...]
    title: str = ""  # heading in docs/server.md

    def field(self, name: str) -> WireField:
        """The field called `name` (KeyError if the schema has none)."""
        return self._index()[name]

    def _index(self) -> dict[str, WireField]:
        return {f.name: f for f in self.fields}

    def validate(self, obj, where: str | None = None) -> dict:
        """400 for unknown fields, wrong types and unsupported non-defaults; returns the implemented fields given.

        The result maps each IMPL field present with a non-null value (or null where null is a value) to
        its value; NOOP and DEFAULT_ONLY fields are checked and left out.
        """
        where = where or self.name
        if not isinstance(obj, dict):
            raise ApiError(400, f"{where} must be an object, got {_show(obj)}", param=where)
        index = self._index()
        unknown = sorted(k for k in obj if k not in index)
        if unknown:
            raise ApiError(400, f"unknown field(s) in {where}: {unknown}", param=unknown[0])
        out = {}
        for f in self.fields:
            if f.name not in obj or (obj[f.name] is None and not f.null_is_value):
                if f.default is REQUIRED:
                    raise ApiError(400, f"{where}.{f.name} is required", param=f.name)
                continue
            v = obj[f.name]
            if v is not None and not f.check(v):
                raise ApiError(400, f"{where}.{f.name} must be {f.check.desc}, got {_show(v)}", param=f.name)
            if f.support is Support.DEFAULT_ONLY and not f.is_default(v):
                raise ApiError(400, f"{where}.{f.name} is not supported by this server (only its default, "
                                    f"{_show(f.default)}, is accepted), got {_show(v)}", param=f.name)
            if f.support is Support.IMPL:
                out[f.name] = v
        return out


def _show(v) -> str:
    try:
        text = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def markdown(schema: Schema) -> str:
    """The schema as a docs/server.md table: field, type, default, support, doc."""
    rows = [f"#### {schema.title or schema.name}", "", "| field | type | default | support | notes |",
            "|---|---|---|---|---|"]
    for f in schema.fields:
        default = "required" if f.default is REQUIRED else f"`{json.dumps(f.default)}`"
        origin = "" if f.origin == "sglang" else f" ({f.origin})"
        doc = f.doc.replace("|", "\\|")
        rows.append(f"| `{f.name}`{origin} | {f.check.desc.replace('|', '/')} | {default} | {f.support.value} | "
                    f"{doc} |")
    return "\n".join(rows) + "\n"
