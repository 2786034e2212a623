// Segmented LoRA for a few rows (decode steps), float32:            oracle: kernels/lora.py:lora_delta_reference
//   sglpy_lora_delta   y[rows[i]] += per output slice s: B_s (A_s x[rows[i]]), with A_s, B_s the slot's weights
// Segment k holds rows[indptr[k] .. indptr[k + 1]) and uses pool slot slots[k] of rank ranks[k] (<= pool_rank).
// A: [slots, n_slices * pool_rank, n_in], B: [slots, out, pool_rank] (contiguous per slot), y's slice s is the
// columns offsets[s] .. offsets[s + 1]. Each row writes only its own y row.
#include <vector>

#include "cpu_common.h"

namespace sglpy {
namespace {

constexpr int64_t LORA_PARALLEL_ROWS = 2;  // fewer rows run on the calling thread

}  // namespace
}  // namespace sglpy

using namespace sglpy;

extern "C" int64_t sglpy_lora_delta(const float* x, int64_t x_stride, float* y, int64_t y_stride, const float* a,
                                    const float* b, int64_t n_in, int64_t pool_rank, int64_t n_slices,
                                    const int64_t* offsets, const int64_t* rows, const int64_t* indptr,
                                    const int64_t* slots, const int64_t* ranks, int64_t n_seg, int64_t num_slots,
                                    int64_t num_rows, int32_t nthreads) {
  if (n_seg < 1 || n_slices < 1 || pool_rank < 1) return -1;
  const int64_t n = indptr[n_seg];
  std::vector<int64_t> seg_of(n);
  for (int64_t k = 0; k < n_seg; ++k) {
    if (indptr[k] > indptr[k + 1] || slots[k] < 0 || slots[k] >= num_slots || ranks[k] < 0 || ranks[k] > pool_rank)
      return -1;
    for (int64_t i = indptr[k]; i < indptr[k + 1]; ++i) seg_of[i] = k;
  }
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= num_rows) return -1;
  const int64_t n_out = offsets[n_slices];
  const int64_t a_slot = n_slices * pool_rank * n_in, b_slot = n_out * pool_rank;
  // One segment's rows read its adapter's A and B once (decode: 1-4 rows per adapter, the weights dominate the
  // traffic): segments split across threads, or a lone segment's rows do.
  const bool by_seg = n_seg >= 2;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && n >= LORA_PARALLEL_ROWS)
  {
    std::vector<float> h;
#pragma omp for schedule(dynamic)
    for (int64_t u = 0; u < (by_seg ? n_seg : n); ++u) {
      const int64_t k = by_seg ? u : seg_of[u], r = ranks[k];
      const int64_t lo = by_seg ? indptr[k] : u, hi = by_seg ? indptr[k + 1] : u + 1, m = hi - lo;
      const float* as = a + slots[k] * a_slot;
      const float* bs = b + slots[k] * b_slot;
      h.assign(m * n_slices * pool_rank, 0.0f);
      for (int64_t s = 0; s < n_slices; ++s)  // shrink: h_s = A_s x (the first r rows of the slice's pool_rank)
        for (int64_t j = 0; j < r; ++j) {
          const float* ar = as + (s * pool_rank + j) * n_in;
          for (int64_t i = 0; i < m; ++i)
            h[(i * n_slices + s) * pool_rank + j] = dot_n(x + rows[lo + i] * x_stride, ar, n_in);
        }
      for (int64_t s = 0; s < n_slices; ++s)  // expand: y_s += B_s h_s
        for (int64_t o = offsets[s]; o < offsets[s + 1]; ++o) {
          const float* br = bs + o * pool_rank;
          for (int64_t i = 0; i < m; ++i)
            y[rows[lo + i] * y_stride + o] += dot_n(h.data() + (i * n_slices + s) * pool_rank, br, r);
        }
    }
  }
  return 0;
}
