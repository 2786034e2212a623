"""Structural tags: free text until a trigger, then `begin` + schema-valid JSON + `end` (SGLang's shape) -> one byte DFA.

Spec (a JSON object, SGLang's `structural_tag`): `{"type": "structural_tag", "structures": [{"begin": str,
"schema": JSON schema, "end": str}, ...], "triggers": [str, ...]}`, plus three sglpy extensions used by tool
calling: `free_text` (default true), `max_tags` (default null = unbounded) and `separator` (default "\\n").

Language, with F = byte strings that contain no trigger and T = one of the structures (begin . JSON . end):
- free_text true, max_tags null: F (T F)*   (a trigger always opens a structure; text resumes after `end`)
- free_text true, max_tags k:    F (T F){0,k-1} T?   (after the k-th structure the output is complete)
- free_text false:               T (separator T){0,k-1}   (constrained from the first byte; k = inf if null)
Every begin must start with a trigger (in free-text mode) and no trigger may contain another one, so the
first trigger occurrence in the free text decides where a structure starts. F is an Aho-Corasick byte
automaton; F and each schema automaton are embedded as regex "atoms" and the subset construction makes the
whole thing one minimal byte DFA, so tokens that straddle a trigger are handled by the ordinary token index.
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from .budget import CompileBudget
from .regex.dfa import DEAD, ByteDFA
from .errors import GrammarError
from .regex.nfa import ATOM_BASE
from .rtn.build import regex_to_module

MAX_STRUCTURES = 128
MAX_TRIGGER_BYTES = 256
MAX_TAGS = 64  # a bounded count multiplies states: beyond this, use null (unbounded)


@dataclass(frozen=True)
class Structure:
    """One tagged region: the literal `begin`, a JSON document valid under `schema`, the literal `end`."""

    begin: str
    schema: Any
    end: str


@dataclass(frozen=True)
class StructuralTag:
    """A parsed, validated structural-tag spec (see the module docstring for the language)."""

    structures: tuple[Structure, ...]
    triggers: tuple[str, ...]
    free_text: bool = True
    max_tags: int | None = None
    separator: str = "\n"

    def __post_init__(self):
        if not self.structures:
            raise GrammarError("structural_tag.structures must be a non-empty list")
        if len(self.structures) > MAX_STRUCTURES:
            raise GrammarError(f"structural_tag has {len(self.structures)} structures (at most {MAX_STRUCTURES})")
        if self.max_tags is not None and (not isinstance(self.max_tags, int) or isinstance(self.max_tags, bool)
                                          or not 1 <= self.max_tags <= MAX_TAGS):
            raise GrammarError(f"structural_tag.max_tags must be an int in [1, {MAX_TAGS}] or null, "
                               f"got {self.max_tags!r}")
        for i, s in enumerate(self.structures):
            for name in ("begin", "end"):
                v = getattr(s, name)
                if not isinstance(v, str):
                    raise GrammarError(f"structural_tag.structures[{i}].{name} must be a string")
                if any(ord(c) >= ATOM_BASE for c in v):
                    raise GrammarError(f"structural_tag.structures[{i}].{name} uses reserved code points (plane 15/16)")
            if not isinstance(s.schema, (dict, bool)):
                raise GrammarError(f"structural_tag.structures[{i}].schema must be a JSON schema object")
        if not isinstance(self.separator, str) or any(ord(c) >= ATOM_BASE for c in self.separator):
            raise GrammarError("structural_tag.separator must be a string")
        if not self.free_text:
            return
        if not self.triggers:
            raise GrammarError("structural_tag.triggers must be a non-empty list of strings")
        for t in self.triggers:
            if not isinstance(t, str) or not t:
                raise GrammarError("structural_tag.triggers must be non-empty strings")
            if len(t.encode()) > MAX_TRIGGER_BYTES:
                raise GrammarError(f"structural_tag trigger {t[:40]!r} is over {MAX_TRIGGER_BYTES} bytes")
        for a in self.triggers:
            for b in self.triggers:
                if a != b and a in b:
                    raise GrammarError(f"structural_tag trigger {a!r} is part of trigger {b!r} (ambiguous)")
        for i, s in enumerate(self.structures):
            if not any(s.begin.startswith(t) for t in self.triggers):
                raise GrammarError(f"structural_tag.structures[{i}].begin {s.begin!r} does not start with a trigger")

    @classmethod
    def parse(cls, spec: Any) -> "StructuralTag":
        """From the JSON text or object; GrammarError names the bad field."""
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError as e:
                raise GrammarError(f"structural_tag is not valid JSON: {e}") from None
        if not isinstance(spec, dict):
            raise GrammarError("structural_tag must be a JSON object")
        known = {"type", "structures", "triggers", "free_text", "max_tags", "separator"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise GrammarError(f"unknown structural_tag field(s) {unknown} (expected structures, triggers)")
        if spec.get("type", "structural_tag") != "structural_tag":
            raise GrammarError(f"structural_tag.type must be \"structural_tag\", got {spec.get('type')!r}")
        raw = spec.get("structures")
        if not isinstance(raw, list):
            raise GrammarError("structural_tag.structures must be a list of {begin, schema, end}")
        structures = []
        for i, s in enumerate(raw):
            if not isinstance(s, dict) or set(s) - {"begin", "schema", "end"} or "begin" not in s or "end" not in s:
                raise GrammarError(f"structural_tag.structures[{i}] must be an object {{begin, schema, end}}")
            structures.append(Structure(s["begin"], s.get("schema", True), s["end"]))
        triggers = spec.get("triggers") or []
        if not isinstance(triggers, list):
            raise GrammarError("structural_tag.triggers must be a list of strings")
        free = spec.get("free_text", True)
        if not isinstance(free, bool):
            raise GrammarError("structural_tag.free_text must be a bool")
        return cls(tuple(structures), tuple(triggers), free, spec.get("max_tags"), spec.get("separator", "\n"))

    def to_json(self) -> str:
        """Canonical JSON text (the compile cache key and the wire form)."""
        return json.dumps({"type": "structural_tag",
                           "structures": [{"begin": s.begin, "schema": s.schema, "end": s.end} for s in self.structures],
                           "triggers": list(self.triggers), "free_text": self.free_text, "max_tags": self.max_tags,
                           "separator": self.separator}, sort_keys=True)


def no_trigger_dfa(triggers: tuple[str, ...]) -> ByteDFA:
    """Aho-Corasick automaton of the byte strings that contain none of `triggers` (every live state accepts)."""
    pats = [t.encode() for t in triggers]
    goto: list[dict[int, int]] = [{}]
    terminal = [False]
    for p in pats:
        node = 0
        for b in p:
            nxt = goto[node].get(b)
            if nxt is None:
                nxt = goto[node][b] = len(goto)
                goto.append({})
                terminal.append(False)
            node = nxt
        terminal[node] = True
    n = len(goto)
    fail = [0] * n
    trans = np.zeros((n, 256), np.int64)
    order = deque()
    for b in range(256):  # root: missing bytes stay at the root
        trans[0, b] = goto[0].get(b, 0)
    for b, child in goto[0].items():
        order.append(child)
    while order:  # breadth first: a node's failure target is complete before the node
        node = order.popleft()
        terminal[node] = terminal[node] or terminal[fail[node]]
        trans[node] = trans[fail[node]]
        for b, child in goto[node].items():
            trans[node, b] = child
            fail[child] = int(trans[fail[node], b]) if node else 0
            order.append(child)
    # renumber: DEAD = 0, live nodes from 1; terminal nodes (a trigger just completed) are dead
    live = [i for i in range(n) if not terminal[i]]
    new_id = np.zeros(n, np.int64)
    new_id[live] = np.arange(1, len(live) + 1)
    out = np.zeros((len(live) + 1, 256), np.int32)
    out[1:] = new_id[trans[live]]
    accepting = np.ones(len(live) + 1, bool)
    accepting[DEAD] = False
    return ByteDFA(out, accepting, int(new_id[0]))


def structural_tag_dfa(tag: StructuralTag, compile_schema, max_states: int = 20_000,
                       budget: CompileBudget | None = None):
    """Minimal automaton of the tag's language: a ByteDFA, or a Module when a schema's module calls others;
    compile_schema(schema, budget) -> that schema's JSON automaton (ByteDFA or Module)."""
    atoms: dict[int, Any] = {}
    by_schema: dict[str, str] = {}

    def atom(dfa) -> str:
        code = ATOM_BASE + len(atoms)
        atoms[code] = dfa
        return chr(code)

    alts = []
    for i, s in enumerate(tag.structures):
        key = json.dumps(s.schema, sort_keys=True)
        if key not in by_schema:
            try:
                by_schema[key] = atom(compile_schema(s.schema, budget))
            except GrammarError as e:
                raise GrammarError(f"structural_tag.structures[{i}].schema: {e}") from None
        alts.append(re.escape(s.begin) + by_schema[key] + re.escape(s.end))
    one = "(?:" + "|".join(dict.fromkeys(alts)) + ")"
    k = tag.max_tags
    if tag.free_text:
        free = atom(no_trigger_dfa(tag.triggers))
        if k is None:
            pattern = f"{free}(?:{one}{free})*"
        else:
            pattern = f"{free}(?:{one}{free}){{0,{k - 1}}}(?:{one})?"
    else:
        sep = re.escape(tag.separator)
        pattern = one + (f"(?:{sep}{one})*" if k is None else f"(?:{sep}{one}){{0,{k - 1}}}")
    # schema automata may be modules (definitions shared by reference): the tag is then a module too
    mod = regex_to_module(pattern, max_states, budget=budget, atoms=atoms, what="the structural tag")
    return mod if mod.entries else ByteDFA(mod.trans, mod.accepting, mod.initial)
