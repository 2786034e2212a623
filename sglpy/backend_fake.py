"""A scripted, model-free backend for unit tests: one fake token per character, constraints honoured."""

from __future__ import annotations

import collections
import json
import re
import threading
import time
import uuid
from typing import Callable, Iterator, Optional

from .backend_base import BaseBackend, ChoiceScore, GenResult, StreamChunk
from .chat_template import CHATML, ChatTemplate
from .nodes import GenParams


def complete_regex(regex: str, hint: str = "") -> str:
    """A string fully matching `regex`: follow `hint` while the regex allows, then the shortest completion."""
    import interegular

    fsm = interegular.parse_pattern(regex).to_fsm()
    alphabet = fsm.alphabet
    reps: dict[int, str] = {}
    for ch, idx in alphabet.items():
        # Deterministic representative per symbol class: alphanumerics first, then the smallest character.
        if isinstance(ch, str) and (idx not in reps or (not ch.isalnum(), ch) < (not reps[idx].isalnum(), reps[idx])):
            reps[idx] = ch
    other = alphabet[interegular.fsm.anything_else] if interegular.fsm.anything_else in alphabet else None
    if other is not None and other not in reps:
        reps[other] = next(c for c in "xyzXYZ_~" if c not in alphabet)

    state, out = fsm.initial, []
    for ch in hint:
        idx = alphabet[ch] if ch in alphabet else other
        nxt = fsm.map.get(state, {}).get(idx)
        if nxt is None:
            break
        # Only follow the hint while a final state stays reachable.
        if _shortest(fsm, nxt, reps) is None:
            break
        state = nxt
        out.append(ch)
    tail = _shortest(fsm, state, reps)
    if tail is None:
        raise ValueError(f"regex {regex!r} matches no string")
    return "".join(out) + tail


def _shortest(fsm, start, reps) -> Optional[str]:
    if start in fsm.finals:
        return ""
    seen, queue = {start}, collections.deque([(start, "")])
    while queue:
        state, path = queue.popleft()
        for idx, nxt in sorted(fsm.map.get(state, {}).items(), key=lambda kv: str(kv[0])):
            if nxt in seen or idx not in reps:
                continue
            if nxt in fsm.finals:
                return path + reps[idx]
            seen.add(nxt)
            queue.append((nxt, path + reps[idx]))
    return None


def minimal_instance(schema: dict):
    """A small JSON value satisfying the common JSON-schema keywords (type, properties, enum, items)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return minimal_instance(schema[key][0])
    t = schema.get("type", "object")
    if isinstance(t, list):
        t = t[0]
    if t == "object":
        props = schema.get("properties", {})
        return {k: minimal_instance(v) for k, v in props.items()}
    if t == "array":
        n = schema.get("minItems", 1)
        return [minimal_instance(schema.get("items", {"type": "string"})) for _ in range(n)]
    if t == "integer":
        return int(schema.get("minimum", 1))
    if t == "number":
        return float(schema.get("minimum", 1.5))
    if t == "boolean":
        return True
    if t == "null":
        return None
    return "a" * max(1, schema.get("minLength", 1))


class FakeBackend(BaseBackend):
    """Scripted answers for unit tests; records every call in `calls`.

    Answers come from `responder(text, params)` if given, else the `responses` queue, else
    `default_response`. Tokens are characters: max/min tokens count characters. Stop strings and
    stop_regex cut the answer like the runtime does (matched = the string or the pattern).
    """

    def __init__(self, responses: Optional[list] = None, responder: Optional[Callable] = None,
                 default_response: str = "fake answer", choice_picker: Optional[Callable] = None,
                 chat_template: ChatTemplate = CHATML, stream_chunk_chars: int = 3, delay: float = 0.0,
                 fail_with: Optional[Exception] = None):
        self.responses = collections.deque(responses or [])
        self.responder = responder
        self.default_response = default_response
        self.choice_picker = choice_picker or (lambda prefix, choices: 0)
        self.chat_template = chat_template
        self.stream_chunk_chars = stream_chunk_chars
        self.delay = delay
        self.fail_with = fail_with
        self.calls: list[tuple[str, object]] = []
        self.cache: set[str] = set()
        self._lock = threading.Lock()

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def _record(self, kind: str, payload) -> None:
        with self._lock:
            self.calls.append((kind, payload))
        if self.fail_with is not None:
            raise self.fail_with
        if self.delay:
            time.sleep(self.delay)

    def _answer(self, text: str, params: GenParams) -> str:
        if self.responder is not None:
            return self.responder(text, params)
        with self._lock:
            if self.responses:
                return self.responses.popleft()
        return self.default_response

    def _produce(self, text: str, params: GenParams) -> GenResult:
        params = params.lowered()
        p = params.sampling
        raw = self._answer(text, params)
        if p.json_schema is not None:
            schema = json.loads(p.json_schema) if isinstance(p.json_schema, str) else p.json_schema
            try:
                json.loads(raw)
                out = raw
            except ValueError:
                out = json.dumps(minimal_instance(schema))
        elif p.regex is not None:
            out = complete_regex(p.regex, raw)
        else:
            out = raw
        mnt = p.max_new_tokens if p.max_new_tokens is not None else max(len(out), p.min_new_tokens)  # None: no cap
        finish = {"type": "length", "length": mnt}
        cut = [(out.find(s), out.find(s) + len(s), s) for s in p.stop if s in out]
        cut += [(m.start(), m.end(), pattern) for pattern in p.stop_regex if (m := re.search(pattern, out))]
        if cut:
            pos, end, matched = min(cut, key=lambda c: c[0])
            out, finish = out[: end if p.no_stop_trim else pos], {"type": "stop", "matched": matched}
        elif p.regex is None and p.json_schema is None:
            finish = {"type": "stop", "matched": "<eos>"}
        if len(out) > mnt:
            out, finish = out[:mnt], {"type": "length", "length": mnt}
        while len(out) < p.min_new_tokens:
            out += (raw or "x")[: p.min_new_tokens - len(out)]
        meta = {"id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(text),
                "completion_tokens": len(out), "cached_tokens": self._cached(text), "e2e_latency": 0.0}
        with self._lock:
            self.cache.add(text)
        return GenResult(out, meta)

    def _cached(self, text: str) -> int:
        with self._lock:
            return max((len(c) for c in self.cache if text.startswith(c)), default=0)

    def generate(self, text: str, params: GenParams) -> GenResult:
        self._record("generate", {"text": text, "params": params})
        results = [self._produce(text, params) for _ in range(params.sampling.n)]
        return GenResult(results[0].text, results[0].meta_info, tuple(r.text for r in results))

    def generate_stream(self, text: str, params: GenParams) -> Iterator[StreamChunk]:
        self._record("generate_stream", {"text": text, "params": params})
        res = self._produce(text, params)
        step = max(1, self.stream_chunk_chars)
        for i in range(0, max(len(res.text), 1), step):
            if self.delay:
                time.sleep(self.delay)
            yield StreamChunk(res.text[i: i + step], res.meta_info)

    def score_choices(self, prefix: str, choices: list[str], need_unconditional: bool) -> list[ChoiceScore]:
        self._record("select", {"prefix": prefix, "choices": list(choices)})
        picked = self.choice_picker(prefix, list(choices))
        if not 0 <= picked < len(choices):
            raise ValueError(f"choice_picker returned {picked} for {len(choices)} choices")
        out = []
        for i, c in enumerate(choices):
            lp = -0.1 if i == picked else -1.0
            window = [[lp, ord(ch), ch] for ch in c]
            uncond = [[None if j == 0 else -0.5, ord(ch), ch] for j, ch in enumerate(c)] if need_unconditional else None
            out.append(ChoiceScore(window, lp, uncond))
        return out

    def cache_prefix(self, text: str) -> None:
        self._record("cache_prefix", text)
        with self._lock:
            self.cache.add(text)

    def flush_cache(self) -> bool:
        with self._lock:
            self.cache.clear()
        return True

    def get_server_info(self) -> dict:
        return {"backend": "fake", "version": "0"}
