"""Request traces on the server: the bounded ring of `--enable-trace`, and one trace record per generation.

A traced generation carries the engine's meta_info["trace"] (runtime/engine/request_trace.py) on every
output; `Tracing.generate` strips it from what API routes see and, at the end, turns the last one into a
record: per-token origins (prompt: cached / prefilled, output: sampled / jump_forward), logprobs where the
request asked for them, grammar time, and a timeline (compile wait, queued, prefill chunks, decode steps,
finish). With tracing off and no caller asking, `generate` is the engine client's own generator: nothing is
recorded and nothing is added per chunk. Records hold user text; the ring keeps the newest `capacity` ones,
each capped at MAX_TOKENS prompt and output tokens (docs/console.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from typing import AsyncIterator

from ..messages import EngineError, GenerateReqInput

MAX_TOKENS = 4096  # per list (prompt, output) and for the decode steps of one record
PROMPT_ORIGINS = ("cached", "prefilled")
OUTPUT_ORIGINS = {"s": "sampled", "j": "jump_forward"}
UNTRACED_ROUTES = frozenset({"/console/api/compile"})  # the console's zero-token compile checks


class TraceRing:
    """The newest `capacity` trace records by request id (oldest dropped first)."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"trace capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._records: collections.OrderedDict[str, dict] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: dict) -> None:
        """Keep `record` (a newer one with the same rid replaces it); drop the oldest past capacity."""
        self._records.pop(record["rid"], None)
        self._records[record["rid"]] = record
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    def get(self, rid: str) -> dict | None:
        """The record of `rid`, or None when it was never traced or has left the ring."""
        return self._records.get(rid)

    def recent(self, limit: int) -> list[dict]:
        """Summaries of the newest `limit` records, newest first."""
        return [summary(r) for r in list(reversed(self._records.values()))[:limit]]


def summary(record: dict) -> dict:
    """The list view of a record: ids, counts, outcome, latency, and the first characters of the prompt."""
    keys = ("rid", "route", "received", "outcome", "finish_reason", "prompt_tokens", "completion_tokens",
            "cached_tokens", "jump_forward_tokens", "e2e_s", "constraint")
    out = {k: record.get(k) for k in keys}
    out["prompt_preview"] = "".join(t["text"] for t in record["prompt"][:40])[:120]
    return out


def _phase(name: str, start: float, end: float, **detail) -> dict:
    return {"phase": name, "start": round(start, 6), "end": round(max(end, start), 6), **detail}


def timeline(received: float, finished: float, trace: dict, prompt_tokens: int, constrained: bool,
             reason) -> list[dict]:
    """Phases in seconds from `received`: compile wait (or tokenize), queued, prefill chunks, decode steps, finish."""
    rel = lambda t: t - received  # noqa: E731
    sub = trace.get("submitted", received)
    phases = [_phase("compile wait" if constrained else "tokenize", 0.0, rel(sub))]
    chunks, steps = trace.get("chunks", []), trace.get("steps", [])
    first = chunks[0][0] if chunks else (steps[0][0] if steps else finished)
    phases.append(_phase("queued", rel(sub), rel(first)))
    times = sorted([c[0] for c in chunks] + [s[0] for s in steps])
    first_step = steps[0][0] if steps else finished
    for t, prefix, n in chunks:
        end = next((x for x in times if x > t), finished)
        # before the first token: the prompt's prefill (its last chunk may start past the prompt: a forced opening
        # is prefilled with it); after it: the KV of tokens a jump-forward appended
        kind = "prefill" if t < first_step or prefix < prompt_tokens else "jump-forward extend"
        phases.append(_phase(kind, rel(t), rel(end), prefix=prefix, tokens=n))
    prev_t, prev_n = None, 0
    for t, n in steps[:MAX_TOKENS]:
        if prev_t is not None and n != prev_n:
            phases.append(_phase("decode", rel(prev_t), rel(t), tokens=n - prev_n))
        elif prev_t is None:
            phases.append(_phase("first token", rel(t), rel(t), tokens=n))
        prev_t, prev_n = t, n
    phases.append(_phase("finish", rel(finished), rel(finished), reason=reason))
    return sorted(phases, key=lambda p: p["start"])  # stable: a step's extend follows its token


def build_record(inp: GenerateReqInput, route: str, received: float, final: dict | None, trace: dict | None,
                 outcome: str, finished: float | None = None) -> dict:
    """One trace record (GET /trace/{rid}) from the request, its last output and that output's engine trace."""
    finished = time.time() if finished is None else finished
    final = final or {}
    meta = final.get("meta_info") or {}
    trace = trace or {}
    prompt_pieces = trace.get("prompt_pieces") or []
    n_prompt = int(meta.get("prompt_tokens") or len(prompt_pieces))
    cached = min(int(meta.get("cached_tokens") or 0), n_prompt)
    prompt_ids = trace.get("prompt_ids") or inp.input_ids or []
    prompt = [{"text": p, "origin": PROMPT_ORIGINS[0] if i < cached else PROMPT_ORIGINS[1],
               "id": prompt_ids[i] if i < len(prompt_ids) else None}
              for i, p in enumerate(prompt_pieces[:MAX_TOKENS])]
    ids = final.get("output_ids") or []
    origins = trace.get("output_origins") or ""
    pieces = trace.get("output_pieces") or []
    logprobs = meta.get("output_token_logprobs")
    output = []
    for i, tok in enumerate(ids[:MAX_TOKENS]):
        entry = {"id": tok, "text": pieces[i] if i < len(pieces) else "",
                 "origin": OUTPUT_ORIGINS.get(origins[i] if i < len(origins) else "s", "sampled")}
        if logprobs is not None and i < len(logprobs):
            entry["logprob"] = logprobs[i][0]
        output.append(entry)
    reason = meta.get("finish_reason")
    constraint = inp.sampling.constraint
    return {
        "rid": inp.rid, "route": route, "received": received, "finished": finished, "outcome": outcome,
        "finish_reason": reason, "prompt_tokens": n_prompt, "completion_tokens": len(ids),
        "cached_tokens": cached,  # prompt tokens from the cache (meta_info's count may include a cached forced opening)
        "jump_forward_tokens": int(meta.get("jump_forward_tokens") or 0),
        "e2e_s": round(finished - received, 6), "constraint": constraint[0] if constraint else None,
        "grammar_s": round(float(trace.get("grammar_s") or 0.0), 6), "text": final.get("text", ""),
        "prompt": prompt, "output": output,
        "truncated": n_prompt > MAX_TOKENS or len(ids) > MAX_TOKENS,
        "timeline": timeline(received, finished, trace, n_prompt, constraint is not None, reason),
    }


class Tracing:
    """Which generations are traced (all with --enable-trace, or those a caller asks for) and the ring."""

    def __init__(self, enabled: bool, capacity: int):
        self.ring = TraceRing(capacity) if enabled else None

    @property
    def enabled(self) -> bool:
        """Whether every generation is recorded (--enable-trace)."""
        return self.ring is not None

    def generate(self, engine, inp: GenerateReqInput, route: str) -> AsyncIterator[dict]:
        """The engine's output stream of `inp`; traced when the ring is on or `inp.trace` asks (then outputs keep
        meta_info["trace"]: every output with "live", the final one with "final")."""
        if not inp.trace and (self.ring is None or route in UNTRACED_ROUTES):
            return engine.generate(inp)  # tracing off: the engine client's own stream, untouched
        return self._traced(engine, inp, route)

    async def _traced(self, engine, inp: GenerateReqInput, route: str) -> AsyncIterator[dict]:
        keep = inp.trace is not None
        received = time.time()
        final = trace = None
        outcome = "ok"
        try:
            async with contextlib.aclosing(engine.generate(dataclasses.replace(inp, trace=inp.trace or "final"))) \
                    as gen:
                async for chunk in gen:
                    meta = chunk.get("meta_info") or {}
                    trace = meta.get("trace") or trace
                    if not keep and "trace" in meta:
                        chunk = {**chunk, "meta_info": {k: v for k, v in meta.items() if k != "trace"}}
                    final = chunk
                    yield chunk
        except EngineError as e:
            outcome = f"error {e.status}: {e.message}"
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "client disconnected (aborted)"
            raise
        finally:
            if self.ring is not None:
                self.ring.add(build_record(inp, route, received, final, trace, outcome))
