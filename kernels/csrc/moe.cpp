// Mixture-of-experts feed-forward for a few rows (decode): each token's top-k experts, gate_up GEMV, silu * up,
// down GEMV, weighted by the router and summed, in one call (the Python loop cost ~10 torch ops per active expert).
//   sglpy_moe_experts   oracle: runtime/model/moe.py:moe_experts / moe_reference (kernels/moe_cpu.py wraps it)
// Pairs are grouped per expert so tokens sharing an expert read its weights once; experts run in ascending order
// and each adds weight * y to its tokens' rows, as moe_experts' index_add_ does (the same float32 operations, so
// the int8/int4 results equal the Python path's bit for bit: the GEMVs are quant_gemv.cpp's).
// Batch-invariant (deterministic inference, docs/determinism.md): the GEMVs and silu * up compute each row alone,
// and a token's output sums its own experts' terms in ascending expert order from zero, so its bits never depend
// on which other tokens share the call or how many there are.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

extern "C" int64_t sglpy_gemv_f32(const float* x, int64_t M, int64_t K, const float* w, const float* bias, float* y,
                                  int64_t N, int32_t nthreads);

// y * w is rounded before the add, as torch's multiply then index_add_ do: no fused multiply-add here
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

enum ExpertKind : int32_t { EXPERTS_F32 = 0, EXPERTS_INT8 = 1, EXPERTS_INT4 = 2 };

// y [M, N] = x [M, K] @ W^T for one expert's weight in `kind`'s layout (scales unused for float32)
void expert_gemv(int32_t kind, const float* x, int64_t M, int64_t K, const void* w, const void* s, float* y,
                 int64_t N, int32_t nthreads) {
  if (kind == EXPERTS_INT8)
    sglpy_gemv_int8(x, M, K, static_cast<const int8_t*>(w), static_cast<const float*>(s), nullptr, y, N, nthreads);
  else if (kind == EXPERTS_INT4)
    sglpy_gemv_int4(x, M, K, static_cast<const uint8_t*>(w), static_cast<const uint16_t*>(s), nullptr, y, N,
                    nthreads);
  else
    sglpy_gemv_f32(x, M, K, static_cast<const float*>(w), nullptr, y, N, nthreads);
}

}  // namespace

// x float32 [M, H]; ids int64 [M, top_k] in [0, E); weights float32 [M, top_k]; kind: 0 float32, 1 int8, 2 int4;
// gu_w/gu_s [E]: each expert's gate_up weight [2I, H] and scales, dn_w/dn_s [E]: its down weight [H, I] and scales
// (quant_linear_cpu.py's native layouts); out float32 [M, H] (overwritten). Returns 0, or -1 for an id out of range
// or an unknown kind (out untouched).
extern "C" int64_t sglpy_moe_experts(const float* x, int64_t M, int64_t H, int64_t I, int64_t top_k, int64_t E,
                                     const int64_t* ids, const float* weights, int32_t kind,
                                     const void* const* gu_w, const void* const* gu_s, const void* const* dn_w,
                                     const void* const* dn_s, float* out, int32_t nthreads) {
  const int64_t pairs = M * top_k;
  if (kind < EXPERTS_F32 || kind > EXPERTS_INT4) return -1;
  for (int64_t p = 0; p < pairs; ++p)
    if (ids[p] < 0 || ids[p] >= E) return -1;
  // counting sort of the pairs by expert (stable: token order within an expert, as argsort(stable=True) gives)
  std::vector<int64_t> start(E + 1, 0), order(pairs);
  for (int64_t p = 0; p < pairs; ++p) ++start[ids[p] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) order[fill[ids[p]]++] = p;
  }
  // scratch per block of at most BLOCK rows of one expert: xs [c, H], gate_up [c, 2I], act [c, I], y [c, H]. An
  // expert's rows run in blocks so the scratch stays small for a prefill (deterministic inference sends every row
  // here); the GEMVs compute each row alone, so the blocking changes no bits.
  constexpr int64_t BLOCK = 64;
  thread_local std::vector<float> scratch;
  const int64_t rows = pairs < BLOCK ? pairs : BLOCK;
  const size_t need = static_cast<size_t>(rows) * static_cast<size_t>(2 * H + 3 * I);
  if (scratch.size() < need) scratch.resize(need);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(M * H));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t b = start[e]; b < start[e + 1]; b += BLOCK) {  // an expert no token chose is never read
      const int64_t c = start[e + 1] - b < BLOCK ? start[e + 1] - b : BLOCK;
      const int64_t* sel = order.data() + b;
      float* xs = scratch.data();
      float* gu = xs + c * H;
      float* act = gu + c * 2 * I;
      float* y = act + c * I;
      for (int64_t r = 0; r < c; ++r) std::memcpy(xs + r * H, x + (sel[r] / top_k) * H, sizeof(float) * H);
      expert_gemv(kind, xs, c, H, gu_w[e], gu_s[e], gu, 2 * I, nthreads);
      sglpy_silu_mul(gu, c, I, act, nthreads);
      expert_gemv(kind, act, c, I, dn_w[e], dn_s[e], y, H, nthreads);
      for (int64_t r = 0; r < c; ++r) {
        const float w = weights[sel[r]];
        float* o = out + (sel[r] / top_k) * H;
        const float* yr = y + r * H;
        for (int64_t h = 0; h < H; ++h) o[h] += yr[h] * w;  // (y * w) rounded, then added: index_add_'s order
      }
    }
  }
  return 0;
}
