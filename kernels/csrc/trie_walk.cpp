// Token masks of grammar automata: the vocabulary's token trie walked through a byte automaton, one state at a time.
//   sglpy_trie_walk     the tokens a state keeps alive (its packed mask) and the tokens that leave its frame
//                                       oracle: grammar/tokens/masks.py:walk_state_reference (numpy, per trie level)
//   sglpy_cross_check   which frame-leaving tokens the frames below the top of a stack accept
//                                       oracle: grammar/rtn/guide.py:StackGuide._crosses (Python, byte by byte)
//
// The trie is laid out in preorder (the order of the sorted token strings): node i has depth[i], byte[i] (its last
// byte) and end[i] (one past its subtree), and the tokens ending at node i are tok_ids[tok_lo[i]:tok_lo[i + 1]], so
// the tokens strictly below node i are tok_ids[tok_lo[i + 1]:tok_lo[end[i]]]. A dead byte skips the whole subtree.
//
// The automaton is a module network (grammar/rtn/program.py): trans[state * n_classes + class_of[byte]] is 0 (dead),
// a state id (> 0), or -(entry + 1): a call that pushes the return state rets[entry] and lands in ats[entry].
// pop[state]: the state accepts in a called module, whose frame returns at once. A plain DFA has no calls and no pops.
#include <cstdint>
#include <vector>

namespace {

struct Frame {
  int32_t parent, ret;
};

}  // namespace

extern "C" {

// Returns the number of frame-leaving tokens (written up to cross_cap), or -1 if the trie is deeper than max_depth.
// mask [ceil(vocab / 32)] must be zeroed by the caller; cross_tok / cross_off receive (token, bytes read inside).
int64_t sglpy_trie_walk(const uint8_t* node_byte, const int32_t* node_depth, const int32_t* node_end,
                        const int32_t* tok_lo, const int32_t* tok_ids, int64_t n_nodes, int64_t max_depth,
                        const int32_t* trans, int64_t n_classes, const int32_t* class_of, const uint8_t* pop,
                        const int32_t* rets, const int32_t* ats, int32_t start, uint32_t* mask, int32_t* cross_tok,
                        int32_t* cross_off, int64_t cross_cap) {
  std::vector<int32_t> cur(max_depth + 1), sp(max_depth + 1);
  std::vector<Frame> frames(1, Frame{0, 0});  // frame 0: the start frame itself
  cur[0] = start;
  sp[0] = 0;
  int64_t n_cross = 0;
  int64_t i = 1;
  while (i < n_nodes) {
    const int32_t d = node_depth[i];
    if (d > max_depth) return -1;
    int32_t s = cur[d - 1], f = sp[d - 1];
    const int32_t t = trans[static_cast<int64_t>(s) * n_classes + class_of[node_byte[i]]];
    if (t == 0) {  // dead: no token below this node
      i = node_end[i];
      continue;
    }
    if (t < 0) {  // a call: remember where the caller goes on, land in the callee
      const int32_t e = -t - 1;
      frames.push_back(Frame{f, rets[e]});
      f = static_cast<int32_t>(frames.size()) - 1;
      s = ats[e];
    } else {
      s = t;
    }
    bool exited = false;
    while (pop[s]) {  // the callee accepted: return (nested calls may end together)
      if (f == 0) {
        exited = true;
        break;
      }
      s = frames[f].ret;
      f = frames[f].parent;
    }
    for (int32_t k = tok_lo[i]; k < tok_lo[i + 1]; ++k) {
      const int32_t tok = tok_ids[k];
      mask[tok >> 5] |= 1u << (tok & 31);
    }
    if (exited) {  // the start frame returned: longer tokens go on in the caller, whoever that is
      for (int32_t k = tok_lo[i + 1]; k < tok_lo[node_end[i]]; ++k) {
        if (n_cross < cross_cap) {
          cross_tok[n_cross] = tok_ids[k];
          cross_off[n_cross] = d;
        }
        ++n_cross;
      }
      i = node_end[i];
      continue;
    }
    cur[d] = s;
    sp[d] = f;
    ++i;
  }
  return n_cross;
}

// For each frame-leaving token k (id cross_tok[k], cross_off[k] bytes read inside the top frame), ok[k] = 1 when the
// rest of its bytes fit the frames below: stack[0:depth] (bottom to top), the top frame having returned to
// stack[depth - 1]. Token bytes: tok_bytes[tok_start[id]:tok_start[id + 1]]. Returns how many fit.
int64_t sglpy_cross_check(const uint8_t* tok_bytes, const int64_t* tok_start, const int32_t* cross_tok,
                          const int32_t* cross_off, int64_t n_cross, const int32_t* stack, int64_t depth,
                          const int32_t* trans, int64_t n_classes, const int32_t* class_of, const uint8_t* pop,
                          const int32_t* rets, const int32_t* ats, uint8_t* ok) {
  std::vector<int32_t> base(stack, stack + depth), st;
  while (base.size() > 1 && pop[base.back()]) base.pop_back();  // callers that end where the top frame ended
  int64_t fit = 0;
  for (int64_t k = 0; k < n_cross; ++k) {
    st = base;
    bool alive = !st.empty();
    const int32_t tok = cross_tok[k];
    for (int64_t p = tok_start[tok] + cross_off[k]; alive && p < tok_start[tok + 1]; ++p) {
      const int32_t t = trans[static_cast<int64_t>(st.back()) * n_classes + class_of[tok_bytes[p]]];
      if (t == 0) {
        alive = false;
      } else if (t < 0) {
        st.back() = rets[-t - 1];
        st.push_back(ats[-t - 1]);
      } else {
        st.back() = t;
      }
      while (alive && st.size() > 1 && pop[st.back()]) st.pop_back();
    }
    ok[k] = alive ? 1 : 0;
    fit += alive;
  }
  return fit;
}

}  // extern "C"
