// Row-wise selection over a batch of logits, one pass over each row (the sampler's CPU hot spots):
//   sglpy_argmax_rows   the first maximum of each row, NaN counting as the largest   oracle: torch.argmax
//   sglpy_topk_rows     the k largest of each row, descending (NaN first; equal values by ascending column)
//                                                   oracle: kernels/select_cpu.py:topk_rows_reference (torch.topk)
//   sglpy_sample_rows   inverse-CDF draw from candidate weights with top-p / min-p cuts, as the sampler's torch ops
//                                                   oracle: kernels/select_cpu.py:sample_rows_reference
// float32 rows of `vocab` columns, `stride` floats apart. Rows are independent, so several rows split across threads.
#include <functional>
#include <vector>

#include "cpu_common.h"

namespace sglpy {
namespace {

constexpr int64_t SELECT_PARALLEL_ROWS = 4;  // fewer rows run on the calling thread (a parallel region costs more)

template <typename F>
void each_row(int64_t n, int32_t nthreads, F f) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && n >= SELECT_PARALLEL_ROWS)
  for (int64_t r = 0; r < n; ++r) f(r);
}

// Does any of the W floats at p beat thr (larger, or NaN)? / equal val? One compare and a mask test per block.
static inline bool any_above(const float* p, float thr) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(p), _mm512_set1_ps(thr), _CMP_NLE_UQ) != 0;
#elif defined(__AVX2__)
  const __m256 t = _mm256_set1_ps(thr);
  return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), t, _CMP_NLE_UQ),
                                         _mm256_cmp_ps(_mm256_loadu_ps(p + 8), t, _CMP_NLE_UQ))) != 0;
#else
  bool any = false;
  for (int l = 0; l < W; ++l) any |= !(p[l] <= thr);
  return any;
#endif
}
static inline bool any_equal(const float* p, float val) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(p), _mm512_set1_ps(val), _CMP_EQ_OQ) != 0;
#elif defined(__AVX2__)
  const __m256 t = _mm256_set1_ps(val);
  return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), t, _CMP_EQ_OQ),
                                         _mm256_cmp_ps(_mm256_loadu_ps(p + 8), t, _CMP_EQ_OQ))) != 0;
#else
  bool any = false;
  for (int l = 0; l < W; ++l) any |= p[l] == val;
  return any;
#endif
}

// Native-width vectors (cpu_common.h, NW): GCC 12 compiles a select or a compare on 16-float vectors wider than the
// target's registers lane by lane (AVX2, SSE2), so the passes below keep one register per accumulator.
typedef int32_t vni __attribute__((vector_size(NW * 4)));
static inline vn maxn(vn a, vn b) { return a > b ? a : b; }  // b where a is NaN (a NaN is tracked apart)
static inline bool any_lane(vni m) {
  bool any = false;
  for (int l = 0; l < NW; ++l) any |= m[l] != 0;
  return any;
}
static inline float hmaxn(vn m) {  // the largest lane (no NaN among them)
  float r = m[0];
  for (int l = 1; l < NW; ++l) r = std::max(r, m[l]);
  return r;
}

// The first maximum of x[0, n): one vectorized max pass (the row then sits in L2), then the first column equal to
// it; a row holding a NaN answers its first NaN (torch.argmax's rule). The maximum is exact in any order (and -0
// equals +0 in the second pass), so the answer does not depend on the vector width.
int64_t argmax_row(const float* x, int64_t n) {
  int64_t j = 0;
  float best = -INFINITY;
  bool nan = false;
  if (n >= 4 * NW) {  // four accumulators: the max chain never waits on the previous block
    vn m0 = loadn(x), m1 = loadn(x + NW), m2 = loadn(x + 2 * NW), m3 = loadn(x + 3 * NW);
    vni bad = (m0 != m0) | (m1 != m1) | (m2 != m2) | (m3 != m3);
    for (j = 4 * NW; j + 4 * NW <= n; j += 4 * NW) {
      const vn a = loadn(x + j), b = loadn(x + j + NW), c = loadn(x + j + 2 * NW), d = loadn(x + j + 3 * NW);
      m0 = maxn(a, m0);
      m1 = maxn(b, m1);
      m2 = maxn(c, m2);
      m3 = maxn(d, m3);
      bad |= (a != a) | (b != b) | (c != c) | (d != d);
    }
    best = hmaxn(maxn(maxn(m1, m0), maxn(m3, m2)));
    nan = any_lane(bad);
  }
  for (; j < n; ++j) {
    nan |= x[j] != x[j];
    best = std::max(best, x[j]);
  }
  if (nan) {
    for (int64_t i = 0; i < n; ++i)
      if (x[i] != x[i]) return i;
  }
  int64_t i = 0;
  for (; i + W <= n; i += W)
    if (any_equal(x + i, best)) break;
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // all -inf: the first column (the loop above returns it for any finite or -inf maximum)
}

struct Item {
  float v;
  int64_t i;
};

// a comes before b in the output: larger value (NaN largest), then the smaller column
static inline bool before(const Item& a, const Item& b) {
  const bool an = a.v != a.v, bn = b.v != b.v;
  if (an || bn) return an && (!bn || a.i < b.i);
  if (a.v != b.v) return a.v > b.v;
  return a.i < b.i;
}

// heap with the item that comes last at its root
static void sift_down(Item* h, int64_t k, int64_t p) {
  for (;;) {
    int64_t c = 2 * p + 1;
    if (c >= k) return;
    if (c + 1 < k && before(h[c], h[c + 1])) ++c;  // the child that comes later
    if (!before(h[p], h[c])) return;
    std::swap(h[p], h[c]);
    p = c;
  }
}

// The k best of x[0, n) (k <= n) into vals/idx, in output order, by a heap (the NaN path): it holds the k best so
// far; a later column enters only when it beats the root (strictly larger, or a NaN over a number: an equal value
// has the larger column).
void topk_heap(const float* x, int64_t n, int64_t k, std::vector<Item>& h, float* vals, int64_t* idx) {
  h.resize(k);
  for (int64_t j = 0; j < k; ++j) h[j] = Item{x[j], j};
  for (int64_t p = k / 2 - 1; p >= 0; --p) sift_down(h.data(), k, p);
  for (int64_t j = k; j < n && h[0].v == h[0].v; ++j) {  // a NaN root: no later column can enter
    const Item it{x[j], j};
    if (before(it, h[0])) {
      h[0] = it;
      sift_down(h.data(), k, 0);
    }
  }
  std::sort(h.begin(), h.end(), before);
  for (int64_t t = 0; t < k; ++t) {
    vals[t] = h[t].v;
    idx[t] = h[t].i;
  }
}

constexpr int64_t BLOCK = 64;  // columns per block of the first pass
constexpr int64_t RUNNING_RATIO = 16;  // topk_row_running for rows at least this many times k

// The same by two passes: the maxima of blocks of BLOCK columns (one vectorized pass), T = the k-th largest of them
// (k distinct columns are >= T, so every one of the k best is >= T and lies in a block whose maximum is >= T), then
// the columns >= T of those blocks (from cache) are the candidates, ordered by `before`.
void topk_row(const float* x, int64_t n, int64_t k, std::vector<float>& bm, std::vector<float>& scratch,
              std::vector<Item>& c, float* vals, int64_t* idx) {
  const int64_t nb = (n + BLOCK - 1) / BLOCK;
  bm.resize(nb);
  vni bad{};
  int64_t b = 0;
  for (; (b + 1) * BLOCK <= n; ++b) {
    const float* p = x + b * BLOCK;
    vn m = loadn(p);
    bad |= (m != m);
    for (int64_t j = NW; j < BLOCK; j += NW) {
      const vn v = loadn(p + j);
      m = maxn(v, m);
      bad |= (v != v);
    }
    bm[b] = hmaxn(m);
  }
  bool nan = any_lane(bad);
  if (b < nb) {  // the last, shorter block
    float best = -INFINITY;
    for (int64_t j = b * BLOCK; j < n; ++j) {
      nan |= x[j] != x[j];
      best = std::max(best, x[j]);
    }
    bm[b] = best;
  }
  if (nan) {
    topk_heap(x, n, k, c, vals, idx);
    return;
  }
  float thr = -INFINITY;  // fewer blocks than k: every column is a candidate
  if (k <= nb) {
    std::vector<float>& t = scratch;
    t.assign(bm.begin(), bm.end());
    std::nth_element(t.begin(), t.begin() + (k - 1), t.end(), std::greater<float>());
    thr = t[k - 1];
  }
  c.clear();
  for (b = 0; b < nb; ++b) {
    if (!(bm[b] >= thr)) continue;
    const int64_t hi = std::min(n, (b + 1) * BLOCK);
    for (int64_t j = b * BLOCK; j < hi; ++j)
      if (x[j] >= thr) c.push_back(Item{x[j], j});
  }
  std::partial_sort(c.begin(), c.begin() + k, c.end(), before);
  for (int64_t t = 0; t < k; ++t) {
    vals[t] = c[t].v;
    idx[t] = c[t].i;
  }
}

// The same for k much smaller than the row (topk_row_running), in two passes with no per-block horizontal reduction:
// pass 1 keeps the lane-wise maxima of a few registers of accumulators over the row (distinct columns each), and its
// floor F is the k-th largest of those maxima: k columns are >= F, so every one of the k best is >= F. Pass 2 (the
// row now in L2) appends, in column order, each column >= F (and any NaN: the compare is unordered) to a buffer; a
// block of BLOCK columns with none costs four compares. Should the buffer fill, it keeps its k best (ties by the
// smaller column) and the threshold rises to the k-th best value: a later column equal to it comes after k kept
// ones, so from then on only columns above it enter. A row with fewer than k columns above -inf takes its first
// -inf columns. A NaN anywhere, or a row too short to pay, goes to topk_row.
static inline bool has_nan(const float* v, int64_t n) {
  vni bad{};
  int64_t i = 0;
  for (; i + NW <= n; i += NW) {
    const vn a = loadn(v + i);
    bad |= a != a;
  }
  bool nan = any_lane(bad);
  for (; i < n; ++i) nan |= v[i] != v[i];
  return nan;
}

struct RunBuf {
  std::vector<float> v, scratch;
  std::vector<int32_t> i;
  std::vector<uint64_t> key;
};

// Keep the k best of the buffer's cnt entries (k <= cnt, no NaN), in their order; the k-th best value.
static float run_compact(RunBuf& b, int64_t& cnt, int64_t k) {
  b.scratch.assign(b.v.begin(), b.v.begin() + cnt);
  std::nth_element(b.scratch.begin(), b.scratch.begin() + (k - 1), b.scratch.end(), std::greater<float>());
  const float thr = b.scratch[k - 1];
  int64_t above = 0;  // fewer than k are above the k-th best value; ties at it fill up to k, first columns first
  for (int64_t t = 0; t < cnt; ++t) above += b.v[t] > thr;
  int64_t ties = k - above, m = 0;
  for (int64_t t = 0; t < cnt; ++t) {
    const float v = b.v[t];
    if (v > thr || (v == thr && ties-- > 0)) {
      b.v[m] = v;
      b.i[m] = b.i[t];
      ++m;
    }
  }
  cnt = m;
  return thr;
}

constexpr int64_t LANES_PER_K = 2;  // pass 1 keeps about this many maxima per k (more: a higher k-th best maximum)

// Pass 1 into m[0, A * NW): the lane-wise maxima of A one-register accumulators over x[0, n) (n >= A * NW), each lane
// the maximum of distinct columns (the last n % (A * NW) columns are in none: pass 2 still sees them).
template <int A>
static void lane_max(const float* x, int64_t n, float* m) {
  vn acc[A];
  for (int t = 0; t < A; ++t) acc[t] = loadn(x + t * NW);
  for (int64_t j = A * NW; j + A * NW <= n; j += A * NW)
    for (int t = 0; t < A; ++t) {
      const vn v = loadn(x + j + t * NW);
      acc[t] = maxn(v, acc[t]);
    }
  for (int t = 0; t < A; ++t) storen(m + t * NW, acc[t]);
}

constexpr int MAX_ACC = NW == 16 ? 16 : 8;  // accumulators kept in registers (16 zmm of 32; 8 ymm or xmm of 16)

// The k-th largest of about LANES_PER_K * k lane maxima of x[0, n) (n >= 16 * k): up to MAX_ACC registers of
// accumulators over the row, more as MAX_ACC per segment of it. NaN when a lane met a NaN first, or the row is too
// short to pay (the caller takes the two-pass path).
static float lane_max_floor(const float* x, int64_t n, int64_t k, std::vector<float>& scratch) {
  const int64_t want = LANES_PER_K * k;
  const int a = want <= 4 * NW ? 4 : (want <= 8 * NW || MAX_ACC == 8) ? 8 : 16;
  const int64_t segments = (want + MAX_ACC * NW - 1) / (MAX_ACC * NW);
  const int64_t seg = n / segments / (a * NW) * (a * NW);  // columns per segment, whole steps of the accumulators
  if (seg < 4 * a * NW) return NAN;
  const int64_t lanes = segments * a * NW;
  scratch.resize(lanes);
  float* const m = scratch.data();
  for (int64_t s = 0; s < segments; ++s) {
    const float* xs = x + s * seg;
    const int64_t len = s + 1 < segments ? seg : n - s * seg;
    if (a == 4) lane_max<4>(xs, len, m + s * a * NW);
    else if (a == 8) lane_max<8>(xs, len, m + s * a * NW);
    else lane_max<MAX_ACC>(xs, len, m + s * a * NW);
  }
  if (has_nan(m, lanes)) return NAN;
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
  return scratch[k - 1];
}

// topk_row by the passes above; false (nothing written) for a row with a NaN or too short a row.
__attribute__((noinline)) bool topk_row_running(const float* x, int64_t n, int64_t k, RunBuf& b, float* vals,
                                                int64_t* idx) {
  const int64_t cap = std::max<int64_t>(512, 4 * k);
  b.v.resize(cap + BLOCK);
  b.i.resize(cap + BLOCK);
  const float floor = lane_max_floor(x, n, k, b.scratch);
  if (floor != floor) return false;
  // until the buffer first fills, columns equal to the floor enter too (x > thr: x >= floor); -inf stays out
  float thr = std::nextafter(floor, -INFINITY);
  float* const bv = b.v.data();  // the loop below reaches the buffer through locals only
  int32_t* const bi = b.i.data();
  int64_t cnt = 0, j = 0;
#if defined(__AVX512F__)
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  auto take = [&](__m512 v, __mmask16 m, int64_t col) {  // compress in a register, then store (the memory form is
                                                          // microcoded on some CPUs)
    _mm512_storeu_ps(bv + cnt, _mm512_maskz_compress_ps(m, v));
    _mm512_storeu_si512(bi + cnt,
                        _mm512_maskz_compress_epi32(m, _mm512_add_epi32(iota, _mm512_set1_epi32(int32_t(col)))));
    cnt += __builtin_popcount(m);
  };
  for (; j + BLOCK <= n; j += BLOCK) {
    const __m512 t = _mm512_set1_ps(thr);
    const __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16), v2 = _mm512_loadu_ps(x + j + 32),
                 v3 = _mm512_loadu_ps(x + j + 48);
    const __mmask16 m0 = _mm512_cmp_ps_mask(v0, t, _CMP_NLE_UQ), m1 = _mm512_cmp_ps_mask(v1, t, _CMP_NLE_UQ),
                    m2 = _mm512_cmp_ps_mask(v2, t, _CMP_NLE_UQ), m3 = _mm512_cmp_ps_mask(v3, t, _CMP_NLE_UQ);
    if ((m0 | m1 | m2 | m3) == 0) continue;
    if (m0) take(v0, m0, j);
    if (m1) take(v1, m1, j + 16);
    if (m2) take(v2, m2, j + 32);
    if (m3) take(v3, m3, j + 48);
    if (cnt > cap) {
      if (has_nan(bv, cnt)) return false;
      thr = run_compact(b, cnt, k);
    }
  }
#else
  for (; j + W <= n; j += W) {
    if (!any_above(x + j, thr)) continue;
    for (int64_t l = j; l < j + W; ++l)
      if (!(x[l] <= thr)) {
        bv[cnt] = x[l];
        bi[cnt++] = static_cast<int32_t>(l);
      }
    if (cnt > cap) {
      if (has_nan(bv, cnt)) return false;
      thr = run_compact(b, cnt, k);
    }
  }
#endif
  for (; j < n; ++j) {
    if (!(x[j] <= thr)) {
      bv[cnt] = x[j];
      bi[cnt++] = static_cast<int32_t>(j);
      if (cnt > cap) {
        if (has_nan(bv, cnt)) return false;
        thr = run_compact(b, cnt, k);
      }
    }
  }
  if (has_nan(bv, cnt)) return false;
  for (int64_t t = 0; cnt < k; ++t)  // fewer than k columns >= T (T is -inf): the first columns equal to it
    if (x[t] == floor) {
      bv[cnt] = x[t];
      bi[cnt++] = static_cast<int32_t>(t);
    }
  if (cnt > k) run_compact(b, cnt, k);
  // no NaN: larger value first, then the smaller column, as one ascending integer key per entry (no branchy
  // two-field compare): the float's order-preserving bits inverted above the column
  std::vector<uint64_t>& key = b.key;
  key.resize(k);
  for (int64_t t = 0; t < k; ++t) {
    uint32_t u;
    const float v = bv[t] + 0.0f;  // -0 becomes +0: equal floats, one key
    std::memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending with the float
    key[t] = (uint64_t(~u) << 32) | uint32_t(bi[t]);
  }
  std::sort(key.begin(), key.end());
  for (int64_t t = 0; t < k; ++t) {
    const int32_t col = int32_t(key[t] & 0xffffffffu);
    vals[t] = x[col];
    idx[t] = col;
  }
  return true;
}

}  // namespace
}  // namespace sglpy

using namespace sglpy;

// x: float32 [n, vocab], rows `stride` floats apart; out: int64 [n].
extern "C" int64_t sglpy_argmax_rows(const float* x, int64_t n, int64_t vocab, int64_t stride, int64_t* out,
                                     int32_t nthreads) {
  if (vocab < 1) return -1;
  each_row(n, nthreads, [&](int64_t r) { out[r] = argmax_row(x + r * stride, vocab); });
  return 0;
}

// x: float32 [n, vocab], rows `stride` floats apart; vals float32 [n, k], idx int64 [n, k] (1 <= k <= vocab).
extern "C" int64_t sglpy_topk_rows(const float* x, int64_t n, int64_t vocab, int64_t stride, int64_t k, float* vals,
                                   int64_t* idx, int32_t nthreads) {
  if (k < 1 || k > vocab) return -1;
  each_row(n, nthreads, [&](int64_t r) {
    thread_local std::vector<float> bm, scratch;
    thread_local std::vector<Item> c;
    thread_local RunBuf run;
    const float* row = x + r * stride;
    if (k * RUNNING_RATIO <= vocab && vocab <= INT32_MAX && topk_row_running(row, vocab, k, run, vals + r * k,
                                                                             idx + r * k))
      return;
    topk_row(row, vocab, k, bm, scratch, c, vals + r * k, idx + r * k);
  });
  return 0;
}

// w: float32 [n, k] candidate weights (descending candidates, w[0] the best's 1.0 or 0 where cut by top-k); top_p,
// min_p (either may be null: no such rule), u: float32 [n]; out: int64 [n] the drawn candidate position. The torch
// ops it replaces, in float32 with torch's CPU cumsum (a double running sum, each entry rounded to float):
//   cum = cumsum(w); limit = top_p < 1 ? top_p * cum[k-1] : inf; w[j] = 0 where cum[j] - w[j] > limit;
//   w[j] = 0 where w[j] < min_p; cdf = cumsum(w); out = min(#{j: cdf[j] <= u * cdf[k-1]}, k - 1).
// Returns -1 when a row holds a NaN (nothing written for it; the caller takes the torch ops).
extern "C" int64_t sglpy_sample_rows(const float* w, int64_t n, int64_t k, const float* top_p, const float* min_p,
                                     const float* u, int64_t* out) {
  if (k < 1) return -1;
  std::vector<float> cw(k);
  for (int64_t r = 0; r < n; ++r) {
    const float* x = w + r * k;
    for (int64_t j = 0; j < k; ++j)
      if (x[j] != x[j]) return -1;
    for (int64_t j = 0; j < k; ++j) cw[j] = x[j];
    if (top_p != nullptr) {
      double run = 0.0;
      std::vector<float>& cum = cw;  // cut in place: each entry's test reads its own cum and w only
      float mass = 0.0f;
      for (int64_t j = 0; j < k; ++j) mass = static_cast<float>(run += x[j]);
      const float limit = top_p[r] < 1.0f ? top_p[r] * mass : INFINITY;
      run = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const float c = static_cast<float>(run += x[j]);
        if (c - x[j] > limit) cum[j] = 0.0f;
      }
    }
    if (min_p != nullptr)
      for (int64_t j = 0; j < k; ++j)
        if (cw[j] < min_p[r]) cw[j] = 0.0f;
    double run = 0.0;
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) total = static_cast<float>(run += cw[j]);
    const float target = u[r] * total;
    run = 0.0;
    int64_t pick = 0;
    for (; pick < k; ++pick)
      if (static_cast<float>(run += cw[pick]) > target) break;
    out[r] = std::min(pick, k - 1);
  }
  return 0;
}
