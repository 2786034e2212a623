// The small per-layer ops around the matmuls, one call each instead of a handful of torch ops:
//   sglpy_rmsnorm        (residual add +) RMSNorm            oracle: kernels/rmsnorm.py:rmsnorm_reference
//   sglpy_rotary_store   rotary on q, k of a fused qkv row, K/V into the pool (any pool dtype)
//                                                           oracle: kernels/rotary_store.py:rotate_and_store_reference
//   sglpy_silu_mul       silu(gate) * up                     oracle: kernels/activation.py:silu_and_mul_reference
// All float32 activations; rows are independent, so several rows split across threads.
#include "cpu_common.h"
#include "kernels.h"

namespace sglpy {
namespace {

constexpr int64_t PARALLEL_ROWS = 8;  // fewer rows run on the calling thread (a parallel region costs more)

static inline void store_as(float* p, float x) { *p = x; }
static inline void store_as(bf16_t* p, float x) {  // round to nearest even, as torch's .to(bfloat16)
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) {  // nan stays a (quiet) nan
    p->bits = (uint16_t)((b >> 16) | 0x40);
    return;
  }
  b += 0x7fffu + ((b >> 16) & 1u);
  p->bits = (uint16_t)(b >> 16);
}
static inline void store_as(f16_t* p, float x) {
#if defined(__aarch64__)
  const __fp16 h = (__fp16)x;  // fcvt: round to nearest even (g++ has no _Float16 in C++ on aarch64)
  std::memcpy(&p->bits, &h, 2);
#elif defined(__FLT16_MAX__)
  const _Float16 h = (_Float16)x;  // round to nearest even (vcvtps2ph with F16C)
  std::memcpy(&p->bits, &h, 2);
#else
  // float -> half by hand, round to nearest even; overflow to inf, nan kept
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint32_t sign = (b >> 16) & 0x8000u, mag = b & 0x7fffffffu;
  uint16_t out;
  if (mag > 0x7f800000u) out = (uint16_t)(sign | 0x7e00u);
  else if (mag >= 0x477ff000u) out = (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
  else if (mag < 0x38800000u) {                                      // subnormal half (or zero)
    float f;
    std::memcpy(&f, &mag, 4);
    out = (uint16_t)(sign | (uint32_t)std::nearbyint(f * 16777216.0f));
  } else {
    const uint32_t r = mag - 0x38000000u;  // rebias 127 -> 15
    out = (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  p->bits = out;
#endif
}

template <typename KV>
void store_row(void* cache, int64_t slot, int64_t row, const float* src, int64_t n) {
  KV* dst = static_cast<KV*>(cache) + slot * row;
  for (int64_t i = 0; i < n; ++i) store_as(dst + i, src[i]);
}

template <typename F>
void for_rows(int64_t M, int32_t nthreads, F f) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && M >= PARALLEL_ROWS)
  for (int64_t m = 0; m < M; ++m) f(m);
}

}  // namespace
}  // namespace sglpy

using namespace sglpy;

// x, residual (nullable), out, residual_out: float32 [M, H] (residual_out may be residual itself; unused when
// residual is null). h = x + residual; out = weight * (h * rsqrt(mean(h^2) + eps)); residual_out = h.
extern "C" int64_t sglpy_rmsnorm(const float* x, const float* residual, const float* weight, float eps, float* out,
                                 float* residual_out, int64_t M, int64_t H, int32_t nthreads) {
  for_rows(M, nthreads, [&](int64_t m) {
    const float* xm = x + m * H;
    float* om = out + m * H;
    const float* h = xm;
    if (residual != nullptr) {
      float* rm = residual_out + m * H;
      const float* res = residual + m * H;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) rm[i] = xm[i] + res[i];
      h = rm;
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < H; ++i) ss += h[i] * h[i];
    const float r = 1.0f / std::sqrt(ss / (float)H + eps);
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) om[i] = weight[i] * (h[i] * r);
  });
  return 0;
}

// qkv float32 [M, row_stride]: q heads [0, H), k heads [H, H + Hkv), v heads after, each D wide. Rotates q and k
// in place (NeoX / HF rotate_half: x1 * cos - x2 * sin, x2 * cos + x1 * sin with cos/sin = cos_sin[pos, :D/2],
// [D/2:]) and writes k, v to slot loc[m] of the caches ([slots, Hkv, D], slot rows kv_row elements apart) in the
// cache dtype. Returns 0, or 1 + 2 m for a bad position of row m, 2 + 2 m for a bad slot (nothing written there).
extern "C" int64_t sglpy_rotary_store(float* qkv, int64_t M, int64_t row_stride, int64_t H, int64_t Hkv, int64_t D,
                                      const float* cos_sin, int64_t max_pos, const int64_t* positions, void* k_cache,
                                      void* v_cache, int32_t kv_dtype, int64_t num_slots, int64_t kv_row,
                                      const int64_t* loc, int32_t nthreads) {
  if (kv_dtype != F32 && kv_dtype != BF16 && kv_dtype != F16) return -1;
  for (int64_t m = 0; m < M; ++m) {  // check first: a bad row leaves the pool untouched
    if (positions[m] < 0 || positions[m] >= max_pos) return 1 + 2 * m;
    if (loc[m] < 0 || loc[m] >= num_slots) return 2 + 2 * m;
  }
  const int64_t half = D / 2;
  for_rows(M, nthreads, [&](int64_t m) {
    float* row = qkv + m * row_stride;
    const float* cs = cos_sin + positions[m] * D;
    const float* cos = cs;
    const float* sin = cs + half;
    for (int64_t h = 0; h < H + Hkv; ++h) {
      float* x1 = row + h * D;
      float* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * cos[i] - b * sin[i];
        x2[i] = b * cos[i] + a * sin[i];
      }
    }
    const float* k = row + H * D;
    const float* v = k + Hkv * D;
    switch (kv_dtype) {
      case F32:
        store_row<float>(k_cache, loc[m], kv_row, k, Hkv * D);
        store_row<float>(v_cache, loc[m], kv_row, v, Hkv * D);
        break;
      case BF16:
        store_row<bf16_t>(k_cache, loc[m], kv_row, k, Hkv * D);
        store_row<bf16_t>(v_cache, loc[m], kv_row, v, Hkv * D);
        break;
      default:
        store_row<f16_t>(k_cache, loc[m], kv_row, k, Hkv * D);
        store_row<f16_t>(v_cache, loc[m], kv_row, v, Hkv * D);
        break;
    }
  });
  return 0;
}

// gate_up float32 [M, 2 I] (gate, then up), out float32 [M, I]: out = gate / (1 + exp(-gate)) * up.
extern "C" int64_t sglpy_silu_mul(const float* gate_up, int64_t M, int64_t I, float* out, int32_t nthreads) {
  for_rows(M, nthreads, [&](int64_t m) {
    const float* g = gate_up + m * 2 * I;
    const float* u = g + I;
    float* o = out + m * I;
    // native-width vectors (cpu_common.h: exp_vn): GCC compiled the `omp simd` loop over exp_f32 to scalar code at
    // the AVX2 level (a tenth of an 8-row step); the same polynomial, so values move by an ulp at most
    int64_t i = 0;
    for (; i + NW <= I; i += NW) {
      const vn x = loadn(g + i);
      storen(o + i, x / (1.0f + exp_vn(-x)) * loadn(u + i));
    }
    for (; i < I; ++i) o[i] = g[i] / (1.0f + exp_f32(-g[i])) * u[i];
  });
  return 0;
}
