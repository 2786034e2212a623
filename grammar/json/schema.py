"""JSON Schema -> byte DFA: every assertion of the schema's draft enforced exactly or refused by name.

Two approximations are computed per subschema: `under` (every accepted text is valid: what is generated)
and `over` (every valid text in the generated universe is accepted: what `not`, `oneOf`'s exclusivity and
`if`'s else-branch subtract). Negation is then exact set difference of automata: under(A and not B) =
under(A) minus over(B). Annotations and keywords unknown to the draft are ignored and listed.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from . import formats as F
from ..budget import CompileBudget
from ..errors import GrammarError, is_fatal, too_large
from ..regex.fsa import is_empty
from . import arrays, automata, negation, numbers, objects, over, recursion, strings
from .formats import ANY_NUMBER_RE
from .normal import TYPES, Ctx, Norm, Sub, add_part, alt, is_json_type
from .numbers import MAX_DIGITS
from .over import ANY_DEPTH
from .refs import ROOT_URI, SchemaRegistry
from .universe import any_module
from .vocab import DEFAULT_DRAFT, detect_draft, ref_overrides_siblings
from ..regex.nfa import ATOM_BASE, ATOM_END, OptionalSlots
from ..rtn.module import Module
from ..rtn.program import Program

MAX_DEPTH = 16  # instance nesting the converter generates; deeper optional parts are dropped
MAX_BRANCHES = 256  # anyOf / oneOf / if combinations explored at one instance position
_LONE_REF = {"$ref", "description", "title", "$comment", "default", "examples"}  # $ref with annotations only


@dataclass(frozen=True)
class CompiledSchema:
    """A schema's automaton (a module network) plus what the compile ignored (annotations, unknown keywords)."""

    module: Module
    draft: str
    ignored: tuple[str, ...]
    relaxed: tuple[str, ...]  # strict=False: constraints not enforced
    narrowed: tuple[str, ...] = ()  # constraints enforced by generating a smaller (still valid) language

    @property
    def dfa(self) -> "Program":
        """The automaton as a byte matcher (`fullmatch`, `num_states`), without flattening it."""
        from ..rtn.program import Program

        return Program(self.module)


def normalize_schema(schema: Any) -> Any:
    """Accept a dict, a JSON string, a bool, or a pydantic model class / instance; return plain JSON data."""
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    elif isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
        except RecursionError:
            raise GrammarError("json_schema is nested too deeply to compile") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"json_schema must be an object or boolean, got {type(schema).__name__}")
    return schema


def compile_schema(schema: Any, whitespace_pattern: str | None = None, strict: bool = True,
                   max_recursion_depth: int = 3, budget: CompileBudget | None = None,
                   default_draft: str = DEFAULT_DRAFT, documents: Mapping[str, Any] | None = None) -> CompiledSchema:
    """Minimal DFA of the JSON texts (in the layout) valid under `schema`; GrammarError names what is refused.

    documents: schemas that remote `$ref`s may point into, URI -> schema (pre-loaded by the caller; never fetched)."""
    budget = budget or CompileBudget(time_s=None)
    schema = normalize_schema(schema)
    draft = detect_draft(schema, default_draft)
    conv = SchemaConverter(schema, draft, whitespace_pattern, strict, max_recursion_depth, budget, documents)
    try:
        regex = conv.under(Sub(schema, conv.root_ctx))
    except RecursionError:
        raise GrammarError("json_schema is nested too deeply to compile") from None
    if regex is None:
        raise GrammarError(f"json_schema admits no document (false subschemas, contradictory keywords, or $ref "
                           f"recursion deeper than {max_recursion_depth})")
    mod = automata.module(conv, regex, "the JSON schema")
    if is_empty(mod):
        raise GrammarError("json_schema admits no document (its constraints contradict each other)")
    return CompiledSchema(mod, draft, tuple(sorted(conv.ignored)), tuple(conv.relaxed), tuple(sorted(conv.narrowed)))


def schema_to_regex(schema: Any, whitespace_pattern: str | None = None, strict: bool = True,
                    max_recursion_depth: int = 3) -> str:
    """The schema as one plain regex, for schemas that need no automaton algebra (GrammarError otherwise)."""
    schema = normalize_schema(schema)
    conv = SchemaConverter(schema, detect_draft(schema), whitespace_pattern, strict, max_recursion_depth,
                           CompileBudget(time_s=None))
    conv.plain_text = True
    regex = conv.under(Sub(schema, conv.root_ctx))
    if regex is None:
        raise GrammarError("json_schema admits no document")
    if conv.atoms:
        raise GrammarError("this schema needs automaton algebra (no plain regex): use compile_schema")
    return regex


class SchemaConverter:
    """Walks one root schema; subschema languages are regexes whose atoms are precompiled modules.

    It holds one compile's state (atoms, caches, budget, layout) and the recursion (under / over); each JSON
    type's language comes from a plain function of its module (strings, numbers, arrays, objects), picked
    by the VALUES table."""

    def __init__(self, root: Any, draft: str, ws: str | None, strict: bool, max_recursion_depth: int,
                 budget: CompileBudget, documents: Mapping[str, Any] | None = None):
        self.root, self.draft, self.strict, self.max_rec = root, draft, strict, max_recursion_depth
        self.budget, self.max_states = budget, budget.max_states
        self.registry = SchemaRegistry(root, draft, documents)
        if _has_marker(root) or any(_has_marker(self.registry.resources[u]) for u in self.registry.loaded):
            raise GrammarError("json_schema contains private-use characters U+F0000..U+FFFFD, which the "
                               "compiler reserves")
        # instances nest at most this deep (schema nesting, times $ref hops, capped): the universe's depth
        hops = 1 + self.registry.ref_count * max_recursion_depth
        self.max_level = min(MAX_DEPTH, (self.registry.depth + 1) * hops)
        self.root_ctx = Ctx(self.registry.base(root, ROOT_URI), (self.registry.base(root, ROOT_URI),), (), 0)
        self.atoms: dict[int, Module | OptionalSlots] = {}
        self._atom_of: dict[int, str] = {}  # id(automaton) -> marker (kept alive in self._alive)
        self._alive: list = []
        self.dfa_cache: dict = {}
        self.module_cache: dict[str, Module] = {}
        self.flat_cache: dict = {}
        self.combine_cache: dict = {}
        self.sub_cache: dict = {}  # under / over per subschemas (see under_subs, over)
        self._canon_ids: dict[int, int] = {}  # id(subschema) -> id of the first equal one (see _canon)
        self._canon_of: dict[str, Any] = {}
        self.frames: dict = {}  # positions being built (under_subs key -> recursion.Frame)
        self.pending = 0  # frames whose pending module is not resolved yet
        self.unrolling = 0  # > 0: building below a position whose pending module could not stand (no calls)
        self._dropped_branch = False  # a oneOf branch was dropped for size (see _exclusive_part)
        self._cuts = 0  # depth / recursion cut-offs met so far (results shaped by one are cached per position)
        self._depth_cuts = 0  # the depth cut-offs among them (results shaped by one depend on the level)
        self.plain_text = False  # schema_to_regex: no fragments, everything as regex text
        self.ignored: set[str] = set()
        self.relaxed: list[str] = []
        self.narrowed: set[str] = set()
        self._branches = 0
        self._over_origin: int | None = None  # instance level where the current over-approximation started
        if ws is None:
            self.open_obj, self.close_obj, self.open_arr, self.close_arr = r"\{", r"\}", r"\[", r"\]"
            self.comma, self.colon = ", ", ": "
        else:
            try:
                re.compile(ws)
            except re.error as e:
                raise GrammarError(f"invalid whitespace_pattern {ws!r}: {e}") from None
            w = f"(?:{ws})"
            self.open_obj, self.close_obj = r"\{" + w, w + r"\}"
            self.open_arr, self.close_arr = r"\[" + w, w + r"\]"
            self.comma, self.colon = w + "," + w, w + ":" + w

    # ---- bookkeeping -----------------------------------------------------------------------------------
    def ignore(self, keys) -> None:
        self.ignored.update(keys)

    def refuse(self, keyword: str, detail: str = "") -> None:
        """Strict: GrammarError naming the keyword. strict=False: warn, record, and let the caller drop it."""
        msg = f"unsupported JSON-schema keyword {keyword!r}" + (f": {detail}" if detail else "")
        if self.strict:
            raise GrammarError(msg + " (strict=False ignores it with a warning)")
        warnings.warn(msg + " (ignored: output may violate it)", stacklevel=3)
        self.relaxed.append(keyword)

    def enter(self, schema: dict, ctx: Ctx) -> Ctx:
        base = self.registry.base(schema, ctx.base)
        if base != ctx.base and base not in ctx.scope:
            return ctx._replace(base=base, scope=ctx.scope + (base,))
        return ctx._replace(base=base)

    def follow(self, schema: dict, key: str, ctx: Ctx) -> tuple[Any, Ctx]:
        """Target of $ref / $dynamicRef / $recursiveRef; (None, ctx) once the same target recurs too often."""
        if key == "$dynamicRef":
            target, base = self.registry.resolve_dynamic(schema[key], ctx.base, ctx.scope)
        elif key == "$recursiveRef":
            target, base = self.registry.resolve_recursive(schema[key], ctx.base, ctx.scope)
        else:
            target, base = self.registry.resolve(schema[key], ctx.base)
        ident = id(target)
        if ctx.refs.count(ident) >= self.max_rec:
            return None, ctx
        scope = ctx.scope if base in ctx.scope else ctx.scope + (base,)
        return target, ctx._replace(base=base, scope=scope, refs=ctx.refs + (ident,))

    @staticmethod
    def json_eq(a: Any, b: Any) -> bool:
        if isinstance(a, bool) or isinstance(b, bool):
            return type(a) is type(b) and a == b
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a == b
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(SchemaConverter.json_eq(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(SchemaConverter.json_eq(a[k], b[k]) for k in a)
        return type(a) is type(b) and a == b

    # ---- normal forms ----------------------------------------------------------------------------------
    def norm(self, subs: list[Sub]) -> Norm:
        n = Norm()
        for s in subs:  # several subschemas at one position: each one's unevaluated* would see only itself
            add_part(self, n, s.schema, s.ctx, len(subs) == 1)
        return n

    def extend(self, n: Norm, subs: list[Sub]) -> Norm:
        """A copy of `n` with more parts merged in."""
        m = replace(n, **{f.name: _copy(getattr(n, f.name)) for f in fields(Norm)})
        for s in subs:
            add_part(self, m, s.schema, s.ctx, False)
        return m

    def under(self, sub: Sub) -> str | None:
        if sub.schema is True:
            return self.any_value(sub.ctx.level)
        return self.under_subs([sub])

    def under_subs(self, subs: list[Sub]) -> str | None:
        """under() of the conjunction of `subs` at one position, cached per (subschemas, base URIs) (an instance
        valid here is valid wherever the same subschemas apply); a result that a depth or recursion cut-off
        shaped is cached per position as below."""
        key = ("under",) + tuple(sorted(set(map(self._ident, subs))))
        got = self.sub_cache.get(key)
        if got is not None:
            return got[1]
        # a result shaped by cut-offs depends on the position only through how often each $ref target was
        # followed on the way, and through its level when a depth cut-off shaped it: a recursive definition
        # reached along many paths is built once per such position, not once per path
        counts = tuple(tuple(sorted(Counter(s.ctx.refs).items())) for s in subs)
        got = self.sub_cache.get(key + counts)
        if got is None:
            got = self.sub_cache.get(key + counts + (subs[0].ctx.level,))
        if got is not None:
            self._cuts += 1  # whatever uses it is shaped too
            self._depth_cuts += got[2]
            return got[1]
        frame = self.frames.get(key)
        if frame is not None and not self.unrolling:  # recursion: call the outer position's module
            return self._recur(frame)
        cuts, depth_cuts = self._cuts, self._depth_cuts
        out = self.under_norm(self.norm(subs), subs[0].ctx) if self.unrolling else self._position(key, subs)
        deep = self._depth_cuts != depth_cuts
        where = key if self._cuts == cuts else key + counts + ((subs[0].ctx.level,) if deep else ())
        self.sub_cache[where] = ([s.schema for s in subs], out, deep)  # the schemas pin their ids
        return out

    def _position(self, key: tuple, subs: list[Sub]) -> str | None:
        """under() of one position; a recursion back into it calls its module (json/recursion.py), or is unrolled
        (`max_recursion_depth`) where that module cannot stand."""
        # $ref chains restart here: a recursion through this position calls it, so counting the references
        # followed on the way (the unrolling bound) only matters inside one position
        norm, first = self.norm([Sub(s.schema, s.ctx._replace(refs=())) for s in subs]), None
        while True:
            frame = self.frames[key] = recursion.Frame(len(self.frames), recursion.marks(self), norm, first)
            counters = (self._cuts, self._depth_cuts, set(self.narrowed))
            try:
                out = self.under_norm(norm, subs[0].ctx._replace(refs=()))
                if frame.pending is not None:
                    recursion.resolve(self, frame, key, out and automata.module(self, out, "a recursive subschema"))
                return out
            except recursion.Unresolved as e:
                if key not in e.keys or any(self.frames[k].order < frame.order for k in e.keys if k in self.frames):
                    raise  # an outer position owns it
                recursion.rollback(self, frame.marks)
                self._cuts, self._depth_cuts, self.narrowed = counters
                if not (e.first and first is None and e.keys == {key}):
                    break
                first = e.first  # once more, announcing the first bytes the position really has
            finally:
                if frame.pending is not None:
                    self.pending -= 1
                del self.frames[key]
        self.unrolling += 1  # this position and all below it as before: recursion unrolled by $ref counts
        try:
            return self.under_norm(self.norm(subs), subs[0].ctx)
        finally:
            self.unrolling -= 1

    def _recur(self, frame: "recursion.Frame") -> str:
        """The atom of the pending module standing for an outer position being built."""
        if frame.pending is None:
            frame.pending = recursion.pending_module(frame.first or recursion.first_bytes(self, frame.norm))
            frame.atom = automata.atom(self, frame.pending)
            self.pending += 1
        return frame.atom

    def _ident(self, sub: Sub) -> tuple:
        """(schema id, base, scope) of a subschema; a lone `$ref` is read as its target and equal subschemas share
        an id (the same language), so a definition reached through its many references is one position (and
        one recursion) to build."""
        schema, base, scope = sub.schema, sub.ctx.base, sub.ctx.scope
        for _ in range(8):
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)
                    and (ref_overrides_siblings(self.draft) or schema.keys() <= _LONE_REF)):
                break
            try:
                schema, base = self.registry.resolve(schema["$ref"], base)
            except GrammarError:
                return (id(sub.schema), sub.ctx.base, sub.ctx.scope)
            scope = scope if base in scope else scope + (base,)
        return (self._canon(schema), base, scope)

    def _canon(self, schema: Any) -> int:
        """One id for equal subschemas (the same text), so that copies of a definition are one position."""
        got = self._canon_ids.get(id(schema))
        if got is None:
            try:
                text = json.dumps(schema, sort_keys=True) if isinstance(schema, dict) else None
            except (TypeError, ValueError):
                text = None
            got = self._canon_ids[id(schema)] = id(self._canon_of.setdefault(text, schema)) if text else id(schema)
        return got

    # ---- under-approximation ---------------------------------------------------------------------------
    def under_norm(self, n: Norm, ctx: Ctx) -> str | None:
        """under() of a normal form at a new instance position (its own count of distributed branches)."""
        saved, self._branches = self._branches, 0
        try:
            return self._under_norm(n, ctx)
        finally:
            self._branches = saved

    def _under_norm(self, n: Norm, ctx: Ctx) -> str | None:
        if n.cut or ctx.level > self.max_level:
            self._cuts += 1
            self._depth_cuts += not n.cut
            return None
        if n.false:
            return None
        if n == Norm():
            return self.any_value(ctx.level)
        n = negation.rewrite_nots(self, n, ctx)
        if (n.apps or n.dep_required) and negation.hopeless(self, n):
            return None  # a contradiction already: no branch below can hold (the distribution tree is pruned)
        if n.dep_required:  # split on the key's presence, as dependentSchemas: no product with the object
            (name, deps), rest = n.dep_required[0], replace(n, dep_required=n.dep_required[1:])
            return self.distribute("dependentSchemas", (name, Sub({"required": list(deps)}, ctx)), rest, ctx)
        for i, (kind, payload) in enumerate(n.apps):
            if kind != "not":
                rest = replace(n, apps=n.apps[:i] + n.apps[i + 1:])
                return self.distribute(kind, payload, rest, ctx)
        out = self.typed_under(n, ctx)
        for kind, payload in n.apps:  # only `not` is left
            o = self.over(payload)
            out = out if automata.disjoint(self, out, o) else automata.combine(self, out, o, "diff", "not")
        return automata.compact(self, out, "a subschema")

    def distribute(self, kind: str, payload, rest: Norm, ctx: Ctx) -> str | None:
        """anyOf / oneOf / if / dependentSchemas: one alternative per branch, each merged with the rest."""
        self._branches += 1
        if self._branches > MAX_BRANCHES:
            raise GrammarError(f"json_schema combines too many {kind} branches (more than {MAX_BRANCHES})")
        if kind == "anyOf":
            return self.branches([self._under_norm(self.extend(rest, [b]), ctx) for b in payload], kind)
        if kind == "oneOf":
            # the keyword proofs see each branch with the rest of the position (a discriminator is often required
            # outside the oneOf): rest + b_i and rest + b_j disjoint means no instance here is valid under both
            outs, overs, heads = [], {}, [self.extend(rest, [b]) for b in payload]
            saved, self._dropped_branch = self._dropped_branch, False
            for i, b in enumerate(payload):
                m = heads[i]
                others = [j for j in range(len(payload)) if j != i and not self.exclusive(m, heads[j])]
                keyed = negation.negatable(self, m, payload, others) if not rest.uneval else {}
                for alts in keyed.values():  # the keywords give these branches' negations as a few choices
                    m = negation.with_negation(self, m, alts)
                mine = self._under_norm(m, ctx)
                for j, o in enumerate(payload):  # one difference per other branch: no union automaton
                    if mine is None or j not in others or j in keyed:
                        continue
                    if j not in overs:
                        overs[j] = self.over(o)
                    if not automata.disjoint(self, mine, overs[j]):
                        mine = self._exclusive_part(mine, overs[j], i)
                if mine is not None:
                    outs.append(mine)
            dropped, self._dropped_branch = self._dropped_branch, saved
            if not outs and dropped:
                raise too_large("every oneOf branch's exclusivity (branch minus the others)", self.max_states)
            return self.branches(outs, kind)
        if kind == "if":
            cond, then, els = payload
            yes = self._under_norm(self.extend(rest, [cond, then]), ctx)
            head = self.extend(rest, [els])
            neg = negation.choices(self, head, cond) if not rest.uneval else None
            if neg is not None:  # else-branch and the condition's negation from the keywords: no difference
                no = self._under_norm(negation.with_negation(self, head, neg), ctx)
            else:
                no, o = self._under_norm(self.extend(rest, [els]), ctx), self.over(cond)
                no = no if automata.disjoint(self, no, o) else automata.combine(self, no, o, "diff", "if/else")
            return self.branches([yes, no], kind)
        name, dep = payload  # dependentSchemas
        c = Ctx(ctx.base, ctx.scope, ctx.refs, ctx.level)
        present = self._under_norm(self.extend(rest, [dep, Sub({"required": [name]}, c)]), ctx)
        absent = self._under_norm(self.extend(rest, [Sub({"properties": {name: False}}, c)]), ctx)
        return self.branches([present, absent], "dependentSchemas")

    def branches(self, outs: list, kind: str) -> str | None:
        """The alternation of distributed branches. Two or more that embed modules become one module, built once
        and called wherever this position is used: alternatives that share a long prefix (objects of one shape
        differing in what they require) are otherwise stepped through side by side in every caller."""
        out = alt(outs)
        parts = {o for o in outs if o is not None}
        if self.plain_text or len(parts) < 2 or sum(map(_has_atom, parts)) < 2:
            return out
        return automata.compact(self, out, f"{kind} branches", 0)

    def _exclusive_part(self, mine: str, other: str, i: int) -> str | None:
        """oneOf branch i minus another branch's over-approximation; a difference too large to build drops the
        branch from what is generated (a sound subset, listed in narrowed)."""
        try:
            return automata.combine(self, mine, other, "diff", "oneOf")
        except GrammarError as e:
            if is_fatal(e) or not str(e).startswith("automaton too large"):
                raise
            self.narrowed.add(f"oneOf: a branch (#{i}) whose exclusivity automaton is too large is not generated")
            self._dropped_branch = True
            return None

    def exclusive(self, a: Norm, b: Norm) -> bool:
        """Proof from the keywords that no instance is valid under both (False = unknown): disjoint types or
        enums, objects where one requires a property the other forbids, or that both require with disjoint
        enums (a discriminator such as GeoJSON's `type`)."""
        ta, tb = self._value_types(a), self._value_types(b)
        common = ta & tb
        if not common:
            return True
        if a.enum is not None and b.enum is not None and self._enums_disjoint(a.enum, b.enum):
            return True
        if common != {"object"}:
            return False
        if any(self.forbids(b, k) for k in a.required) or any(self.forbids(a, k) for k in b.required):
            return True
        for name in a.required.keys() & b.required.keys():
            pa, pb = a.props.get(name), b.props.get(name)
            if pa and pb:
                ea, eb = self.norm(pa).enum, self.norm(pb).enum
                if ea is not None and eb is not None and self._enums_disjoint(ea, eb):
                    return True
        return False

    def forbids(self, n: Norm, name: str) -> bool:
        """No object valid under n has the property `name` (false schema, or additionalProperties false)."""
        if any(s.schema is False for s in n.props.get(name, ())):
            return True
        return any(addl is not None and addl.schema is False and name not in own
                   and not any(objects.key_matches(self, p, name) for p in pats) for own, pats, addl, _ in n.groups)

    def _value_types(self, n: Norm) -> set:
        types = set(TYPES) if n.types is None else set(n.types)
        if n.enum is not None:
            types = {t for t in types if any(is_json_type(v, t, self.draft) for v in n.enum)}
        if "integer" in types:
            types.add("number")  # 1.0 is an integer in drafts 6+, and every integer a number
        return types

    def _enums_disjoint(self, xs: list, ys: list) -> bool:
        return not any(self.json_eq(x, y) for x in xs for y in ys)

    def typed_under(self, n: Norm, ctx: Ctx) -> str | None:
        types = TYPES if n.types is None else [t for t in TYPES if t in n.types]
        if n.enum is not None:
            return self.enum_under(n, ctx, types)
        return self.typed_alt(n, ctx, types, "under")

    def typed_alt(self, n: Norm, ctx: Ctx, types, mode: str) -> str | None:
        """The alternation of `types`' value languages for n, each built in `mode` ("under" or "over")."""
        if "number" in types:
            types = [t for t in types if t != "integer"]  # the number language holds the integers
        return alt([VALUES[t](self, n, ctx, mode) for t in types])

    def over(self, sub: Sub) -> str | None:
        """A superset of the texts valid under `sub` (over.py)."""
        return over.over(self, sub)

    def over_norm(self, n: Norm, ctx: Ctx) -> str | None:
        return over.over_norm(self, n, ctx)

    def enum_under(self, n: Norm, ctx: Ctx, types) -> str | None:
        """The enum/const values that also satisfy the other keywords here (checked on their texts)."""
        rest = replace(n, enum=None, types=None)
        check = None
        if rest != Norm():
            r = self.under_norm(rest, ctx)
            if r is None:
                return None
            check = r
            matcher = Program(automata.module(self, r, "enum"))
        out = []
        for v in n.enum:
            if not any(is_json_type(v, t, self.draft) for t in types):
                continue
            text = self.const_text(v)
            if text is None:
                continue
            if check is not None:
                lits = _scalar_texts(v)
                if lits is not None:  # a scalar's texts are literals: keep those the automaton accepts
                    text = alt([re.escape(t) for t in lits if matcher.fullmatch(t.encode())])
                    if text is None:
                        continue
                elif automata.combine(self, text, check, "and", "enum") is None:
                    continue
            out.append(text)
        return alt(out)

    def const_text(self, v: Any) -> str | None:
        """Regex of the layout texts of one JSON value (None if it has no text we generate)."""
        if isinstance(v, dict):
            items = [re.escape(json.dumps(k, ensure_ascii=False)) + self.colon + self.const_text(x)
                     for k, x in v.items() if self.const_text(x) is not None]
            if len(items) < len(v):
                return None
            return self.open_obj + self.comma.join(items) + self.close_obj
        if isinstance(v, list):
            items = [self.const_text(x) for x in v]
            if any(x is None for x in items):
                return None
            return self.open_arr + self.comma.join(items) + self.close_arr
        if isinstance(v, float):
            return numbers.float_text(self, v)
        return re.escape(json.dumps(v, ensure_ascii=False))

    def any_value(self, level: int) -> str:
        """An unconstrained value ({} / true) starting at `level`: at most ANY_DEPTH more levels of nesting."""
        return self._any(min(ANY_DEPTH, max(0, self.max_level + ANY_DEPTH - level)), ANY_DEPTH)

    def free_value(self, level: int) -> str:
        """A member of a container the schema leaves open (no items / no additionalProperties schema)."""
        return self._any(min(ANY_DEPTH - 1, max(0, self.max_level + ANY_DEPTH - level)), ANY_DEPTH - 1)

    def _layout(self) -> tuple:
        return (self.open_obj, self.close_obj, self.open_arr, self.close_arr, self.comma, self.colon)

    def _any(self, depth: int, full: int) -> str:
        if depth < full:
            self._cuts += 1  # the depth limit shaped it
            self._depth_cuts += 1
        # numbers apart: the rest is prefix-free, so a large any-value is one called module, not a copy per use
        return f"(?:{automata.atom(self, any_module(self._layout(), depth))}|{ANY_NUMBER_RE})"

def _arrays(conv, n: Norm, ctx: Ctx, mode: str) -> str | None:
    return arrays.array_under(conv, n, ctx) if mode == "under" else arrays.array_over(conv, n, ctx)


def _objects(conv, n: Norm, ctx: Ctx, mode: str) -> str | None:
    return objects.object_under(conv, n, ctx) if mode == "under" else objects.object_over(conv, n, ctx)


VALUES = {  # JSON type -> its value language (conv, normal form, context, "under" | "over")
    "null": lambda conv, n, ctx, mode: F.NULL,
    "boolean": lambda conv, n, ctx, mode: F.BOOLEAN,
    "string": lambda conv, n, ctx, mode: strings.string_re(conv, n, mode),
    "integer": lambda conv, n, ctx, mode: numbers.number_re(conv, n, True, mode),
    "number": lambda conv, n, ctx, mode: numbers.number_re(conv, n, False, mode),
    "array": _arrays,
    "object": _objects,
}


def _scalar_texts(v: Any) -> list[str] | None:
    """The texts const_text's regex matches for a scalar value (None for arrays and objects)."""
    if isinstance(v, (dict, list)):
        return None
    if isinstance(v, float):
        if v.is_integer():
            i = str(int(v))
            return [i, i + ".0"] if len(i) < MAX_DIGITS else [i]
        from .numbers import _plain_decimal

        t = _plain_decimal(v)
        return [] if t is None else [t]
    return [json.dumps(v, ensure_ascii=False)]


def _copy(v):
    if isinstance(v, dict):
        return {k: list(x) if isinstance(x, list) else x for k, x in v.items()}
    if isinstance(v, list):
        return [list(x) if isinstance(x, list) else x for x in v]
    if isinstance(v, set):
        return set(v)
    return v


def _has_atom(regex: str) -> bool:
    return any(ord(c) >= ATOM_BASE for c in regex)


def _has_marker(schema: Any) -> bool:
    try:
        text = json.dumps(schema, ensure_ascii=False) if not isinstance(schema, bool) else ""
    except (RecursionError, ValueError):
        raise GrammarError("json_schema is nested too deeply to compile") from None
    return any(ATOM_BASE <= ord(c) <= ATOM_END for c in text if ord(c) >= ATOM_BASE)
