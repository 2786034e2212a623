"""Token index: for every DFA state, the packed bitmask of tokens whose bytes keep the DFA alive."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dfa import DEAD, ByteDFA
from .errors import GrammarError
from .vocab import TokenizerInfo

# Bound on simultaneously alive (state, trie node) pairs and on the bool scratch matrix (memory, not speed).
_MAX_PAIRS = 3_000_000
_MAX_SCRATCH = 16_000_000


@dataclass(frozen=True)
class TokenIndex:
    """Per-state allowed-token masks (deduplicated rows) plus the token-reachable states."""

    masks: np.ndarray  # [unique_masks, words] int32, read-only
    mask_of: np.ndarray  # [states + 1] int64: row of `masks` for each DFA state; the extra last state = terminated
    has_token: np.ndarray  # [states + 1] bool: some non-EOS token allowed
    reachable: np.ndarray  # [states + 1] bool: reachable from the initial state at token boundaries

    @property
    def terminated(self) -> int:
        """Pseudo-state entered after EOS: only EOS allowed, final."""
        return len(self.mask_of) - 1


def _csr_expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR counts, the owner index and the offset inside the owner's run, per expanded element."""
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(int(counts.sum())) - starts[owner]


def build_index(dfa: ByteDFA, info: TokenizerInfo, with_eos: bool = True) -> TokenIndex:
    """Walk the token trie through every DFA state at once (numpy over (state, node) pairs per depth).

    with_eos=False: masks without EOS bits and no vocabulary check (used for EBNF terminals).
    """
    trie = info.trie
    n_states = dfa.num_states
    full = dfa.trans
    vocab, words = info.vocab_size, info.mask_words
    widest = max((len(b) for b in trie.byte[1:]), default=1)
    chunk = max(1, min(n_states, _MAX_PAIRS // max(widest, 1), _MAX_SCRATCH // max(vocab, 1)))
    masks = np.zeros((n_states + 1, words), dtype=np.uint32)
    edges: list[np.ndarray] = []
    live_states = np.arange(1, n_states, dtype=np.int64)
    for c0 in range(0, len(live_states), chunk):
        st = live_states[c0 : c0 + chunk]
        allowed = np.zeros((len(st), words * 32), dtype=bool)
        nxt = full[st][:, trie.byte[1]]  # [chunk, level-1 nodes]
        k_idx, node = np.nonzero(nxt != DEAD)
        cur = nxt[k_idx, node]
        d = 1
        while len(k_idx):
            tc = trie.tok_count[d][node]
            has = tc > 0
            if has.any():
                kk, nn, ss, cc = k_idx[has], node[has], cur[has], tc[has]
                owner, off = _csr_expand(cc)
                toks = trie.tok_ids[d][trie.tok_start[d][nn][owner] + off]
                allowed[kk[owner], toks] = True
                e = np.unique(st[kk] * n_states + ss)
                edges.append(e)
            if d == trie.depth:
                break
            cnt = trie.child_count[d][node]
            owner, off = _csr_expand(cnt)
            child = trie.child_start[d][node][owner] + off
            ns = full[cur[owner], trie.byte[d + 1][child]]
            alive = ns != DEAD
            k_idx, node, cur = k_idx[owner][alive], child[alive], ns[alive]
            d += 1
        packed = np.packbits(allowed, axis=1, bitorder="little")  # [chunk, words*4] uint8
        masks[st] = packed.view("<u4")
    has_token = masks.any(axis=1)
    eos = np.array(info.eos_token_ids, dtype=np.int64)
    eos_bits = np.zeros(words, dtype=np.uint32)
    np.bitwise_or.at(eos_bits, eos >> 5, (np.uint32(1) << (eos & 31).astype(np.uint32)))
    accepting = np.append(dfa.accepting, True)
    accepting[DEAD] = False
    if with_eos:
        masks[accepting] |= eos_bits
        masks[n_states] = eos_bits  # terminated
    reachable = _reachable(dfa.initial, n_states, np.concatenate(edges) if edges else np.zeros(0, np.int64))
    stuck = reachable & ~accepting[:n_states] & ~has_token[:n_states] & with_eos
    if stuck.any():
        s = int(np.flatnonzero(stuck)[0])
        need = sorted({b for b in range(256) if full[s, b] != DEAD})
        raise GrammarError(
            f"incompatible vocabulary: no token can continue the constraint in state {s} "
            f"(it needs one of the bytes {bytes(need[:8])!r}, which no usable token provides)"
        )
    rows: dict[bytes, int] = {}
    mask_of = np.array([rows.setdefault(m.tobytes(), len(rows)) for m in masks], dtype=np.int64)
    unique = np.frombuffer(b"".join(rows), dtype=np.int32).reshape(len(rows), words).copy()
    unique.setflags(write=False)
    reach = np.append(reachable, True)
    return TokenIndex(unique, mask_of, has_token, reach)


def _reachable(initial: int, n_states: int, edges: np.ndarray) -> np.ndarray:
    src, dst = edges // n_states, edges % n_states
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    starts = np.searchsorted(src, np.arange(n_states + 1))
    seen = np.zeros(n_states, dtype=bool)
    seen[initial] = True
    frontier = np.array([initial])
    while len(frontier):
        nxt = np.concatenate([dst[starts[s] : starts[s + 1]] for s in frontier])
        nxt = np.unique(nxt)
        nxt = nxt[~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
    return seen
