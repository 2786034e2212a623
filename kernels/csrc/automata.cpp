// Grammar automata construction: byte NFAs (which may embed call modules) -> trimmed, minimal class tables.
//   sglpy_subset_build   subset construction over byte classes, then trim and minimise
//                                       oracle: grammar/rtn/build.py:nfa_to_module (Python; a plain NFA:
//                                       grammar/regex/dfa.py:nfa_to_dfa)
//   sglpy_table_finish   trim and minimise a class table with call cells
//                                       oracle: grammar/rtn/module.py:trim_module + minimise_module
//   sglpy_automaton_*    read back / free a result
//
// Tables: cell >= 0 is a local state (0 = dead), cell < 0 is call entry -(k + 1), entry k = (callee, at, ret): the byte
// lands in callee state `at`; when the callee accepts, the caller continues at `ret`. Modules are the grammar's
// rtn.module.Module: trans [states, 256] int32 over bytes, accepting, initial, entries; items of the subset
// construction are NFA states or (module, state, continuation item), exactly as in the Python oracle, so the result
// is the same automaton up to the numbering of states (the tests compare canonical forms).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace {

using Check = int32_t (*)();  // returns nonzero to stop (the compile budget ran out or was cancelled)

enum Status : int64_t { kOk = 0, kTooLarge = 1, kStopped = 2 };
constexpr int64_t kCheckWork = 1 << 20;  // table cells (or 16 per subset item) read between budget checks

struct Result {
  int64_t status = kOk;
  int64_t n_classes = 0;
  int32_t initial = 0;
  std::vector<int32_t> table;  // [states * n_classes]
  std::vector<uint8_t> accepting;
  std::vector<int32_t> entries;  // [n_entries * 3]: callee, at, ret
  int32_t class_of[256];
};

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull + (h >> 29);
    return static_cast<size_t>(h);
  }
};

struct Triple {
  int32_t a, b, c;
  bool operator==(const Triple& o) const { return a == o.a && b == o.b && c == o.c; }
};
struct TripleHash {
  size_t operator()(const Triple& t) const {
    uint64_t h = static_cast<uint32_t>(t.a) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<uint32_t>(t.b) * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    h ^= static_cast<uint32_t>(t.c) * 0x165667B19E3779F9ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// ---- trim + Moore minimisation over a class table with call entries (the Python oracle's semantics) ----------------

// Drops states that cannot reach acceptance (a call cell counts as an edge to its entry's ret), renumbers states and
// entries. Returns false when the initial state is dead (the table becomes the dead state alone).
void trim(std::vector<int32_t>& table, std::vector<uint8_t>& acc, int32_t& initial, std::vector<int32_t>& entries,
          int64_t k) {
  const int64_t n = static_cast<int64_t>(acc.size());
  const int64_t ne = static_cast<int64_t>(entries.size()) / 3;
  std::vector<int32_t> deg(n + 1, 0), preds;
  auto succ = [&](int64_t s, int64_t c) -> int32_t {
    const int32_t v = table[s * k + c];
    return v >= 0 ? v : entries[(-v - 1) * 3 + 2];
  };
  for (int64_t s = 1; s < n; ++s)
    for (int64_t c = 0; c < k; ++c) {
      const int32_t d = succ(s, c);
      if (d != 0 && d != s) ++deg[d + 1];
    }
  for (int64_t s = 0; s < n; ++s) deg[s + 1] += deg[s];
  preds.resize(deg[n]);
  std::vector<int32_t> fill(deg.begin(), deg.end() - 1);
  for (int64_t s = 1; s < n; ++s)
    for (int64_t c = 0; c < k; ++c) {
      const int32_t d = succ(s, c);
      if (d != 0 && d != s) preds[fill[d]++] = static_cast<int32_t>(s);
    }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (int64_t s = 1; s < n; ++s)
    if (acc[s]) {
      live[s] = 1;
      stack.push_back(static_cast<int32_t>(s));
    }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t j = deg[s]; j < deg[s + 1]; ++j)
      if (!live[preds[j]]) {
        live[preds[j]] = 1;
        stack.push_back(preds[j]);
      }
  }
  if (!live[initial]) {
    table.assign(k, 0);
    acc.assign(1, 0);
    initial = 0;
    entries.clear();
    return;
  }
  live[0] = 1;
  std::vector<int32_t> remap(n, 0);
  int32_t m = 0;
  for (int64_t s = 0; s < n; ++s)
    if (live[s]) remap[s] = m++;
  std::vector<int32_t> emap(ne, 0), new_entries;  // emap: new cell value of a call (0 = its ret died)
  for (int64_t e = 0; e < ne; ++e) {
    const int32_t ret = entries[e * 3 + 2];
    if (ret != 0 && live[ret]) {
      emap[e] = -static_cast<int32_t>(new_entries.size() / 3 + 1);
      new_entries.insert(new_entries.end(), {entries[e * 3], entries[e * 3 + 1], remap[ret]});
    }
  }
  std::vector<int32_t> out(static_cast<size_t>(m) * k);
  std::vector<uint8_t> new_acc(m);
  for (int64_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    const int64_t r = remap[s];
    new_acc[r] = acc[s];
    for (int64_t c = 0; c < k; ++c) {
      const int32_t v = table[s * k + c];
      out[r * k + c] = v >= 0 ? remap[v] : emap[-v - 1];
    }
  }
  table.swap(out);
  acc.swap(new_acc);
  initial = remap[initial];
  entries.swap(new_entries);
}

// Moore refinement over the table extended with one pseudo-state per entry (its row leads to the entry's ret, its
// first block is its (callee, at)), blocks numbered in order of their first state; past a work budget (one round
// costs O(states), long chains need a round per link and are usually minimal already) the table is kept as it is.
bool minimise(std::vector<int32_t>& table, std::vector<uint8_t>& acc, int32_t& initial, std::vector<int32_t>& entries,
              int64_t k, Check check) {
  const int64_t n = static_cast<int64_t>(acc.size());
  const int64_t ne = static_cast<int64_t>(entries.size()) / 3;
  const int64_t total = n + ne;
  std::vector<int32_t> ext(static_cast<size_t>(total) * k);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t c = 0; c < k; ++c) {
      const int32_t v = table[s * k + c];
      ext[s * k + c] = v >= 0 ? v : static_cast<int32_t>(n - v - 1);
    }
  std::vector<int32_t> block(total), next(total);
  std::unordered_map<uint64_t, int32_t> codes;
  for (int64_t s = 0; s < n; ++s) block[s] = s == 0 ? 0 : acc[s] + 1;
  for (int64_t e = 0; e < ne; ++e) {
    std::fill(ext.begin() + (n + e) * k, ext.begin() + (n + e + 1) * k, entries[e * 3 + 2]);
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(entries[e * 3])) << 32) |
                         static_cast<uint32_t>(entries[e * 3 + 1]);
    auto it = codes.emplace(key, static_cast<int32_t>(codes.size())).first;
    block[n + e] = 3 + it->second;
  }
  const int64_t round_budget = std::max<int64_t>(64, 1000000 / std::max<int64_t>(total, 1));
  int64_t count = 0;
  {
    std::vector<int32_t> seen;
    for (int64_t s = 0; s < total; ++s) seen.push_back(block[s]);
    std::sort(seen.begin(), seen.end());
    count = std::unique(seen.begin(), seen.end()) - seen.begin();
  }
  // Signatures are sparse: (own block, then (class, successor block) for each live cell). DEAD is alone in block 0
  // for good, so dead cells carry no information; a pseudo-state's row (its ret everywhere) is one cell of class -1.
  std::vector<int32_t> cell_off(total + 1, 0), cell_cls, cell_dst;
  for (int64_t s = 0; s < total; ++s) {
    if (s >= n) {
      cell_cls.push_back(-1);
      cell_dst.push_back(ext[s * k]);
    } else if (s != 0) {
      for (int64_t c = 0; c < k; ++c)
        if (ext[s * k + c] != 0) {
          cell_cls.push_back(static_cast<int32_t>(c));
          cell_dst.push_back(ext[s * k + c]);
        }
    }
    cell_off[s + 1] = static_cast<int32_t>(cell_cls.size());
  }
  // open addressing over signatures: a slot holds the first state with that signature
  size_t cap = 16;
  while (cap < static_cast<size_t>(2 * total)) cap <<= 1;
  std::vector<int32_t> slot(cap), first_of;
  std::vector<int32_t> sig(static_cast<size_t>(total) + 2 * cell_cls.size());  // state s at sig_at(s)
  auto sig_at = [&](int64_t s) { return static_cast<int64_t>(s) + 2 * static_cast<int64_t>(cell_off[s]); };
  int64_t rounds = 0, work = 0;
  bool minimal = false;
  while (true) {
    work += static_cast<int64_t>(sig.size()) * 4;
    if (work >= kCheckWork) {  // a budget check costs a call into Python: about once per millisecond of work
      work = 0;
      if (check != nullptr && check()) return false;
    }
    if (++rounds > round_budget) break;
    for (int64_t s = 0; s < total; ++s) {
      int32_t* row = &sig[sig_at(s)];
      *row++ = block[s];
      for (int32_t j = cell_off[s]; j < cell_off[s + 1]; ++j) {
        *row++ = cell_cls[j];
        *row++ = block[cell_dst[j]];
      }
    }
    std::fill(slot.begin(), slot.end(), -1);
    first_of.clear();
    for (int64_t s = 0; s < total; ++s) {
      const int32_t* row = &sig[sig_at(s)];
      const int64_t len = sig_at(s + 1) - sig_at(s);
      uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(len);
      for (int64_t c = 0; c < len; ++c) h = (h ^ static_cast<uint32_t>(row[c])) * 0x100000001B3ull;
      h ^= h >> 31;
      size_t p = static_cast<size_t>(h) & (cap - 1);
      while (true) {
        const int32_t r = slot[p];
        if (r < 0) {
          slot[p] = static_cast<int32_t>(first_of.size());
          next[s] = static_cast<int32_t>(first_of.size());
          first_of.push_back(static_cast<int32_t>(s));
          break;
        }
        const int64_t q = first_of[r];
        if (sig_at(q + 1) - sig_at(q) == len &&
            std::memcmp(&sig[sig_at(q)], row, static_cast<size_t>(len) * sizeof(int32_t)) == 0) {
          next[s] = r;
          break;
        }
        p = (p + 1) & (cap - 1);
      }
    }
    const int64_t new_count = static_cast<int64_t>(first_of.size());
    block.swap(next);
    if (new_count == count) {
      minimal = true;
      break;
    }
    count = new_count;
  }
  if (!minimal) return true;  // kept as it is (still exact)
  // blocks are numbered in order of their first state: DEAD's is 0 and real states' blocks precede pseudo-states'
  int32_t n_real = 0;
  for (int64_t s = 0; s < n; ++s) n_real = std::max(n_real, block[s] + 1);
  std::vector<int32_t> out(static_cast<size_t>(n_real) * k);
  std::vector<uint8_t> new_acc(n_real);
  std::vector<int32_t> new_entries(static_cast<size_t>(count - n_real) * 3, -1);
  for (int32_t b = 0; b < n_real; ++b) {
    const int32_t rep = first_of[b];
    new_acc[b] = acc[rep];
    for (int64_t c = 0; c < k; ++c) {
      const int32_t v = block[ext[rep * k + c]];
      out[b * k + c] = b == 0 ? 0 : v < n_real ? v : n_real - 1 - v;
    }
  }
  for (int64_t e = 0; e < ne; ++e) {
    const int32_t j = block[n + e] - n_real;
    if (new_entries[j * 3] < 0) {
      new_entries[j * 3] = entries[e * 3];
      new_entries[j * 3 + 1] = entries[e * 3 + 1];
      new_entries[j * 3 + 2] = block[entries[e * 3 + 2]];
    }
  }
  table.swap(out);
  acc.swap(new_acc);
  initial = block[initial];
  entries.swap(new_entries);
  return true;
}

// Bytes whose columns agree in every row share a class: the coarsest classes of the table (ids in order of first byte).
void merge_columns(Result* r) {
  const int64_t k = r->n_classes, n = static_cast<int64_t>(r->accepting.size());
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
  std::vector<int32_t> col(n), new_of(k, -1), first;
  for (int b = 0; b < 256; ++b) {
    const int32_t c = r->class_of[b];
    if (new_of[c] < 0) {
      for (int64_t s = 0; s < n; ++s) col[s] = r->table[s * k + c];
      auto it = ids.emplace(col, static_cast<int32_t>(ids.size()));
      if (it.second) first.push_back(c);
      new_of[c] = it.first->second;
    }
    r->class_of[b] = new_of[c];
  }
  const int64_t m = static_cast<int64_t>(first.size());
  if (m == k) {
    bool same = true;
    for (int64_t c = 0; c < k; ++c) same = same && first[c] == c;
    if (same) return;
  }
  std::vector<int32_t> out(static_cast<size_t>(n) * m);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < m; ++j) out[s * m + j] = r->table[s * k + first[j]];
  r->table.swap(out);
  r->n_classes = m;
}

void finish(Result* r, Check check, bool merge) {
  trim(r->table, r->accepting, r->initial, r->entries, r->n_classes);
  if (r->initial != 0 && !minimise(r->table, r->accepting, r->initial, r->entries, r->n_classes, check))
    r->status = kStopped;
  else if (merge && r->entries.empty())  // a module that calls keeps classes refining its callees' (they read them)
    merge_columns(r);
}

// ---- subset construction ------------------------------------------------------------------------------------------

struct Subset {
  // NFA (CSR per state)
  int64_t n_nfa;
  int32_t accept;
  const int32_t *eps_off, *eps_dst, *edge_off, *edge_lo, *edge_hi, *edge_dst, *emb_off, *emb_mod, *emb_end;
  // modules
  const int32_t* const* mod_trans;  // [n_mod] -> [states * 256]
  const int32_t* mod_states;
  const uint8_t* const* mod_acc;
  const uint8_t* const* mod_exit;  // per state: some byte leads on
  const int32_t* mod_initial;
  const uint8_t* mod_callable;
  const int32_t *mod_entry_off, *entry_callee, *entry_at, *entry_ret;
  // classes
  int64_t n_classes = 0;
  int32_t class_of[256];
  std::vector<int32_t> reps;
  std::vector<int32_t> edge_cls_lo, edge_cls_hi, edge_cls;  // edge j covers edge_cls[edge_cls_lo[j]:edge_cls_hi[j]]
  // items: ids < n_nfa are NFA states; module items (m, x, cont) from n_nfa on
  std::vector<Triple> items;
  std::unordered_map<Triple, int32_t, TripleHash> item_ids;
  std::unordered_map<int64_t, std::vector<int32_t>> cell_cache;  // (m, x) -> (class, value) pairs
  std::vector<uint32_t> mark;
  uint32_t stamp = 0;

  int32_t item(int32_t m, int32_t x, int32_t cont) {
    const Triple key{m, x, cont};
    auto it = item_ids.find(key);
    if (it != item_ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(n_nfa + items.size());
    items.push_back(key);
    item_ids.emplace(key, id);
    return id;
  }

  const std::vector<int32_t>& cells(int32_t m, int32_t x) {
    const int64_t key = (static_cast<int64_t>(m) << 32) | static_cast<uint32_t>(x);
    auto it = cell_cache.find(key);
    if (it != cell_cache.end()) return it->second;
    std::vector<int32_t> got;
    const int32_t* row = mod_trans[m] + static_cast<int64_t>(x) * 256;
    for (int64_t c = 0; c < n_classes; ++c) {
      const int32_t v = row[reps[c]];
      if (v != 0) {
        got.push_back(static_cast<int32_t>(c));
        got.push_back(v);
      }
    }
    return cell_cache.emplace(key, std::move(got)).first->second;
  }

  // epsilon closure of `seeds`: the items with a future (byte edges / module exits), sorted, and acceptance
  bool closure(const std::vector<int32_t>& seeds, std::vector<int32_t>& kept, std::vector<int32_t>& stack) {
    if (++stamp == 0) {
      std::fill(mark.begin(), mark.end(), 0);
      stamp = 1;
    }
    kept.clear();
    stack.assign(seeds.begin(), seeds.end());
    bool accepting = false;
    while (!stack.empty()) {
      const int32_t it = stack.back();
      stack.pop_back();
      if (static_cast<size_t>(it) >= mark.size()) mark.resize(std::max<size_t>(it + 1, mark.size() * 2), 0);
      if (mark[it] == stamp) continue;
      mark[it] = stamp;
      if (it < n_nfa) {
        if (it == accept) accepting = true;
        if (edge_off[it + 1] > edge_off[it]) kept.push_back(it);
        for (int32_t j = eps_off[it]; j < eps_off[it + 1]; ++j) stack.push_back(eps_dst[j]);
        for (int32_t j = emb_off[it]; j < emb_off[it + 1]; ++j) {
          const int32_t m = emb_mod[j];
          if (mod_initial[m] != 0) stack.push_back(item(m, mod_initial[m], emb_end[j]));
        }
      } else {
        const Triple t = items[it - n_nfa];
        if (mod_exit[t.a][t.b]) kept.push_back(it);
        if (mod_acc[t.a][t.b]) stack.push_back(t.c);
      }
    }
    std::sort(kept.begin(), kept.end());
    return accepting;
  }
};

}  // namespace

extern "C" {

// Subset construction of an NFA (edges as byte ranges; state s embeds modules emb_mod[emb_off[s]:emb_off[s + 1]],
// continuing at emb_end) over the byte classes its edges and the modules flagged in mod_refine induce, then trim and
// minimise; without calls the result's classes are the coarsest its table has (bytes whose columns agree share one),
// with calls they are the construction's (they refine every callee's classes, which stepping through it reads). Returns a
// Result* (read its status: 0 ok, 1 more than max_states states, 2 stopped by check).
void* sglpy_subset_build(int64_t n_nfa, int32_t start, int32_t accept, const int32_t* eps_off, const int32_t* eps_dst,
                         const int32_t* edge_off, const int32_t* edge_lo, const int32_t* edge_hi,
                         const int32_t* edge_dst, const int32_t* emb_off, const int32_t* emb_mod,
                         const int32_t* emb_end, int64_t n_mod, const int64_t* mod_trans, const int32_t* mod_states,
                         const int64_t* mod_acc, const int64_t* mod_exit, const int32_t* mod_initial, const uint8_t* mod_callable,
                         const uint8_t* mod_refine, const int32_t* mod_classes, const int32_t* mod_entry_off,
                         const int32_t* entry_callee, const int32_t* entry_at, const int32_t* entry_ret,
                         int64_t max_states, Check check) {
  auto* res = new Result();
  if (check != nullptr && check()) {  // cancelled or out of time before this construction started
    res->status = kStopped;
    return res;
  }
  Subset S;
  S.n_nfa = n_nfa;
  S.accept = accept;
  S.eps_off = eps_off, S.eps_dst = eps_dst, S.edge_off = edge_off, S.edge_lo = edge_lo, S.edge_hi = edge_hi;
  S.edge_dst = edge_dst, S.emb_off = emb_off, S.emb_mod = emb_mod, S.emb_end = emb_end;
  S.mod_trans = reinterpret_cast<const int32_t* const*>(mod_trans);
  S.mod_states = mod_states;
  S.mod_acc = reinterpret_cast<const uint8_t* const*>(mod_acc);
  S.mod_initial = mod_initial, S.mod_callable = mod_callable, S.mod_entry_off = mod_entry_off;
  S.entry_callee = entry_callee, S.entry_at = entry_at, S.entry_ret = entry_ret;
  S.mod_exit = reinterpret_cast<const uint8_t* const*>(mod_exit);
  // byte classes: the cuts of the NFA's ranges refined by every flagged module's classes
  {
    std::vector<uint8_t> cut(257, 0);
    cut[0] = cut[256] = 1;
    for (int32_t j = 0; j < edge_off[n_nfa]; ++j) {
      cut[edge_lo[j]] = 1;
      cut[edge_hi[j] + 1] = 1;
    }
    std::vector<std::vector<int32_t>> sigs(256);
    int32_t interval = -1;
    for (int b = 0; b < 256; ++b) {
      if (cut[b]) ++interval;
      sigs[b].push_back(interval);
      for (int64_t m = 0; m < n_mod; ++m)
        if (mod_refine[m]) sigs[b].push_back(mod_classes[m * 256 + b]);
    }
    std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
    for (int b = 0; b < 256; ++b) {
      auto it = ids.emplace(sigs[b], static_cast<int32_t>(ids.size()));
      if (it.second) S.reps.push_back(b);
      S.class_of[b] = it.first->second;
    }
    S.n_classes = static_cast<int64_t>(S.reps.size());
    std::memcpy(res->class_of, S.class_of, sizeof(S.class_of));
    res->n_classes = S.n_classes;
    // the classes each edge's byte range covers, once per distinct range (ranges repeat: copies of one class)
    const int32_t n_edges = edge_off[n_nfa];
    S.edge_cls_lo.resize(n_edges);
    S.edge_cls_hi.resize(n_edges);
    std::unordered_map<int32_t, std::pair<int32_t, int32_t>> spans;
    std::vector<int32_t> seen(S.reps.size(), -1);
    for (int32_t j = 0; j < n_edges; ++j) {
      const int32_t key = edge_lo[j] * 256 + edge_hi[j];
      auto it = spans.find(key);
      if (it == spans.end()) {
        const int32_t lo = static_cast<int32_t>(S.edge_cls.size());
        for (int b = edge_lo[j]; b <= edge_hi[j]; ++b) {
          const int32_t c = S.class_of[b];
          if (seen[c] != key) {
            seen[c] = key;
            S.edge_cls.push_back(c);
          }
        }
        it = spans.emplace(key, std::make_pair(lo, static_cast<int32_t>(S.edge_cls.size()))).first;
      }
      S.edge_cls_lo[j] = it->second.first;
      S.edge_cls_hi[j] = it->second.second;
    }
  }
  const int64_t k = S.n_classes;
  S.mark.assign(n_nfa + 1024, 0);

  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;  // kept items + [acceptance flag] -> state
  std::vector<std::vector<int32_t>> keys(1);
  std::vector<int32_t> work;
  std::vector<int32_t>& table = res->table;
  std::vector<uint8_t>& acc = res->accepting;
  std::unordered_map<Triple, int32_t, TripleHash> entry_ids;
  table.assign(k, 0);
  acc.assign(1, 0);
  bool too_large = false;

  auto intern = [&](std::vector<int32_t>& key, bool accepting) -> int32_t {
    key.push_back(accepting ? -1 : -2);
    auto it = ids.find(key);
    if (it != ids.end()) return it->second;
    if (static_cast<int64_t>(acc.size()) > max_states) {
      too_large = true;
      return 0;
    }
    const int32_t sid = static_cast<int32_t>(acc.size());
    ids.emplace(key, sid);
    keys.push_back(key);
    table.resize(table.size() + k, 0);
    acc.push_back(accepting ? 1 : 0);
    work.push_back(sid);
    return sid;
  };

  std::vector<int32_t> kept, stack, conts, kept2;
  auto target = [&](const std::vector<int32_t>& targets) -> int32_t {
    const bool accepting = S.closure(targets, kept, stack);
    if (kept.empty() && !accepting) return 0;
    if (!accepting && kept[0] >= n_nfa) {
      const Triple f = S.items[kept[0] - n_nfa];
      bool call = S.mod_callable[f.a] != 0;
      for (size_t j = 1; call && j < kept.size(); ++j) {
        if (kept[j] < n_nfa) {
          call = false;
          break;
        }
        const Triple t = S.items[kept[j] - n_nfa];
        call = t.a == f.a && t.b == f.b;
      }
      if (call) {
        conts.clear();
        for (int32_t it : kept) conts.push_back(S.items[it - n_nfa].c);
        const bool ret_acc = S.closure(conts, kept2, stack);
        const int32_t ret = intern(kept2, ret_acc);
        if (too_large) return 0;
        const Triple ekey{f.a, f.b, ret};
        auto it = entry_ids.find(ekey);
        int32_t e;
        if (it == entry_ids.end()) {
          e = static_cast<int32_t>(entry_ids.size());
          entry_ids.emplace(ekey, e);
          res->entries.insert(res->entries.end(), {f.a, f.b, ret});
        } else {
          e = it->second;
        }
        return -(e + 1);
      }
    }
    return intern(kept, accepting);
  };

  {
    std::vector<int32_t> seed{start};
    const bool a0 = S.closure(seed, kept, stack);
    res->initial = intern(kept, a0);
  }
  std::vector<std::vector<int32_t>> moves(k);
  std::vector<int32_t> touched;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> row_cache;
  int64_t work_done = 0;
  while (!work.empty() && !too_large) {
    const int32_t sid = work.back();
    work.pop_back();
    const std::vector<int32_t>& key = keys[sid];
    work_done += static_cast<int64_t>(key.size()) * 16;
    if (work_done >= kCheckWork) {
      work_done = 0;
      if (check != nullptr && check()) {
        res->status = kStopped;
        return res;
      }
    }
    touched.clear();
    auto add = [&](int32_t c, int32_t t) {
      if (moves[c].empty()) touched.push_back(c);
      moves[c].push_back(t);
    };
    for (size_t j = 0; j + 1 < key.size(); ++j) {  // the last element is the acceptance flag
      const int32_t it = key[j];
      if (it < n_nfa) {
        for (int32_t e = edge_off[it]; e < edge_off[it + 1]; ++e)
          for (int32_t q = S.edge_cls_lo[e]; q < S.edge_cls_hi[e]; ++q) add(S.edge_cls[q], edge_dst[e]);
        continue;
      }
      const Triple t = S.items[it - n_nfa];
      const std::vector<int32_t>& cs = S.cells(t.a, t.b);
      for (size_t q = 0; q < cs.size(); q += 2) {
        const int32_t c = cs[q], v = cs[q + 1];
        if (v > 0) {
          add(c, S.item(t.a, v, t.c));
        } else {
          const int32_t e = mod_entry_off[t.a] + (-v - 1);
          const int32_t callee = entry_callee[e];
          add(c, S.item(callee, entry_at[e], S.item(t.a, entry_ret[e], t.c)));
        }
      }
    }
    row_cache.clear();
    for (int32_t c : touched) {
      std::vector<int32_t>& ts = moves[c];
      std::sort(ts.begin(), ts.end());
      ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
      auto it = row_cache.find(ts);
      int32_t v;
      if (it != row_cache.end()) {
        v = it->second;
      } else {
        v = target(ts);
        if (too_large) break;
        row_cache.emplace(ts, v);
      }
      table[static_cast<int64_t>(sid) * k + c] = v;
    }
    for (int32_t c : touched) moves[c].clear();
  }
  if (too_large) {
    res->status = kTooLarge;
    return res;
  }
  finish(res, check, true);
  return res;
}

// Trim and minimise a class table [n_states * n_classes] with call entries [n_entries * 3] (callee code, at, ret;
// two entries call the same place when their callee codes and `at` agree). Returns a Result*.
void* sglpy_table_finish(const int32_t* table, const uint8_t* accepting, int64_t n_states, int64_t n_classes,
                         int32_t initial, const int32_t* entries, int64_t n_entries, Check check) {
  auto* res = new Result();
  res->n_classes = n_classes;
  res->table.assign(table, table + n_states * n_classes);
  res->accepting.assign(accepting, accepting + n_states);
  res->entries.assign(entries, entries + n_entries * 3);
  res->initial = initial;
  for (int b = 0; b < 256; ++b) res->class_of[b] = b;
  finish(res, check, false);
  return res;
}

// out[0..4] = status, states, classes, entries, initial
void sglpy_automaton_info(const void* h, int64_t* out) {
  const Result* r = static_cast<const Result*>(h);
  out[0] = r->status;
  out[1] = static_cast<int64_t>(r->accepting.size());
  out[2] = r->n_classes;
  out[3] = static_cast<int64_t>(r->entries.size() / 3);
  out[4] = r->initial;
}

// Copies the table [states * classes], acceptance [states], entries [entries * 3] and class per byte [256].
void sglpy_automaton_read(const void* h, int32_t* table, uint8_t* accepting, int32_t* entries, int32_t* class_of) {
  const Result* r = static_cast<const Result*>(h);
  std::memcpy(table, r->table.data(), r->table.size() * sizeof(int32_t));
  std::memcpy(accepting, r->accepting.data(), r->accepting.size());
  if (!r->entries.empty()) std::memcpy(entries, r->entries.data(), r->entries.size() * sizeof(int32_t));
  std::memcpy(class_of, r->class_of, sizeof(r->class_of));
}

void sglpy_automaton_free(void* h) { delete static_cast<Result*>(h); }

}  // extern "C"
