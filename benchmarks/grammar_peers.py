"""JSON-schema engines side by side (sglpy, llguidance, xgrammar) for benchmarks/json_schema_coverage.py --bench.

Each engine answers the same three questions on one tokenizer: compile a schema until its first token mask is
ready (or refuse it, with the reason), compute the mask of the current state into a packed int32 bitmask, and
consume a token. The peers are optional (`pip install -e '.[grammar-peers]'`) and never imported by sglpy.
Every engine generates in the same layout: `", "` between items, `": "` after keys, no other whitespace.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable


def load_bench(folder: str, per_split: int) -> list[tuple[str, str, Any]]:
    """(split, file, schema) for the first `per_split` files (sorted) of every split folder of a JSONSchemaBench sample."""
    out = []
    for split in sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))):
        for path in sorted(glob.glob(os.path.join(folder, split, "*.json")))[:per_split]:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            schema = doc["json_schema"] if isinstance(doc, dict) and "json_schema" in doc else doc
            out.append((split, os.path.basename(path), json.loads(schema) if isinstance(schema, str) else schema))
    return out


@dataclass
class Compiled:
    """One engine's answer for one schema: a matcher factory, or the refusal's text; seconds to the first mask."""

    seconds: float
    new: Callable[[], Any] | None = None  # a fresh matcher at the start of the document
    error: str | None = None
    warnings: list = field(default_factory=list)


class SglpyEngine:
    name = "sglpy"
    native = True  # automata built by the native kernel, as the engine builds them

    def __init__(self, tok, info):
        from sglpy.grammar import GrammarCompiler, GrammarError
        from sglpy.kernels.automata import native_automata

        self.info, self._error = info, GrammarError
        self.compiler = GrammarCompiler(info, cache_size=0,
                                        native_automata=native_automata() if self.native else None)
        self.compiler.warmup()

    def compile(self, schema) -> Compiled:
        t0 = time.perf_counter()
        try:
            guide = self.compiler.compile_json_schema(schema)
            guide.allowed(guide.initial_state)
        except (self._error, RecursionError) as e:
            return Compiled(time.perf_counter() - t0, error=str(e) or type(e).__name__)
        return Compiled(time.perf_counter() - t0, new=lambda: [guide, guide.initial_state])

    def mask(self, m):
        return m[0].allowed(m[1])

    def advance(self, m, token: int) -> bool:
        m[1] = m[0].advance(m[1], token)
        return True


class LlguidanceEngine:
    name = "llguidance"

    def __init__(self, tok, info):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.llg, self.fill = llguidance, llguidance.numpy.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=info.vocab_size)
        self.buf = llguidance.numpy.allocate_token_bitmask(1, info.vocab_size)
        self.options = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}

    def compile(self, schema) -> Compiled:
        t0 = time.perf_counter()
        try:
            grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=self.options)
            m = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        except (ValueError, TypeError) as e:
            return Compiled(time.perf_counter() - t0, error=str(e))
        if not m.is_error():
            self.fill(m, self.buf)
        dt = time.perf_counter() - t0
        if m.is_error():
            return Compiled(dt, error=m.get_error())
        return Compiled(dt, new=lambda: self.llg.LLMatcher(self.tokenizer, grammar, log_level=0),
                        warnings=m.get_grammar_warnings())

    def mask(self, m):
        self.fill(m, self.buf)
        return self.buf[0]

    def advance(self, m, token: int) -> bool:
        return m.consume_token(token) and not m.is_error()


class XgrammarEngine:
    name = "xgrammar"

    def __init__(self, tok, info):
        import xgrammar

        self.xgr = xgrammar
        self.tinfo = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=info.vocab_size)
        self.buf = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema) -> Compiled:
        t0 = time.perf_counter()
        try:
            comp = self.xgr.GrammarCompiler(self.tinfo, max_threads=1, cache_enabled=False)
            compiled = comp.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "),
                                                strict_mode=True)
            self.xgr.GrammarMatcher(compiled).fill_next_token_bitmask(self.buf)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError / its own types
            text = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e)).strip()  # drop the C++ log prefix
            return Compiled(time.perf_counter() - t0, error=text or type(e).__name__)
        return Compiled(time.perf_counter() - t0, new=lambda: self.xgr.GrammarMatcher(compiled))

    def mask(self, m):
        m.fill_next_token_bitmask(self.buf)
        return self.buf[0].numpy()

    def advance(self, m, token: int) -> bool:
        return m.accept_token(token)


class SglpyPythonEngine(SglpyEngine):
    """sglpy with its Python automaton constructions (the reference the native kernel is tested against)."""

    name = "sglpy-python"
    native = False


ENGINES = {"sglpy": SglpyEngine, "sglpy-python": SglpyPythonEngine, "llguidance": LlguidanceEngine, "xgrammar": XgrammarEngine}


def walk(engine, compiled: Compiled, info, rng: random.Random, max_steps: int, eos_bias: float = 0.8):
    """A random document from the engine's own masks: (bytes or None if unfinished, [mask seconds],
    [advance seconds]). EOS is taken with eos_bias when allowed, else a uniform allowed token; tokens without
    bytes other than EOS (special tokens, which a peer may read as their literal text) are never picked."""
    import numpy as np

    from sglpy.grammar.testing import mask_to_ids

    eos = set(info.eos_token_ids)
    special = np.array(sorted(t for t, b in enumerate(info.token_bytes) if b is None and t not in eos), dtype=np.int64)
    m, data, masks, advances = compiled.new(), bytearray(), [], []
    for _ in range(max_steps):
        t0 = time.perf_counter()
        bits = engine.mask(m)
        masks.append(time.perf_counter() - t0)
        ids = np.setdiff1d(mask_to_ids(bits, info.vocab_size), special, assume_unique=True)
        if not len(ids):
            return None, masks, advances
        finals = [t for t in eos if t < info.vocab_size and (int(bits[t >> 5]) >> (t & 31)) & 1]
        tok = finals[0] if finals and rng.random() < eos_bias else int(ids[rng.randrange(len(ids))])
        if tok in eos:
            return bytes(data), masks, advances
        t0 = time.perf_counter()
        ok = engine.advance(m, tok)
        advances.append(time.perf_counter() - t0)
        if not ok:
            return None, masks, advances
        data += info.token_bytes[tok]
    return None, masks, advances
