"""Token index: for every DFA state, the packed bitmask of tokens whose bytes keep the DFA alive."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..regex.dfa import DEAD, ByteDFA, group_rows
from ..errors import GrammarError
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
    reachable: np.ndarray  # [states + 1] bool: token-boundary reachability (all True unless it had to be checked)

    @property
    def terminated(self) -> int:
        """Pseudo-state entered after EOS: only EOS allowed, final."""
        return len(self.mask_of) - 1


def _csr_expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR counts, the owner index and the offset inside the owner's run, per expanded element."""
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(int(counts.sum())) - starts[owner]


def build_index(dfa: ByteDFA, info: TokenizerInfo, with_eos: bool = True, budget=None) -> TokenIndex:
    """Per-state masks: walk the token trie through representative DFA states at once (numpy, per depth).

    States that agree on which byte strings up to the longest token stay alive get identical masks,
    so only one representative per such class is walked (bounded strings: maxLength 1000 -> ~10x less).
    with_eos=False: masks without EOS bits and no vocabulary check (used for EBNF terminals).
    budget: a CompileBudget checked between walk chunks (time limit / cancellation).
    """
    n_states = dfa.num_states
    words = info.mask_words
    rep_of = _mask_classes(dfa.trans, info.longest_token)
    reps = np.unique(rep_of[1:]) if n_states > 1 else np.zeros(0, np.int64)
    rep_masks, _ = _walk_states(dfa, info, reps, want_edges=False, budget=budget)
    masks = np.zeros((n_states + 1, words), dtype=np.uint32)
    if len(reps):
        row = np.zeros(n_states, np.int64)
        row[reps] = np.arange(len(reps))
        masks[1:n_states] = rep_masks[row[rep_of[1:]]]
    has_token = masks.any(axis=1)
    eos = np.array(info.eos_token_ids, dtype=np.int64)
    eos_bits = np.zeros(words, dtype=np.uint32)
    np.bitwise_or.at(eos_bits, eos >> 5, (np.uint32(1) << (eos & 31).astype(np.uint32)))
    accepting = np.append(dfa.accepting, True)
    accepting[DEAD] = False
    if with_eos:
        masks[accepting] |= eos_bits
        masks[n_states] = eos_bits  # terminated
    reachable = np.ones(n_states, dtype=bool)
    candidates = ~accepting[:n_states] & ~has_token[:n_states]
    candidates[DEAD] = False
    if with_eos and candidates.any():  # rare: find out whether such a state is reachable at a token boundary
        _, edges = _walk_states(dfa, info, np.arange(1, n_states, dtype=np.int64), want_edges=True,
                                budget=budget)
        reachable = _reachable(dfa.initial, n_states, edges)
        stuck = reachable & candidates
        if stuck.any():
            s = int(np.flatnonzero(stuck)[0])
            need = sorted({b for b in range(256) if dfa.trans[s, b] != DEAD})
            raise GrammarError(
                f"incompatible vocabulary: no token can continue the constraint in state {s} "
                f"(it needs one of the bytes {bytes(need[:8])!r}, which no usable token provides)"
            )
    rows: dict[bytes, int] = {}
    mask_of = np.array([rows.setdefault(m.tobytes(), len(rows)) for m in masks], dtype=np.int64)
    unique = np.frombuffer(b"".join(rows), dtype=np.int32).reshape(len(rows), words).copy()
    unique.setflags(write=False)
    return TokenIndex(unique, mask_of, has_token, np.append(reachable, True))


def _mask_classes(trans: np.ndarray, depth: int) -> np.ndarray:
    """Representative state per class of states alive on the same byte strings of length <= depth."""
    n = trans.shape[0]
    _, cols = np.unique(trans.T, axis=0, return_index=True)
    tc = np.ascontiguousarray(trans[:, np.sort(cols)])  # one column per byte class
    block = (np.arange(n) != DEAD).astype(np.int64)
    count = 2
    for _ in range(depth):
        block, new_count = group_rows(np.column_stack([block, block[tc]]))
        if new_count == count:
            break
        count = new_count
    first = np.full(count, -1, np.int64)
    for s in range(n - 1, -1, -1):
        first[block[s]] = s
    return first[block]


def _walk_states(dfa: ByteDFA, info: TokenizerInfo, states: np.ndarray, want_edges: bool, budget=None):
    """Masks [len(states), words] of the given states, and (if asked) the token-boundary edges src*n+dst."""
    trie = info.trie
    n_states = dfa.num_states
    full = dfa.trans
    vocab, words = info.vocab_size, info.mask_words
    widest = max((len(b) for b in trie.byte[1:]), default=1)
    chunk = max(1, min(max(len(states), 1), _MAX_PAIRS // max(widest, 1), _MAX_SCRATCH // max(vocab, 1)))
    masks = np.zeros((len(states), words), dtype=np.uint32)
    edges: list[np.ndarray] = []
    for c0 in range(0, len(states), chunk):
        st = states[c0 : c0 + chunk]
        allowed = np.zeros((len(st), words * 32), dtype=bool)
        nxt = full[st][:, trie.byte[1]]  # [chunk, level-1 nodes]
        k_idx, node = np.nonzero(nxt != DEAD)
        cur = nxt[k_idx, node]
        d = 1
        while len(k_idx):
            if budget is not None:
                budget.check("the token index")
            tc = trie.tok_count[d][node]
            has = tc > 0
            if has.any():
                kk, nn, ss, cc = k_idx[has], node[has], cur[has], tc[has]
                owner, off = _csr_expand(cc)
                toks = trie.tok_ids[d][trie.tok_start[d][nn][owner] + off]
                allowed[kk[owner], toks] = True
                if want_edges:
                    edges.append(np.unique(st[kk] * n_states + ss))
            if d == trie.depth:
                break
            cnt = trie.child_count[d][node]
            owner, off = _csr_expand(cnt)
            child = trie.child_start[d][node][owner] + off
            ns = full[cur[owner], trie.byte[d + 1][child]]
            alive = ns != DEAD
            k_idx, node, cur = k_idx[owner][alive], child[alive], ns[alive]
            d += 1
        masks[c0 : c0 + len(st)] = np.packbits(allowed, axis=1, bitorder="little").view("<u4")
    return masks, (np.concatenate(edges) if edges else np.zeros(0, np.int64))


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
