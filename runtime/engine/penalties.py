"""Repetition / frequency / presence penalties, logit bias and min_new_tokens masking on the whole batch at once.

Per row, in this order (SGLang's rules; the numbers are those of applying them one request at a time):
- repetition_penalty r != 1: every distinct token of the prompt and the output: x / r if x > 0 else x * r;
- frequency f / presence p: every distinct output token seen c times: x - (f * c + p);
- logit_bias: x + bias for each listed id in the vocabulary;
- below min_new_tokens (and without a grammar, which wins): EOS (unless ignore_eos) and the stop token ids
  are masked to -inf.
Each rule is one gather and one scatter over flat (row, token) index lists for the whole batch: no
per-request tensor op, no vocabulary-sized op. A request's output ids are kept in host arrays (RowState) that
grow by the tokens appended since the last step, with its distinct output ids and their counts, so frequency and
presence touch each (row, token) once with a count known on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..core import Req


@dataclass
class RowState:
    """One request's sampler state across steps (Req.sampler_state)."""

    prompt: np.ndarray | None = None  # distinct prompt ids (repetition penalty)
    bias_ids: np.ndarray | None = None  # logit_bias ids inside the vocabulary, and their biases (float32)
    bias_vals: np.ndarray | None = None
    out: np.ndarray = field(default_factory=lambda: np.empty(16, dtype=np.int64))  # output ids (capacity grows)
    n: int = 0  # valid entries of out
    jumped: int = 0  # the request's num_jumped_tokens when out was synced (a jump may rewrite outputs)
    # the distinct output ids in first-seen order and how often each was output (capacity grows): the penalties
    # touch each (row, token) once, with its count known on the host
    tokens: np.ndarray = field(default_factory=lambda: np.empty(16, dtype=np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.empty(16, dtype=np.float32))
    where: dict = field(default_factory=dict)  # output id -> its index in tokens
    nd: int = 0  # valid entries of tokens / counts

    def sync(self, req: Req) -> int:
        """Bring the arrays up to date with req.output_ids (incrementally); the number of distinct output ids."""
        ids, n = req.output_ids, self.n
        if (len(ids) < n or req.num_jumped_tokens != self.jumped
                or (n and ids[n - 1] != self.out[n - 1])):  # rewritten (jump-forward rollback): start again
            n = self.n = self.nd = 0
            self.where.clear()
            self.jumped = req.num_jumped_tokens
        new = len(ids) - n
        if new:
            if len(ids) > len(self.out):
                grown = np.empty(max(2 * len(self.out), len(ids)), dtype=np.int64)
                grown[:n] = self.out[:n]
                self.out = grown
            if new == 1:
                self.out[n] = ids[-1]
            else:
                self.out[n:len(ids)] = ids[n:]
            self.n = len(ids)
            self._count(ids[n:])
        return self.nd

    def _count(self, new: list[int]) -> None:
        where = self.where
        for t in new:
            j = where.get(t)
            if j is not None:
                self.counts[j] += 1.0
                continue
            j = where[t] = self.nd
            if j == len(self.tokens):
                self.tokens = np.concatenate([self.tokens, np.empty(j, dtype=np.int64)])
                self.counts = np.concatenate([self.counts, np.empty(j, dtype=np.float32)])
            self.tokens[j] = t
            self.counts[j] = 1.0
            self.nd = j + 1


def row_state(req: Req, vocab: int) -> RowState:
    """The request's RowState, built on its first sample."""
    st = req.sampler_state
    if st is None:
        s = req.sampling
        st = req.sampler_state = RowState()
        if s.repetition_penalty != 1.0:
            st.prompt = np.unique(np.asarray(req.input_ids, dtype=np.int64))
        if s.logit_bias:
            items = [(t, b) for t, b in s.logit_bias.items() if 0 <= t < vocab]
            st.bias_ids = np.asarray([t for t, _ in items], dtype=np.int64)
            st.bias_vals = np.asarray([b for _, b in items], dtype=np.float32)
    return st


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
        freq_rows, freq_parts, freq_counts, freq_f, freq_p = [], [], [], [], []
        bias_rows, bias_ids, bias_vals = [], [], []
        mask_rows, mask_ids = [], []
        for i, r in enumerate(reqs):
            s = r.sampling
            rep, freq = s.repetition_penalty != 1.0, bool(s.frequency_penalty or s.presence_penalty)
            if rep or freq or s.logit_bias:
                st = row_state(r, vocab)
                nd = st.sync(r) if rep or freq else 0
                if rep:
                    rep_rows.append(i)
                    rep_parts.append(np.concatenate([st.prompt, st.tokens[:nd]]) if nd else st.prompt)
                    rep_vals.append(s.repetition_penalty)
                if freq and nd:
                    freq_rows.append(i)
                    freq_parts.append(st.tokens[:nd])
                    freq_counts.append(st.counts[:nd])
                    freq_f.append(s.frequency_penalty)
                    freq_p.append(s.presence_penalty)
                if st.bias_ids is not None and len(st.bias_ids):
                    bias_rows.append(i)
                    bias_ids.append(st.bias_ids)
                    bias_vals.append(st.bias_vals)
            if len(r.output_ids) < s.min_new_tokens and r.grammar is None:  # the constraint wins
                ids = [t for t in (eos_ids | set(s.stop_token_ids)) if 0 <= t < vocab] if not s.ignore_eos else []
                ids = ids or [t for t in s.stop_token_ids if 0 <= t < vocab]
                if ids:
                    mask_rows.append(i)
                    mask_ids.append(np.asarray(ids, dtype=np.int64))
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
            rows, toks = _flat(freq_rows, freq_parts)
            lens = [len(p) for p in freq_parts]
            f = _to(np.repeat(np.asarray(freq_f, dtype=np.float32), lens), dev)
            p = _to(np.repeat(np.asarray(freq_p, dtype=np.float32), lens), dev)
            flat, rows, toks = _to(rows * vocab + toks, dev), _to(rows, dev), _to(toks, dev)
            counts = _to(np.concatenate(freq_counts), dev).to(logits.dtype)  # each (row, token) once
            v = _gather(logits, flat, rows, toks)
            if undo is not None:
                undo.append((rows, toks, v))
            _put(logits, flat, rows, toks, v - (f * counts + p * (counts > 0).to(logits.dtype)))
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
