// Row-wise selection over a batch of logits, one pass over each row (the sampler's CPU hot spots):
//   sglpy_argmax_rows   the first maximum of each row, NaN counting as the largest   oracle: torch.argmax
//   sglpy_topk_rows     the k largest of each row, descending (NaN first; equal values by ascending column)
//                                                   oracle: kernels/select_cpu.py:topk_rows_reference (torch.topk)
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

// The largest of the W lanes (no NaN among them).
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
static inline float hmax(vf m) {  // halves folded together (no shuffle builtin: g++ and clang++ spell it apart)
  vf8 a, b;
  std::memcpy(&a, &m, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&m) + sizeof a, sizeof b);
  a = a > b ? a : b;
  vf4 c, d;
  std::memcpy(&c, &a, sizeof c);
  std::memcpy(&d, reinterpret_cast<const char*>(&a) + sizeof c, sizeof d);
  c = c > d ? c : d;
  return std::max(std::max(c[0], c[1]), std::max(c[2], c[3]));
}

// The first maximum of x[0, n): one vectorized max pass (the row then sits in L2), then the first column equal to
// it; a row holding a NaN answers its first NaN (torch.argmax's rule).
int64_t argmax_row(const float* x, int64_t n) {
  int64_t j = 0;
  float best = -INFINITY;
  bool nan = false;
  if (n >= 4 * W) {  // four accumulators: the max chain never waits on the previous block
    vf m0 = load(x), m1 = load(x + W), m2 = load(x + 2 * W), m3 = load(x + 3 * W);
    vi bad = (m0 != m0) | (m1 != m1) | (m2 != m2) | (m3 != m3);
    for (j = 4 * W; j + 4 * W <= n; j += 4 * W) {
      const vf a = load(x + j), b = load(x + j + W), c = load(x + j + 2 * W), d = load(x + j + 3 * W);
      m0 = a > m0 ? a : m0;
      m1 = b > m1 ? b : m1;
      m2 = c > m2 ? c : m2;
      m3 = d > m3 ? d : m3;
      bad |= (a != a) | (b != b) | (c != c) | (d != d);
    }
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    m0 = m2 > m0 ? m2 : m0;
    for (int l = 0; l < W; ++l) {
      best = std::max(best, m0[l]);
      nan |= bad[l] != 0;
    }
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

// The same by two passes: the maxima of blocks of BLOCK columns (one vectorized pass), T = the k-th largest of them
// (k distinct columns are >= T, so every one of the k best is >= T and lies in a block whose maximum is >= T), then
// the columns >= T of those blocks (from cache) are the candidates, ordered by `before`.
void topk_row(const float* x, int64_t n, int64_t k, std::vector<float>& bm, std::vector<float>& scratch,
              std::vector<Item>& c, float* vals, int64_t* idx) {
  const int64_t nb = (n + BLOCK - 1) / BLOCK;
  bm.resize(nb);
  vi bad{};
  int64_t b = 0;
  for (; (b + 1) * BLOCK <= n; ++b) {
    const float* p = x + b * BLOCK;
    vf m = load(p);
    bad |= (m != m);
    for (int64_t j = W; j < BLOCK; j += W) {
      const vf v = load(p + j);
      m = v > m ? v : m;
      bad |= (v != v);
    }
    bm[b] = hmax(m);
  }
  bool nan = false;
  for (int l = 0; l < W; ++l) nan |= bad[l] != 0;
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
    topk_row(x + r * stride, vocab, k, bm, scratch, c, vals + r * k, idx + r * k);
  });
  return 0;
}
