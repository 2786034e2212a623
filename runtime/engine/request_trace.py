"""A request's trace (engine side): prefill chunks, emitted steps, jump-forward spans, grammar time, token texts.

Kept only for requests that asked for one (GenerateReqInput.trace; `sglpy serve --enable-trace` or the web
console); `Req.trace` is None otherwise and nothing is recorded. Delivered as meta_info["trace"]
(`to_json`), which the server strips from API responses and keeps in its trace ring (runtime/server/trace.py):
complete with every output when `live` (the console's stream), else complete with the final output only (the
outputs before it carry an empty dict), so a long traced request costs O(1) per step, not O(tokens).
Times are wall-clock seconds (time.time()) so the server process can line them up with its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..images import text_ids

SAMPLED, JUMPED = "s", "j"  # output-token origins; prompt tokens are cached ("c") or prefilled ("p")
MAX_PIECES = 4096  # token texts decoded per list (the server's records keep as many: runtime/server/trace.py)


def decode_each(tokenizer, ids: list[int]) -> list[str]:
    """The text of each token alone (one batch call into a fast tokenizer: ~4 us a token instead of ~5.5)."""
    if not ids:
        return []
    batch = getattr(tokenizer, "batch_decode", None)
    if batch is not None:
        return list(batch([[t] for t in ids]))
    return [tokenizer.decode([t]) for t in ids]


@dataclass
class RequestTrace:
    """What the engine records for one traced request."""

    submitted: float = field(default_factory=time.time)  # the request entered the engine (its compile done)
    chunks: list = field(default_factory=list)  # [wall, prefix_len, extend_len] per scheduled prefill chunk
    steps: list = field(default_factory=list)  # [wall, completion_tokens] per step that emitted an output
    jumps: list = field(default_factory=list)  # [output position, tokens] per jump-forward (rollbacks included)
    grammar_s: float = 0.0  # mask, advance and jump-forward time spent on this request
    live: bool = False  # the whole trace with every output (else with the final one only)
    _ids: list = field(default_factory=list)  # the output ids `_pieces` were decoded from
    _pieces: list = field(default_factory=list)

    def jumped(self, position: int, n: int) -> None:
        """Jump-forward wrote n tokens at output `position` (replacing everything from there on)."""
        self.jumps.append([position, n])

    def origins(self, n_out: int) -> str:
        """One origin letter per output token: 'j' jump-forward, 's' sampled."""
        marks = bytearray(SAMPLED.encode() * n_out)
        for pos, n in self.jumps:
            # a jump replaced everything from `pos`: earlier marks past it belong to rolled-back tokens
            marks[pos:] = SAMPLED.encode() * max(n_out - pos, 0)
            marks[pos:pos + n] = JUMPED.encode() * max(min(n, n_out - pos), 0)
        return marks[:n_out].decode()

    def pieces(self, ids: list[int], tokenizer) -> list[str]:
        """The text of each output token, decoded once (from the first changed id after a rollback)."""
        keep = 0
        limit = min(len(ids), len(self._ids))
        while keep < limit and ids[keep] == self._ids[keep]:
            keep += 1
        del self._pieces[keep:]
        self._pieces.extend(decode_each(tokenizer, ids[keep:MAX_PIECES]))
        self._ids = list(ids)
        return list(self._pieces)

    def to_json(self, req, tokenizer, final: bool) -> dict:
        """meta_info["trace"] after a step: cumulative (the newest output alone is complete), or {} before the final
        output of a trace that is not live."""
        n_out = len(req.output_ids)
        self.steps.append([time.time(), n_out])
        if not (self.live or final):
            return {}
        out = {"submitted": self.submitted, "chunks": [list(c) for c in self.chunks],
               "steps": [list(s) for s in self.steps], "jumps": [list(j) for j in self.jumps],
               "grammar_s": self.grammar_s, "output_origins": self.origins(n_out),
               "output_pieces": self.pieces(req.output_ids, tokenizer)}
        if final:  # prompt token texts once, with the final output
            out["prompt_pieces"] = decode_each(tokenizer, text_ids(req.input_ids[:MAX_PIECES]))
            out["prompt_ids"] = list(req.input_ids)
        return out
