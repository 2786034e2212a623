"""Repetition / frequency / presence penalties, logit bias and min_new_tokens masking on the whole batch at once.

Per row, in this order (SGLang's rules; the numbers are those of applying them one request at a time):
- repetition_penalty r != 1: every distinct token of the prompt and the output: x / r if x > 0 else x * r;
- frequency f / presence p: every distinct output token seen c times: x - (f * c + p);
- logit_bias: x + bias for each listed id in the vocabulary;
- below min_new_tokens (and without a grammar, which wins): EOS (unless ignore_eos) and the stop token ids
  are masked to -inf.
Each rule is one gather and one scatter over flat (row, token) index lists for the whole batch: no
per-request tensor op, no vocabulary-sized op. A request's rules are read from its parameters once, and its
distinct output ids, their counts and (frequency/presence) the amount each one's logit loses are kept on the host
(RowState), updated by the tokens appended since the last step: frequency and presence touch each (row, token)
once, with a value computed on the host as torch computes it in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core import Req
from ..images import text_ids


@dataclass(slots=True)  # no __dict__: fewer cache lines per request on the hot path
class RowState:
    """One request's sampler state across steps (Req.sampler_state): its rules, read once from its parameters, and
    its distinct output ids with their counts."""

    rep: float = 1.0  # repetition_penalty
    freq: bool = False  # a frequency or presence penalty
    f: float = 0.0  # frequency_penalty as float32 (a float holding a float32 value)
    p: np.float32 = np.float32(0.0)  # presence_penalty
    prompt: np.ndarray | None = None  # distinct prompt ids (repetition penalty)
    bias_ids: np.ndarray | None = None  # logit_bias ids inside the vocabulary, and their biases (float32)
    bias_vals: np.ndarray | None = None
    min_new: int = 0  # min_new_tokens
    mask: np.ndarray | None = None  # the ids masked below min_new_tokens (None: none)
    mask_eos: Any = None  # the eos_ids set `mask` was built from
    n: int = 0  # output ids counted
    last: int = -1  # the last of them (a rewrite that keeps the length shows there)
    jumped: int = 0  # the request's num_jumped_tokens when counted (a jump may rewrite outputs)
    # the distinct output ids in first-seen order, how often each was output, and (frequency/presence) the amount
    # subtracted from its logit, f * count + p in float32 (capacity grows): each (row, token) is touched once
    tokens: np.ndarray = field(default_factory=lambda: np.empty(16, dtype=np.int64))
    delta: np.ndarray = field(default_factory=lambda: np.empty(16, dtype=np.float32))
    counts: list = field(default_factory=list)
    where: dict = field(default_factory=dict)  # output id -> its index in tokens
    nd: int = 0  # valid entries of tokens / delta / counts

    @property
    def counted(self) -> bool:
        """Whether a rule reads the output ids (repetition, frequency or presence)."""
        return self.rep != 1.0 or self.freq

    def sync(self, req: Req) -> int:
        """Bring the counts up to date with req.output_ids (incrementally); the number of distinct output ids."""
        ids, n = req.output_ids, self.n
        if len(ids) == n + 1 and req.num_jumped_tokens == self.jumped and (not n or ids[n - 1] == self.last):
            self.last = t = ids[n]  # the steady state: one token more
            self.n = n + 1
            self._add(t)
            return self.nd
        if len(ids) < n or req.num_jumped_tokens != self.jumped or (n and ids[n - 1] != self.last):
            n = self.n = self.nd = 0  # rewritten (jump-forward rollback): start again
            self.where.clear()
            self.counts.clear()
            self.jumped = req.num_jumped_tokens
        for t in ids[n:]:
            self._add(t)
        self.n = len(ids)
        if ids:
            self.last = ids[-1]
        return self.nd

    def _add(self, t: int) -> None:
        j = self.where.get(t)
        if j is None:
            j = self.where[t] = self.nd
            if j == len(self.tokens):
                self.tokens = np.concatenate([self.tokens, np.empty(j, dtype=np.int64)])
                self.delta = np.concatenate([self.delta, np.empty(j, dtype=np.float32)])
            self.tokens[j] = t
            self.counts.append(1)
            self.nd = j + 1
            c = 1
        else:
            c = self.counts[j] = self.counts[j] + 1
        if self.freq:  # float32 f * c (exact in a double, rounded once), then + p in float32: torch's float32 ops
            self.delta[j] = np.float32(self.f * c) + self.p


_NO_RULES = RowState()  # shared by every request without a rule (read only: sync and the mask cache never run on it)


def row_state(req: Req, vocab: int) -> RowState:
    """The request's RowState, built on its first sample."""
    st = req.sampler_state
    if st is None:
        s = req.sampling
        if (s.repetition_penalty == 1.0 and not s.frequency_penalty and not s.presence_penalty and not s.logit_bias
                and not s.min_new_tokens):
            st = req.sampler_state = _NO_RULES
            return st
        st = req.sampler_state = RowState(rep=s.repetition_penalty, min_new=s.min_new_tokens)
        if s.frequency_penalty or s.presence_penalty:
            st.freq = True
            st.f, st.p = float(np.float32(s.frequency_penalty)), np.float32(s.presence_penalty)
        if s.repetition_penalty != 1.0:
            st.prompt = np.unique(np.asarray(text_ids(req.input_ids), dtype=np.int64))  # image tokens: no id
        if s.logit_bias:
            items = [(t, b) for t, b in s.logit_bias.items() if 0 <= t < vocab]
            if items:
                st.bias_ids = np.asarray([t for t, _ in items], dtype=np.int64)
                st.bias_vals = np.asarray([b for _, b in items], dtype=np.float32)
    return st


def _mask_ids(st: RowState, req: Req, eos_ids: set[int], vocab: int) -> np.ndarray | None:
    """The ids masked while the request is below min_new_tokens (EOS unless ignore_eos, and its stop token ids)."""
    if st.mask_eos is not eos_ids:
        s = req.sampling
        ids = [t for t in (eos_ids | set(s.stop_token_ids)) if 0 <= t < vocab] if not s.ignore_eos else []
        ids = ids or [t for t in s.stop_token_ids if 0 <= t < vocab]
        st.mask = np.asarray(ids, dtype=np.int64) if ids else None
        st.mask_eos = eos_ids
    return st.mask


def _flat(rows: list[int], parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(row index, value) arrays for parts[j] belonging to rows[j]."""
    lens = [len(p) for p in parts]
    return np.repeat(np.asarray(rows, dtype=np.int64), lens), np.concatenate(parts) if parts else np.empty(0, np.int64)


class Penalties:
    """Applies the rules above to a batch of logits (the per-request state lives in each request's RowState)."""

    def apply(self, logits: torch.Tensor, reqs: list[Req], eos_ids: set[int], undo: list | None = None) -> None:
        """Apply every row's penalties, logit bias and min_new_tokens mask to logits [b, vocab] in place.

        undo, when given, receives (rows, tokens, old values) before each write (see `restore`)."""
        vocab = logits.shape[1]
        rep_rows, rep_parts, rep_vals = [], [], []
        freq_rows, freq_states = [], []
        bias_rows, bias_ids, bias_vals = [], [], []
        mask_rows, mask_ids = [], []
        for i, r in enumerate(reqs):
            st = r.sampler_state
            if st is None:
                st = row_state(r, vocab)
            if st.min_new and len(r.output_ids) < st.min_new and r.grammar is None:  # the constraint wins
                ids = _mask_ids(st, r, eos_ids, vocab)
                if ids is not None:
                    mask_rows.append(i)
                    mask_ids.append(ids)
            if st.rep != 1.0 or st.freq:
                nd = st.sync(r)
                if st.rep != 1.0:
                    rep_rows.append(i)
                    rep_parts.append(np.concatenate([st.prompt, st.tokens[:nd]]) if nd else st.prompt)
                    rep_vals.append(st.rep)
                if st.freq and nd:
                    freq_rows.append(i)
                    freq_states.append(st)
            if st.bias_ids is not None:
                bias_rows.append(i)
                bias_ids.append(st.bias_ids)
                bias_vals.append(st.bias_vals)
        dev = logits.device
        if rep_rows:
            rows, toks = _flat(rep_rows, rep_parts)
            factor = np.repeat(np.asarray(rep_vals, dtype=np.float32), [len(p) for p in rep_parts])
            flat, rows, toks, factor = _to(rows * vocab + toks, dev), _to(rows, dev), _to(toks, dev), _to(factor, dev)
            v = _gather(logits, flat, rows, toks)
            if undo is not None:
                undo.append((rows, toks, v))
            _put(logits, flat, rows, toks, torch.where(v > 0, v / factor, v * factor))  # repeats: equal values
        if freq_rows:
            lens = [st.nd for st in freq_states]
            rows = np.repeat(np.asarray(freq_rows, dtype=np.int64), lens)
            toks = np.concatenate([st.tokens[:st.nd] for st in freq_states])
            delta = _to(np.concatenate([st.delta[:st.nd] for st in freq_states]), dev)  # each (row, token) once
            flat, rows, toks = _to(rows * vocab + toks, dev), _to(rows, dev), _to(toks, dev)
            v = _gather(logits, flat, rows, toks)
            if undo is not None:
                undo.append((rows, toks, v))
            _put(logits, flat, rows, toks, v - delta)
        if bias_rows:
            rows, ids = _flat(bias_rows, bias_ids)
            flat, rows, ids = _to(rows * vocab + ids, dev), _to(rows, dev), _to(ids, dev)
            vals = _to(np.concatenate(bias_vals), dev)
            v = _gather(logits, flat, rows, ids)
            if undo is not None:
                undo.append((rows, ids, v))
            _put(logits, flat, rows, ids, v + vals.to(logits.dtype))
        if mask_rows:
            rows, ids = _flat(mask_rows, mask_ids)
            flat, rows, ids = _to(rows * vocab + ids, dev), _to(rows, dev), _to(ids, dev)
            if undo is not None:
                undo.append((rows, ids, _gather(logits, flat, rows, ids)))
            logits[rows, ids] = float("-inf")


@torch.inference_mode()
def restore(logits: torch.Tensor, undo: list) -> None:
    """Undo in-place changes recorded by Penalties.apply (and whole rows: (rows, None, their old values))."""
    for rows, cols, old in reversed(undo):
        if cols is None:
            logits[rows] = old
        else:
            logits[rows, cols] = old  # a repeated position holds the same old value in every record


def _gather(logits: torch.Tensor, flat: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """logits[rows, cols] ([m]); flat = rows * vocab + cols. On the flat view when logits is contiguous: an
    index_select, where two-tensor advanced indexing costs ~40x more on CPU (~200 us for 4k entries)."""
    if logits.is_contiguous():
        return logits.view(-1).index_select(0, flat)
    return logits[rows, cols]


def _put(logits: torch.Tensor, flat: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor) -> None:
    """logits[rows, cols] = vals; an index_copy_ on the flat view when logits is contiguous (two-tensor advanced
    indexing costs several times more on CPU). A repeated position gets the same value from every entry."""
    if logits.is_contiguous():
        logits.view(-1).index_copy_(0, flat, vals)
    else:
        logits[rows, cols] = vals


def _to(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device` (pinned, non-blocking on CUDA)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)
