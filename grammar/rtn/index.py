"""Token index of a module network: per global state, the tokens read inside its frame, and the crossing ones.

A token read from state g either stays in g's frame (it may call other modules and return from them
inside the token, or end exactly where g's module returns): those tokens are g's mask, the same whatever
called g's module. A token that goes on after g's module returned depends on the caller: those few
(`"},`, `}]`, ...) are listed per state as (token, bytes read inside the frame), and the guide checks them
against the actual stack when it first meets that stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..regex.dfa import _MIX, DEAD, group_rows
from ..tokens.index import _csr_expand
from .program import Program
from ..tokens.vocab import TokenizerInfo

_MAX_PAIRS = 3_000_000
_MAX_SCRATCH = 16_000_000
_CLASSES_FROM = 1000  # dense non-loop states from which grouping states into classes pays for itself
_DENSE_BYTES = 128  # a state with this many live bytes reads string contents: its walk is dense
EAGER_INDEX_S = 2.0  # compile-time share of the token index; states further from the start are indexed lazily
EAGER_RESERVE_S = 0.4  # stop eager indexing this long before the compile deadline
EAGER_CHUNK = 32  # first chunk of representatives walked together (then sized to ~0.1 s)


@dataclass(frozen=True)
class ProgramIndex:
    """masks[mask_of[g]]: packed mask of state g (EOS included where the document may end);
    cross_tok[cross_start[g]:cross_start[g + 1]]: tokens leaving g's frame, read cross_off bytes inside it.
    mask_of[g] == -1: not indexed at compile time (past the eager budget); `index_states` does it on first visit."""

    masks: np.ndarray  # [unique, words] int32, read-only
    mask_of: np.ndarray  # [states] int64 (-1 = lazy)
    has_token: np.ndarray  # [states] bool: some token stays inside the frame (lazy states: False, unknown)
    cross_start: np.ndarray  # [states + 1] int64
    cross_tok: np.ndarray  # [n] int64
    cross_off: np.ndarray  # [n] int64
    loops: np.ndarray  # [states] bool: free-string loop states (their walk skips whole-character tokens)


@dataclass(frozen=True)
class StateIndex:
    """One state's row, computed on first visit: packed mask (EOS included if final) and crossing tokens."""

    mask: np.ndarray  # [words] int32, read-only
    has_token: bool
    cross_tok: list
    cross_off: list


def _group(block: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, int]:
    """Ids of the distinct (block, vals row) pairs: two 64-bit hashes, then checked (exact grouping on a collision)."""
    m = vals.shape[1]
    v = vals.astype(np.uint64)
    h1 = (v * _MIX[0, 1: m + 1]).sum(axis=1) + block.astype(np.uint64) * _MIX[0, 0]
    h2 = (v * _MIX[1, 1: m + 1]).sum(axis=1) + block.astype(np.uint64) * _MIX[1, 0]
    ids, count = group_rows(np.column_stack([h1, h2]))
    order = np.argsort(ids, kind="stable")
    same = ids[order][1:] == ids[order][:-1]
    rows = np.column_stack([block, vals])[order]
    if ((rows[1:] != rows[:-1]).any(axis=1) & same).any():  # a collision merged different rows
        return group_rows(np.column_stack([block, vals]))
    return ids, count


def _classes(prog: Program, depth: int) -> np.ndarray:
    """Representative state per class of states whose frames read the same byte strings up to `depth`."""
    n = prog.num_states
    t = prog.trans.astype(np.int64)
    is_call = t < 0
    e = np.where(is_call, -t - 1, 0)
    plain = np.where(is_call, 0, t)
    block = np.where(prog.pop, 1, 2).astype(np.int64)
    block[DEAD] = 0
    count = len(np.unique(block))
    for _ in range(depth):
        if prog.num_entries:
            eg, _ = group_rows(np.column_stack([block[prog.ats], block[prog.rets]]))
            vals = np.where(is_call, n + eg[e], block[plain])
        else:
            vals = block[plain]
        block, new = _group(block, vals)
        if new == count:
            break
        count = new
    _, first = np.unique(block, return_index=True)
    rep = np.empty(count, np.int64)
    rep[block[first]] = first
    return rep[block]


# UTF-8 sequences of one character: lead byte range, then the continuation byte ranges (RFC 3629)
_UTF8 = [((0xC2, 0xDF), [(0x80, 0xBF)]), ((0xE0, 0xE0), [(0xA0, 0xBF), (0x80, 0xBF)]),
         ((0xE1, 0xEC), [(0x80, 0xBF)] * 2), ((0xED, 0xED), [(0x80, 0x9F), (0x80, 0xBF)]),
         ((0xEE, 0xEF), [(0x80, 0xBF)] * 2), ((0xF0, 0xF0), [(0x90, 0xBF)] + [(0x80, 0xBF)] * 2),
         ((0xF1, 0xF3), [(0x80, 0xBF)] * 3), ((0xF4, 0xF4), [(0x80, 0x8F)] + [(0x80, 0xBF)] * 2)]


def _string_loops(prog: Program) -> np.ndarray:
    """States that every character of `[^"\\\x00-\x1f]` leads back to themselves (inside a free string)."""
    import itertools

    t = np.where(prog.trans < 0, DEAD, prog.trans).astype(np.int64)  # a call is not a loop
    cls = prog.class_of
    q = np.arange(prog.num_states)
    ok = q != DEAD
    ascii_bytes = [b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)]
    for c in np.unique(cls[ascii_bytes]).tolist():
        ok &= t[:, c] == q
    for (lo, hi), conts in _UTF8:
        sets = [np.unique(cls[lo: hi + 1]).tolist()] + [np.unique(cls[a: b + 1]).tolist() for a, b in conts]
        if np.prod([len(x) for x in sets]) > 4096:
            return np.zeros(prog.num_states, bool)  # too fragmented to check cheaply: walk everything
        for path in itertools.product(*sets):
            r = q
            for c in path:
                r = t[r, c]
            ok &= r == q
    return ok


def _bfs_order(prog: Program) -> np.ndarray:
    """Live states by distance from the initial state (a call cell leads to the callee's entry and to its ret)."""
    n = prog.num_states
    seen = np.zeros(n, bool)
    seen[DEAD] = True
    frontier = np.array([g for g in prog.initial if g != DEAD], np.int64)
    seen[frontier] = True
    out = [frontier]
    rets, ats = prog.rets.astype(np.int64), prog.ats.astype(np.int64)
    while len(frontier):
        t = prog.trans[frontier].reshape(-1).astype(np.int64)
        calls = -t[t < 0] - 1
        nxt = np.unique(np.concatenate([t[t > 0], rets[calls], ats[calls]]))
        nxt = nxt[~seen[nxt]]
        seen[nxt] = True
        out.append(nxt)
        frontier = nxt
    rest = np.flatnonzero(~seen)  # unreachable from the start: never visited, indexed last (if at all)
    return np.concatenate(out + [rest])


def _eos_bits(info: TokenizerInfo) -> np.ndarray:
    eos = np.array(info.eos_token_ids, dtype=np.int64)
    bits = np.zeros(info.mask_words, np.uint32)
    np.bitwise_or.at(bits, eos >> 5, np.uint32(1) << (eos & 31).astype(np.uint32))
    return bits


def _index_reps(prog: Program, info: TokenizerInfo, reps: np.ndarray, loops: np.ndarray, budget=None):
    """Inner masks [len(reps), words] uint32 (no EOS) and crossing tokens (row, token, offset) of the given states."""
    inside, rest_trie = info.string_slice
    masks = np.zeros((len(reps), info.mask_words), np.uint32)
    parts = []
    for sel, trie in ((~loops, info.trie), (loops, rest_trie)):
        if sel.any():
            m, (ck, ct, co) = _walk(prog, info, reps[sel], trie, budget)
            masks[sel] = m
            parts.append((np.flatnonzero(sel)[ck], ct, co))
    masks[loops] |= inside
    cross = tuple(np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(3))
    return masks, cross


def index_state(prog: Program, info: TokenizerInfo, index: ProgramIndex, g: int) -> StateIndex:
    """The row of one state that the compile left lazy (decode time: one trie walk, no budget)."""
    m, (_, ct, co) = _index_reps(prog, info, np.array([g], np.int64), index.loops[[g]])
    mask = m[0]
    has = bool(mask.any())
    if prog.accepting[g] and prog.module_of[g] == 0:
        mask |= _eos_bits(info)
    order = np.argsort(ct, kind="stable")
    mask = mask.view(np.int32)
    mask.setflags(write=False)
    return StateIndex(mask, has, ct[order].tolist(), co[order].tolist())


def build_program_index(prog: Program, info: TokenizerInfo, budget=None, eager_s: float = EAGER_INDEX_S) -> ProgramIndex:
    """Walk the token trie from one representative per class of states, the stack kept per walk, states nearest
    the start first; past `eager_s` seconds (or near the budget's deadline) the other states are left lazy."""
    import time

    clock = budget.now if budget is not None else time.perf_counter  # the deadline is on the budget's clock
    t0 = clock()
    n = prog.num_states
    words = info.mask_words
    # inside free strings, the tokens of whole string characters loop: OR their mask, walk only the others
    loop_states = _string_loops(prog)
    # Dense walks (most bytes live) outside such loops are the expensive ones: bounded strings (maxLength
    # chains). When there are many, walk one state per class of states alike for the longest token's length.
    live_bytes = (prog.trans != DEAD).astype(np.int64) @ np.bincount(prog.class_of, minlength=prog.trans.shape[1])
    wide = (live_bytes >= _DENSE_BYTES) & ~loop_states
    rep_of = _classes(prog, info.longest_token) if wide.sum() > _CLASSES_FROM else np.arange(n)
    order = rep_of[_bfs_order(prog)]
    _, first = np.unique(order, return_index=True)
    reps = order[np.sort(first)]  # representatives in order of their first state's distance from the start
    reps = reps[reps != DEAD]
    stop = t0 + eager_s
    if budget is not None and budget.deadline is not None:
        stop = min(stop, budget.deadline - EAGER_RESERVE_S)
    rep_masks = np.zeros((len(reps), words), np.uint32)
    cross_parts, done, step = [], 0, EAGER_CHUNK
    while done < len(reps):
        if budget is not None:
            budget.check("the token index")
        if done and clock() > stop:
            break
        t1 = clock()
        sel = reps[done: done + step]
        m, (ck, ct, co) = _index_reps(prog, info, sel, loop_states[sel], budget)
        rep_masks[done: done + len(sel)] = m
        cross_parts.append((ck + done, ct, co))
        done += len(sel)
        # chunks of about 0.1 s: the deadline is checked often, numpy calls stay large
        step = int(min(4 * step, max(8, step * 0.1 / max(clock() - t1, 1e-3))))
    reps = reps[:done]
    rep_masks = rep_masks[:done]
    row = np.full(n, -1, np.int64)
    row[reps] = np.arange(done)
    state_row = row[rep_of]  # -1: its representative was not walked (lazy)
    state_row[DEAD] = -1
    has_row = state_row >= 0
    has_token = np.zeros(n, bool)
    has_token[has_row] = rep_masks.any(axis=1)[state_row[has_row]]
    final = prog.accepting & (prog.module_of == 0)
    final[DEAD] = False
    # one mask per (representative row, final) pair in use, then identical masks stored once
    combo = np.where(has_row, 2 * state_row + final, -1)
    combo[DEAD] = -2  # the dead state: an empty mask
    used, inv = np.unique(combo[combo != -1], return_inverse=True)
    eos = _eos_bits(info)
    rows: dict[bytes, int] = {}
    combo_mask = np.zeros(len(used), np.int64)
    for i, c in enumerate(used.tolist()):
        m = np.zeros(words, np.uint32) if c < 0 else (rep_masks[c >> 1] | eos if c & 1 else rep_masks[c >> 1])
        combo_mask[i] = rows.setdefault(m.tobytes(), len(rows))
    mask_of = np.full(n, -1, np.int64)
    mask_of[combo != -1] = combo_mask[inv.reshape(-1)]
    unique = np.frombuffer(b"".join(rows), dtype=np.int32).reshape(len(rows), words).copy()
    unique.setflags(write=False)
    # cross lists: per representative, then per state
    ck = np.concatenate([p[0] for p in cross_parts]) if cross_parts else np.zeros(0, np.int64)
    ctok = np.concatenate([p[1] for p in cross_parts]) if cross_parts else np.zeros(0, np.int64)
    coff = np.concatenate([p[2] for p in cross_parts]) if cross_parts else np.zeros(0, np.int64)
    srt = np.lexsort((ctok, ck))
    ck, ctok, coff = ck[srt], ctok[srt], coff[srt]
    rstart = np.searchsorted(ck, np.arange(done + 1))
    counts = np.zeros(n, np.int64)
    counts[has_row] = (rstart[1:] - rstart[:-1])[state_row[has_row]]
    cross_start = np.concatenate([[0], np.cumsum(counts)])
    owner, off = _csr_expand(counts)
    src = rstart[state_row[owner]] + off
    return ProgramIndex(unique, mask_of, has_token, cross_start, ctok[src], coff[src], loop_states)


def _subtree_tokens(trie, depth: int, nodes: np.ndarray, owners: np.ndarray):
    """(owner, token, depth) for every token strictly below each trie node (nodes at `depth`)."""
    out_o, out_t = [], []
    lo, hi, own = nodes, nodes + 1, owners
    d = depth
    while len(lo) and d < trie.depth:
        cs, cc = trie.child_start[d], trie.child_count[d]
        nlo = cs[lo]
        nhi = cs[hi - 1] + cc[hi - 1]
        keep = nhi > nlo
        lo, hi, own = nlo[keep], nhi[keep], own[keep]
        d += 1
        if not len(lo):
            break
        ts, tc = trie.tok_start[d], trie.tok_count[d]
        a = ts[lo]
        b = ts[hi - 1] + tc[hi - 1]
        cnt = b - a
        o, k = _csr_expand(cnt)
        if len(o):
            out_o.append(own[o])
            out_t.append(trie.tok_ids[d][a[o] + k])
    if not out_o:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_o), np.concatenate(out_t)


def _walk(prog: Program, info: TokenizerInfo, states: np.ndarray, trie, budget=None):
    """Inner masks [len(states), words] and the crossing tokens (row, token, bytes inside) of the given states,
    over the tokens of `trie`."""
    flat = prog.trans
    cls = prog.class_of.astype(np.int64)
    pop = prog.pop
    rets, ats = prog.rets.astype(np.int64), prog.ats.astype(np.int64)
    vocab, words = info.vocab_size, info.mask_words
    widest = max((len(b) for b in trie.byte[1:]), default=1)
    chunk = max(1, min(max(len(states), 1), _MAX_PAIRS // max(widest, 1), _MAX_SCRATCH // max(vocab, 1)))
    masks = np.zeros((len(states), words), dtype=np.uint32)
    cross_k, cross_t, cross_o = [], [], []
    g_count = np.int64(prog.num_states)
    for c0 in range(0, len(states), chunk):
        st = states[c0: c0 + chunk]
        allowed = np.zeros((len(st), words * 32), dtype=bool)
        parent, ret = [0], [0]  # local stacks: node 0 = empty (the start frame itself)
        ids: dict[int, int] = {}
        k_idx = np.repeat(np.arange(len(st)), len(trie.byte[1]))
        node = np.tile(np.arange(len(trie.byte[1])), len(st))
        cur = np.repeat(st, len(trie.byte[1]))
        stk = np.zeros(len(k_idx), np.int64)
        byte = trie.byte[1][node]
        d = 1
        while len(k_idx):
            if budget is not None:
                budget.check("the token index")
            t = flat[cur, cls[byte]].astype(np.int64)
            calls = t < 0
            if calls.any():  # push the caller's return state, land in the callee
                e = -t[calls] - 1
                keys = stk[calls] * g_count + rets[e]
                uk, inv = np.unique(keys, return_inverse=True)
                new_ids = np.empty(len(uk), np.int64)
                for i, key in enumerate(uk.tolist()):
                    got = ids.get(key)
                    if got is None:
                        got = ids[key] = len(parent)
                        parent.append(key // int(g_count))
                        ret.append(key % int(g_count))
                    new_ids[i] = got
                stk[calls] = new_ids[inv.reshape(-1)]
                t[calls] = ats[e]
            alive = t != DEAD
            k_idx, node, t, stk = k_idx[alive], node[alive], t[alive], stk[alive]
            exited = np.zeros(len(k_idx), bool)
            par, rt = np.array(parent, np.int64), np.array(ret, np.int64)
            popping = pop[t]
            while popping.any():  # the callee accepted: it returns (nested calls may end together)
                top = popping & (stk == 0)
                exited |= top
                inner = popping & ~top
                t[inner] = rt[stk[inner]]
                stk[inner] = par[stk[inner]]
                popping = inner & pop[t]
            tc = trie.tok_count[d][node]
            has = tc > 0
            if has.any():
                owner, off = _csr_expand(tc[has])
                toks = trie.tok_ids[d][trie.tok_start[d][node[has]][owner] + off]
                allowed[k_idx[has][owner], toks] = True
            if exited.any():  # the start frame returned: longer tokens go on in the caller
                o, tk = _subtree_tokens(trie, d, node[exited], k_idx[exited])
                if len(o):
                    cross_k.append(o + c0)
                    cross_t.append(tk)
                    cross_o.append(np.full(len(o), d, np.int64))
                keep = ~exited
                k_idx, node, t, stk = k_idx[keep], node[keep], t[keep], stk[keep]
            if d == trie.depth:
                break
            cnt = trie.child_count[d][node]
            owner, off = _csr_expand(cnt)
            child = trie.child_start[d][node][owner] + off
            k_idx, node, cur, stk = k_idx[owner], child, t[owner], stk[owner]
            byte = trie.byte[d + 1][node]
            d += 1
        masks[c0: c0 + len(st)] = np.packbits(allowed, axis=1, bitorder="little").view("<u4")
    if cross_k:
        cross = (np.concatenate(cross_k), np.concatenate(cross_t), np.concatenate(cross_o))
    else:
        cross = (np.zeros(0, np.int64),) * 3
    return masks, cross
