"""GrammarCompiler: constraint -> Guide, with a thread-safe LRU cache keyed by (kind, constraint, options)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np

from .budget import COMPILE_CLOCK, COMPILE_TIME_S, CompileBudget
from .regex import ByteDFA, regex_to_dfa
from .errors import GrammarError
from .guide import Guide, RegexGuide, SchemaInfo
from .rtn.module import Module
from .rtn.guide import StackGuide
from .tokens.vocab import TokenizerInfo

# SGLang's dtype constraints (gen(..., dtype=int/float/bool/str)); the one definition (sglpy/ir.py uses it).
DTYPE_REGEX = {
    "int": r"[-+]?[0-9]+[ \n]*",
    "float": r"[-+]?[0-9]*\.?[0-9]+[ \n]*",
    "bool": r"(True|False)",
    "str": r"\"[\w\d\s]*\"",
}


def choices_regex(choices: list[str]) -> str:
    """Regex matching exactly one of the strings."""
    if not isinstance(choices, (list, tuple)) or not choices:
        raise GrammarError("choices must be a non-empty list of strings")
    for c in choices:
        if not isinstance(c, str):
            raise GrammarError(f"choices must be strings, got {type(c).__name__}")
    return "(?:" + "|".join(re.escape(c) for c in choices) + ")"


class GrammarCompiler:
    """Compiles constraints for one tokenizer; results are cached (LRU) and safe to share across threads."""

    KINDS = ("regex", "json_schema", "ebnf", "choices", "dtype", "structural_tag")

    def __init__(
        self,
        tokenizer_info: TokenizerInfo,
        max_states: int = 20_000,
        cache_size: int = 128,
        whitespace_pattern: str | None = None,
        max_recursion_depth: int = 3,
        cache_dir: str | None = None,
        unicode_classes: bool = False,
        compile_timeout_s: float | None = COMPILE_TIME_S,
        budget_clock: str = COMPILE_CLOCK,
        schema_documents: Mapping[str, Any] | None = None,
        native_automata: Any = None,
    ):
        """cache_dir: optional folder for compiled regex/JSON guides keyed by constraint + tokenizer hash.

        unicode_classes: \\d \\w \\s in regexes are ASCII unless this is True (then Python's Unicode classes).
        compile_timeout_s: budget of one compile, token index included (default: the engine's, see budget.py);
        None = unlimited.
        budget_clock: "cpu" (the compiling thread's CPU time, the default on every path) or "wall".
        schema_documents: schemas that JSON schemas' remote `$ref`s may point into, URI -> schema (pre-loaded
        here: nothing is ever fetched; a `$ref` to any other URI is refused by name).
        native_automata: a native kernel for subset construction, trimming and minimisation
        (sglpy.kernels.automata.native_automata(); the same automata, built faster), or None: Python.
        """
        if not isinstance(tokenizer_info, TokenizerInfo):
            raise ValueError("GrammarCompiler needs a TokenizerInfo (use TokenizerInfo.from_hf(tokenizer))")
        if max_states < 2:
            raise ValueError(f"max_states must be >= 2, got {max_states}")
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        if compile_timeout_s is not None and not compile_timeout_s > 0:
            raise ValueError(f"compile_timeout_s must be > 0 or None, got {compile_timeout_s}")
        if budget_clock not in ("wall", "cpu"):
            raise ValueError(f"budget_clock must be 'wall' or 'cpu', got {budget_clock!r}")
        self.compile_timeout_s = compile_timeout_s
        try:  # a private copy (later changes to the caller's mapping change nothing) and its digest for cache keys
            docs_text = json.dumps(dict(schema_documents or {}), sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            raise ValueError("schema_documents must map URI strings to JSON schemas") from None
        self.schema_documents = json.loads(docs_text)
        self._documents_key = hashlib.sha256(docs_text.encode()).hexdigest()[:16] if schema_documents else ""
        self._documents_tag = [self._documents_key] if schema_documents else []  # in disk-cache keys
        self.budget_clock = budget_clock
        self.info = tokenizer_info
        self.max_states = max_states
        self.cache_size = cache_size
        self.whitespace_pattern = whitespace_pattern
        self.max_recursion_depth = max_recursion_depth
        self.cache_dir = cache_dir
        self.unicode_classes = bool(unicode_classes)
        self.native_automata = native_automata
        self._cache: OrderedDict[tuple, Guide] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[tuple, threading.Event] = {}

    def warmup(self) -> None:
        """Build the per-tokenizer tables now (token tries, sorted tokens: ~1-2 s at 49k) instead of on first use:
        those of EBNF terminal indexes and jump-forward, and those of the mask walk this TokenizerInfo runs."""
        info = self.info
        _ = info.trie, info.first_byte_masks, info.sorted_tokens, info.longest_token, info.string_tokens
        if self.native_automata is not None:
            self.native_automata.ready()  # loads (or builds, once per machine) the native library
        if info.walker is not None and info.walker.ready():
            _ = info.flat_trie, info.string_rest, info.packed_bytes
        else:
            _ = info.string_rest_levels

    def budget(self, cancel: Any = None, timeout_s: Any = ...) -> CompileBudget:
        """A fresh budget with this compiler's limits (timeout_s overrides compile_timeout_s)."""
        t = self.compile_timeout_s if timeout_s is ... else timeout_s
        return CompileBudget(time_s=t, max_states=self.max_states, cancel=cancel, clock=self.budget_clock,
                             native=self.native_automata)

    def _cached(self, key: tuple, build: Callable[[], Guide]) -> Guide:
        while True:
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return hit
                waiting = self._inflight.get(key)
                if waiting is None:
                    done = self._inflight[key] = threading.Event()
                    break
            waiting.wait()  # another thread compiles the same constraint: reuse its result
        try:
            try:
                guide = build()
            except RecursionError:
                raise GrammarError(f"{key[0]} constraint is nested too deeply to compile") from None
            with self._lock:
                if self.cache_size:
                    self._cache[key] = guide
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
            return guide
        finally:
            with self._lock:
                del self._inflight[key]
            done.set()

    def compile(self, kind: str, value: Any, cancel: Any = None, timeout_s: Any = ...) -> Guide:
        """Dispatch on kind: regex | json_schema | ebnf | choices | dtype | structural_tag. The one entry point for the runtime.

        Raises GrammarError (a ValueError) naming the problem; BudgetExceeded (a GrammarError) past the time
        budget; CompileCancelled (a GrammarError) once `cancel.is_set()` (any object with is_set()).
        """
        kw = {"cancel": cancel, "timeout_s": timeout_s}
        if kind in ("json", "json_schema"):
            return self.compile_json_schema(value, **kw)
        if kind == "regex":
            return self.compile_regex(value, **kw)
        if kind == "ebnf":
            return self.compile_ebnf(value, **kw)
        if kind == "choices":
            return self.compile_choices(value, **kw)
        if kind == "dtype":
            return self.compile_dtype(value, **kw)
        if kind == "structural_tag":
            return self.compile_structural_tag(value, **kw)
        raise GrammarError(f"unknown constraint kind {kind!r} (expected one of {', '.join(self.KINDS)})")

    def compile_regex(self, pattern: str, cancel: Any = None, timeout_s: Any = ...) -> Guide:
        """Guide for strings that `re.fullmatch(pattern, s)` accepts."""
        if not isinstance(pattern, str):
            raise GrammarError(f"regex must be a str, got {type(pattern).__name__}")
        return self._cached(("regex", pattern, self.max_states, self.unicode_classes),
                            lambda: self._regex_guide(pattern, self.budget(cancel, timeout_s)))

    def _regex_guide(self, pattern: str, budget: CompileBudget | None = None, make=None) -> RegexGuide:
        """Guide for `pattern` (or for the (dfa, schema_info) that `make()` returns), via the disk cache."""
        path = None
        if self.cache_dir:
            key = hashlib.sha256(f"{self.info.key}|{self.max_states}|u{int(self.unicode_classes)}|{pattern}".encode()).hexdigest()[:40]
            path = os.path.join(self.cache_dir, f"regex-{key}.npz")
            if os.path.exists(path):
                try:
                    with np.load(path) as z:
                        stack = "kind" in z.files and str(z["kind"]) == "stack"
                    return (StackGuide if stack else RegexGuide).load(path, self.info)
                except (OSError, ValueError, KeyError):
                    pass  # unreadable or stale entry: rebuild and overwrite
        if make is None:
            dfa, schema_info = regex_to_dfa(pattern, self.max_states, self.unicode_classes, budget=budget), None
        else:
            dfa, schema_info = make()
        if isinstance(dfa, Module):  # a module network: calls between modules, stack states
            guide = StackGuide(dfa, self.info, pattern, budget=budget, schema_info=schema_info)
        else:
            guide = RegexGuide(dfa, self.info, pattern, budget=budget, schema_info=schema_info)
        if path:
            os.makedirs(self.cache_dir, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp.npz"
            guide.save(tmp)
            os.replace(tmp, path)  # atomic: readers never see a half-written file
        return guide

    def compile_choices(self, choices: list[str], **kw) -> Guide:
        """Guide for exactly one of the strings."""
        return self.compile_regex(choices_regex(choices), **kw)

    def compile_dtype(self, dtype: Any, **kw) -> Guide:
        """Guide for an int / float / bool / str literal (type objects or their names)."""
        name = dtype.__name__ if isinstance(dtype, type) else dtype
        if name not in DTYPE_REGEX:
            raise GrammarError(f"unsupported dtype {dtype!r} (expected int, float, bool or str)")
        return self.compile_regex(DTYPE_REGEX[name], **kw)

    def compile_json_schema(self, schema: Any, strict: bool = True, whitespace_pattern: Any = ...,
                            cancel: Any = None, timeout_s: Any = ...) -> Guide:
        """Guide for JSON documents valid under `schema` (see docs/grammar.md for what is enforced).

        whitespace_pattern overrides the compiler's default for this schema (None = compact layout).
        `guide.schema_info` tells the draft used and the keywords ignored (annotations, unknown keywords).
        """
        from .json.schema import compile_schema, normalize_schema

        norm = normalize_schema(schema)
        ws = self.whitespace_pattern if whitespace_pattern is ... else whitespace_pattern
        try:
            text = json.dumps(norm, sort_keys=False)
        except (RecursionError, ValueError):
            raise GrammarError("json_schema is nested too deeply to compile") from None
        key = ("json_schema", text, strict, ws, self.max_recursion_depth, self.max_states, self._documents_key)

        def build() -> Guide:
            budget = self.budget(cancel, timeout_s)

            def make():
                res = compile_schema(norm, whitespace_pattern=ws, strict=strict,
                                     max_recursion_depth=self.max_recursion_depth, budget=budget,
                                     documents=self.schema_documents)
                mod = res.module
                auto = mod if mod.entries else ByteDFA(mod.trans, mod.accepting, mod.initial)
                return auto, SchemaInfo(res.draft, res.ignored, res.relaxed, res.narrowed)

            source = f"json_schema:{json.dumps([strict, ws, self.max_recursion_depth] + self._documents_tag)}:{text}"
            return self._regex_guide(source, budget, make=make)

        return self._cached(key, build)

    def compile_structural_tag(self, spec: Any, cancel: Any = None, timeout_s: Any = ...) -> Guide:
        """Guide for a structural tag (SGLang's shape; grammar/structural_tag.py): free text, triggered JSON regions."""
        from .json.schema import compile_schema
        from .structural_tag import StructuralTag, structural_tag_dfa

        tag = StructuralTag.parse(spec)
        text = tag.to_json()
        ws = self.whitespace_pattern

        def build() -> Guide:
            budget = self.budget(cancel, timeout_s)

            def schema_dfa(schema, b):
                return compile_schema(schema, whitespace_pattern=ws, strict=True, budget=b,
                                      max_recursion_depth=self.max_recursion_depth,
                                      documents=self.schema_documents).module

            def make():
                return structural_tag_dfa(tag, schema_dfa, self.max_states, budget), None

            source = f"structural_tag:{json.dumps([ws, self.max_recursion_depth] + self._documents_tag)}:{text}"
            return self._regex_guide(source, budget, make=make)

        return self._cached(("structural_tag", text, ws, self.max_recursion_depth, self.max_states, self._documents_key),
                            build)

    def compile_ebnf(self, grammar: str, start: str = "start", cancel: Any = None, timeout_s: Any = ...) -> Guide:
        """Guide for a context-free grammar in lark EBNF syntax."""
        from .ebnf.guide import EBNFGuide

        if not isinstance(grammar, str):
            raise GrammarError(f"EBNF grammar must be a str, got {type(grammar).__name__}")
        return self._cached(("ebnf", grammar, start, self.max_states),
                            lambda: EBNFGuide(grammar, self.info, start=start, max_states=self.max_states,
                                              budget=self.budget(cancel, timeout_s)))
