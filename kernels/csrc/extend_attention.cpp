// Paged extend (prefill) attention on CPU: each request's new tokens attend causally to its cached prefix and to
// themselves, K/V read in place through req_to_token in any pool dtype.
// Oracle: kernels/extend_attention.py:extend_attention_reference (tests/kernels/test_kernels_cpu_native.py).
//
// One task = (request, block of QB query tokens, kv head): its rows are the QB tokens x the G query heads of that
// kv head. Keys stream in blocks of KB: the block's K is transposed once into scratch ([D, KB], float32), so the
// scores of RB rows against 16 keys are broadcast-FMAs with no horizontal sums; V is converted once per block and
// P V keeps RB rows' accumulators in registers. Rows skip keys past their position exactly (no tiny weights).
//
// A sliding window (key j visible to the query at position p when p - window < j <= p) starts a task's key blocks
// at the block holding its first row's first key; blocks stay at multiples of KB from position 0, so a row's
// arithmetic does not depend on the other rows of its task (deterministic inference reads decode tokens as one-token
// extends). Rows skip keys before their window exactly, as past their position. Soft-capping maps each scaled score
// s to tanh(s / cap) * cap before the softmax.
#include <vector>

#include "cpu_common.h"
#include "kernels.h"

namespace sglpy {
namespace {

constexpr int64_t QB = 64;  // query tokens per task
constexpr int64_t KB = 64;  // keys per block (4 vectors)
constexpr int64_t KV_VECS = KB / W;  // = 4: softmax_block's block

struct Args {
  const float* q;  // [n, H, D], token rows q_row elements apart
  int64_t q_row;
  const void* k;  // [slots, Hkv, D], slot rows kv_row elements apart
  const void* v;
  int64_t num_slots, kv_row;
  const int32_t* r2t;
  int64_t r2t_rows, r2t_stride;
  const int64_t* rows;    // [b]
  const int64_t* prefix;  // [b]
  const int64_t* ext;     // [b]
  const int64_t* start;   // [b] first token of each request in q / out
  float* out;             // [n, H, D]
  int64_t H, Hkv, D;
  float scale;
  int64_t window;  // > 0: sliding window in tokens; 0: full causal attention
  float softcap;   // > 0: scores become tanh(s / softcap) * softcap; 0: as they are
};

// First key block (a multiple of KB) any row of a task whose first query sits at position q_first can see.
inline int64_t first_block(const Args& a, int64_t q_first) {
  return a.window > 0 ? std::max<int64_t>(0, q_first - a.window + 1) / KB * KB : 0;
}

// softmax_block over the keys [lo, vis) of a block (0 < lo < vis <= KB): the keys before lo get weight 0 exactly.
inline float softmax_range(float* s, int64_t lo, int64_t vis, float& m, float& l) {
  constexpr int V = KV_VECS;
  vf x[V], mx = splat(-INFINITY);
  int64_t rl[V], rh[V];
  for (int v = 0; v < V; ++v) {
    rl[v] = std::min<int64_t>(std::max<int64_t>(lo - v * W, 0), W);  // lanes of vector v before the window
    rh[v] = std::min<int64_t>(std::max<int64_t>(vis - v * W, 0), W);  // lanes of vector v up to the position
    x[v] = first_lanes(splat(-INFINITY), rl[v], first_lanes(load(s + v * W), rh[v], splat(-INFINITY)));
    mx = vmax(mx, x[v]);
  }
  const float bm = std::max(m, hmax(mx));  // finite: key lo is visible
  const float c = exp_f32(m - bm);
  vf sum = vf{};
  for (int v = 0; v < V; ++v) {
    const vf e = first_lanes(vf{}, rl[v], first_lanes(exp_v(x[v] - bm), rh[v], vf{}));
    store(s + v * W, e);
    sum += e;
  }
  l = l * c + hsum(sum);
  m = bm;
  return c;
}

struct Task {
  int64_t req, t0, kh, work;
};

// rows [R, D] (scaled queries) x Kt [D, KB] -> S [R, KB], RB rows at a time (RB x 4 accumulators).
template <int NV, int RB>
void scores(const float* qs, int64_t R, const float* kt, float* s, int64_t D) {
  int64_t r = 0;
  for (; r + RB <= R; r += RB) {
    vf acc[RB][KV_VECS];
    for (int i = 0; i < RB; ++i)
      for (int v = 0; v < KV_VECS; ++v) acc[i][v] = vf{};
    for (int64_t d = 0; d < D; ++d) {
      vf kv[KV_VECS];
      for (int v = 0; v < KV_VECS; ++v) kv[v] = load(kt + d * KB + v * W);
      for (int i = 0; i < RB; ++i) {
        const vf qd = splat(qs[(r + i) * D + d]);
        for (int v = 0; v < KV_VECS; ++v) acc[i][v] += qd * kv[v];
      }
    }
    for (int i = 0; i < RB; ++i)
      for (int v = 0; v < KV_VECS; ++v) store(s + (r + i) * KB + v * W, acc[i][v]);
  }
  for (; r < R; ++r) scores<NV, 1>(qs + r * D, 1, kt, s + r * KB, D);
}

// O [R, D] += P [R, KB] x Vb [KB, D] over the first nk keys (P is zero past each row's visible keys).
template <int NV, int RB>
void pv(const float* p, int64_t R, const float* vb, int64_t nk, float* o, int64_t D) {
  const int64_t nv = NV > 0 ? NV : D / W;
  int64_t r = 0;
  for (; r + RB <= R; r += RB) {
    if constexpr (NV > 0) {
      vf acc[RB][NV];
      for (int i = 0; i < RB; ++i)
        for (int v = 0; v < NV; ++v) acc[i][v] = load(o + (r + i) * D + v * W);
      for (int64_t j = 0; j < nk; ++j) {
        vf vv[NV];
        for (int v = 0; v < NV; ++v) vv[v] = load(vb + j * D + v * W);
        for (int i = 0; i < RB; ++i) {
          const vf pj = splat(p[(r + i) * KB + j]);
          for (int v = 0; v < NV; ++v) acc[i][v] += pj * vv[v];
        }
      }
      for (int i = 0; i < RB; ++i)
        for (int v = 0; v < NV; ++v) store(o + (r + i) * D + v * W, acc[i][v]);
    } else {  // head_dim read at run time: one row, one vector at a time
      for (int i = 0; i < RB; ++i)
        for (int64_t v = 0; v < nv; ++v) {
          vf a = load(o + (r + i) * D + v * W);
          for (int64_t j = 0; j < nk; ++j) a += splat(p[(r + i) * KB + j]) * load(vb + j * D + v * W);
          store(o + (r + i) * D + v * W, a);
        }
    }
  }
  for (; r < R; ++r) pv<NV, 1>(p + r * KB, 1, vb, nk, o + r * D, D);
}

template <typename KV, int NV>
bool run_task(const Args& a, const Task& t) {
  constexpr int RB = NV == 4 ? 6 : NV == 8 ? 3 : 1;  // 24 accumulators (+ 4 or 8 loaded vectors) of 32 zmm
  const int64_t D = a.D, G = a.H / a.Hkv, i = t.req, kh = t.kh;
  const int64_t nq = std::min(QB, a.ext[i] - t.t0), R = nq * G, q_first = a.prefix[i] + t.t0;
  const int64_t n_keys = q_first + nq;  // the last row sees keys [0, n_keys) (or its window of them)
  const int32_t* slots = a.r2t + a.rows[i] * a.r2t_stride;
  const KV* kc = static_cast<const KV*>(a.k);
  const KV* vc = static_cast<const KV*>(a.v);
  thread_local std::vector<float> buf;
  const size_t need = (size_t)(R * D * 2 + D * KB + KB * D + R * KB + 2 * R);
  if (buf.size() < need) buf.resize(need);
  float* qs = buf.data();    // [R, D] scaled queries, row t * G + g
  float* o = qs + R * D;     // [R, D]
  float* kt = o + R * D;     // [D, KB]
  float* vb = kt + D * KB;   // [KB, D]
  float* s = vb + KB * D;    // [R, KB]
  float* m = s + R * KB;     // [R]
  float* l = m + R;          // [R]
  for (int64_t tt = 0; tt < nq; ++tt)
    for (int64_t g = 0; g < G; ++g) {
      const float* src = a.q + (a.start[i] + t.t0 + tt) * a.q_row + (kh * G + g) * D;
      float* dst = qs + (tt * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * a.scale;
    }
  std::fill(o, o + R * D, 0.f);
  std::fill(m, m + R, -INFINITY);
  std::fill(l, l + R, 0.f);
  for (int64_t k0 = first_block(a, q_first); k0 < n_keys; k0 += KB) {
    const int64_t nk = std::min(KB, n_keys - k0);
    for (int64_t j = 0; j < nk; ++j) {  // K transposed and V converted, once per block
      const int64_t slot = slots[k0 + j];
      if (slot < 0 || slot >= a.num_slots) return false;
      const KV* kr = kc + slot * a.kv_row + kh * D;
      const KV* vr = vc + slot * a.kv_row + kh * D;
      for (int64_t v = 0; v < D / W; ++v) {  // one K row -> column j of Kt
        const vf x = load(kr + v * W);
        for (int64_t e = 0; e < W; ++e) kt[(v * W + e) * KB + j] = x[e];
      }
      for (int64_t v = 0; v < D / W; ++v) store(vb + j * D + v * W, load(vr + v * W));
    }
    for (int64_t j = nk; j < KB; ++j)
      for (int64_t d = 0; d < D; ++d) kt[d * KB + j] = 0.f;  // padding columns: scored, never used
    scores<NV, RB>(qs, R, kt, s, D);
    if (a.softcap > 0.f) {  // Gemma 2: capped before the max is taken
      const float cap = a.softcap, inv = 1.0f / a.softcap;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < nk; ++j) s[r * KB + j] = std::tanh(s[r * KB + j] * inv) * cap;
    }
    for (int64_t r = 0; r < R; ++r) {  // online softmax over the keys this row sees
      // keys of this block the row sees; 0 when the block starts past its position (block 0 always gives every
      // row a finite max, so c = 1 and the row's state is kept)
      const int64_t vis = std::max<int64_t>(0, std::min(nk, q_first + r / G + 1 - k0));
      // with a window, the row's first key in this block (<= 0: the whole block up to vis); a block before the
      // window leaves the row's state as it is (c = 1, weights 0), a block that holds its start takes [lo, vis)
      const int64_t lo = a.window > 0 ? q_first + r / G - a.window + 1 - k0 : 0;
      float c = 1.f;
      if (lo <= 0) {
        c = softmax_block(s + r * KB, vis, m[r], l[r]);
      } else if (lo >= vis) {
        std::fill(s + r * KB, s + r * KB + KB, 0.f);
      } else {
        c = softmax_range(s + r * KB, lo, vis, m[r], l[r]);
      }
      float* orow = o + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) orow[d] *= c;
    }
    pv<NV, RB>(s, R, vb, nk, o, D);
  }
  for (int64_t tt = 0; tt < nq; ++tt)
    for (int64_t g = 0; g < G; ++g) {
      const float* src = o + (tt * G + g) * D;
      const float inv = 1.0f / l[tt * G + g];
      float* dst = a.out + ((a.start[i] + t.t0 + tt) * a.H + kh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * inv;
    }
  return true;
}

template <typename KV>
bool run_any(const Args& a, const Task& t) {
  switch (a.D) {
    case 64: return run_task<KV, 4>(a, t);
    case 128: return run_task<KV, 8>(a, t);
    default: return run_task<KV, 0>(a, t);
  }
}

enum Problem : int64_t { BAD_SLOT = 0, BAD_LEN = 1, BAD_ROW = 2 };  // decoded by kernels/extend_attention_cpu.py

template <typename KV>
int64_t run(const Args& a, int64_t b, int32_t nthreads) {
  std::vector<Task> tasks;
  for (int64_t i = 0; i < b; ++i) {
    if (a.rows[i] < 0 || a.rows[i] >= a.r2t_rows) return 1 + 4 * i + BAD_ROW;
    if (a.prefix[i] < 0 || a.ext[i] < 0 || a.prefix[i] + a.ext[i] > a.r2t_stride) return 1 + 4 * i + BAD_LEN;
    for (int64_t t0 = 0; t0 < a.ext[i]; t0 += QB)
      for (int64_t kh = 0; kh < a.Hkv; ++kh)
        tasks.push_back({i, t0, kh, a.prefix[i] + t0 + QB - first_block(a, a.prefix[i] + t0)});
  }
  // most keys first: the long tail of a causal prompt does not end up alone on one thread
  std::sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.work > y.work; });
  const int64_t T = (int64_t)tasks.size();
  int64_t bad = INT64_MAX;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (T > 1 && nthreads > 1)
  for (int64_t t = 0; t < T; ++t) {
    if (!run_any<KV>(a, tasks[t])) {
#pragma omp critical(sglpy_extend_bad)
      bad = std::min(bad, tasks[t].req);
    }
  }
  return bad == INT64_MAX ? 0 : 1 + 4 * bad + BAD_SLOT;
}

}  // namespace
}  // namespace sglpy

// q float32 [n, heads, head_dim] (token rows q_row elements apart), out float32 [n, heads, head_dim]; request i's
// tokens are q rows start[i] .. start[i] + ext[i], at positions prefix[i] .. prefix[i] + ext[i], their K/V already
// stored. window > 0: a query at position p sees keys (p - window, p]; softcap > 0: scores -> tanh(s / cap) * cap.
// Returns 0, -1 for an unknown kv_dtype, or 1 + 4 * i + problem for the first bad request i (BAD_SLOT: a slot id
// out of range among its keys; BAD_LEN: prefix + ext outside [0, r2t_stride]; BAD_ROW: rows[i] out of range).
extern "C" int64_t sglpy_extend_attention_windowed(const float* q, int64_t q_row, const void* k_cache,
                                                   const void* v_cache, int32_t kv_dtype, int64_t num_slots,
                                                   int64_t kv_row, const int32_t* req_to_token, int64_t r2t_rows,
                                                   int64_t r2t_stride, const int64_t* rows, const int64_t* prefix,
                                                   const int64_t* ext, const int64_t* start, float* out, int64_t b,
                                                   int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                                                   int64_t window, float softcap, int32_t nthreads) {
  using namespace sglpy;
  const Args a{q, q_row, k_cache, v_cache, num_slots, kv_row, req_to_token, r2t_rows, r2t_stride, rows, prefix,
               ext, start, out, heads, kv_heads, head_dim, scale, std::max<int64_t>(window, 0),
               std::max(softcap, 0.f)};
  switch (kv_dtype) {
    case F32: return run<float>(a, b, nthreads);
    case BF16: return run<bf16_t>(a, b, nthreads);
    case F16: return run<f16_t>(a, b, nthreads);
    default: return -1;
  }
}

// sglpy_extend_attention_windowed without a window or a soft-cap (full causal attention).
extern "C" int64_t sglpy_extend_attention(const float* q, int64_t q_row, const void* k_cache, const void* v_cache,
                                          int32_t kv_dtype, int64_t num_slots, int64_t kv_row,
                                          const int32_t* req_to_token, int64_t r2t_rows, int64_t r2t_stride,
                                          const int64_t* rows, const int64_t* prefix, const int64_t* ext,
                                          const int64_t* start, float* out, int64_t b, int64_t heads,
                                          int64_t kv_heads, int64_t head_dim, float scale, int32_t nthreads) {
  return sglpy_extend_attention_windowed(q, q_row, k_cache, v_cache, kv_dtype, num_slots, kv_row, req_to_token,
                                         r2t_rows, r2t_stride, rows, prefix, ext, start, out, b, heads, kv_heads,
                                         head_dim, scale, 0, 0.f, nthreads);
}
