// int8 activations for the weight-only GEMV (llama.cpp's q8 trick): each row of x is quantized per block of 32
// inputs, x ~= d * xq (xq int8 in [-127, 127], d = max |x| / 127), so a block's dot product with int4 codes or int8
// weights is one integer multiply-add instruction sequence (AVX2 vpmaddubsw + vpmaddwd, or vpdpbusd with VNNI;
// NEON sdot) and one float FMA, instead of dequantizing the weights to float. Error per output: at most
// sum_k |W[n, k]| * d_block(k) / 2 (tests/kernels/test_kernels_cpu_native.py states it as the tolerance).
// Compiled where an integer dot product exists (AVX2, aarch64 with dotprod): SGLPY_Q8_ACT. Elsewhere (SSE2,
// ARM without dotprod) the float-activation kernels run.
#pragma once
#include "cpu_common.h"

#if defined(SGLPY_FLOAT_ACT)  // -DSGLPY_FLOAT_ACT: the float-activation kernels everywhere (A/B measurements)
#elif defined(__AVX2__)
#include <immintrin.h>
#define SGLPY_Q8_ACT 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define SGLPY_Q8_ACT 1
#endif

namespace sglpy {

constexpr int64_t QBLOCK = 32;

// One row of quantized activations: q [K] (K rounded up to 32, zero-padded), d and d * sum(q) per block.
struct Q8Row {
  const int8_t* q;
  const float* d;
  const float* sum;
};

// x [K] -> xq, d [ceil(K / 32)], sum [ceil(K / 32)] (= d * sum(xq): W . x-hat for centered W, llama.cpp's q8_1);
// K a multiple of 16 (a last block of 16 is zero-padded).
static inline void quantize_row_q8(const float* x, int64_t K, int8_t* xq, float* d, float* sum) {
  for (int64_t b = 0; b * QBLOCK < K; ++b) {
    const int64_t k0 = b * QBLOCK, n = std::min(QBLOCK, K - k0);
    float amax = 0.f;
#pragma omp simd reduction(max : amax)
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[k0 + i]));
    const float db = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    int32_t s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = (int32_t)std::nearbyint(x[k0 + i] * inv);
      xq[k0 + i] = (int8_t)v;
      s += v;
    }
    for (int64_t i = n; i < QBLOCK; ++i) xq[k0 + i] = 0;
    d[b] = db;
    sum[b] = db * (float)s;  // of the quantized block: the int4 zero term then sees the same x as the codes
  }
}

#if defined(SGLPY_Q8_ACT) && defined(__AVX2__)

typedef __m256 facc;  // 8 float partial sums
static inline facc facc_zero() { return _mm256_setzero_ps(); }
static inline float facc_sum(facc a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// sum over groups of 4 of u8 * s8 -> 8 int32 lanes (maddubs cannot saturate here: |u| <= 127 or u <= 15)
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
// 32 weights of a block, ready for dot products with activation blocks.
struct WBlock {
  __m256i u;  // int4: the codes 0..15; int8: |w|
  __m256i s;  // int8: w (whose signs move onto the activations); unused for int4
};
static inline WBlock load_w_u4(const uint8_t* p) {  // 16 bytes: input i low nibble, input i + 16 high nibble
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return {_mm256_and_si256(v, _mm256_set1_epi8(15)), _mm256_setzero_si256()};
}
static inline WBlock load_w_s8(const int8_t* p) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_sign_epi8(w, w), w};
}
// acc + d * sum_i w_i xq_i over the block
static inline facc fma_u4(facc acc, const WBlock& w, const int8_t* xq, float d) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(w.u, x)), _mm256_set1_ps(d), acc);
}
static inline facc fma_s8(facc acc, const WBlock& w, const int8_t* xq, float d) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(w.u, _mm256_sign_epi8(x, w.s))), _mm256_set1_ps(d), acc);
}

#elif defined(SGLPY_Q8_ACT)  // aarch64 + dotprod

typedef float32x4_t facc;
static inline facc facc_zero() { return vdupq_n_f32(0.f); }
static inline float facc_sum(facc a) { return vaddvq_f32(a); }
struct WBlock {
  int8x16_t lo, hi;  // inputs 0..15 and 16..31 of the block
};
static inline WBlock load_w_u4(const uint8_t* p) {
  const uint8x16_t b = vld1q_u8(p);
  return {vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(b, 4))};
}
static inline WBlock load_w_s8(const int8_t* p) { return {vld1q_s8(p), vld1q_s8(p + 16)}; }
static inline facc fma_u4(facc acc, const WBlock& w, const int8_t* xq, float d) {
  int32x4_t s = vdotq_s32(vdupq_n_s32(0), w.lo, vld1q_s8(xq));
  s = vdotq_s32(s, w.hi, vld1q_s8(xq + 16));
  return vfmaq_n_f32(acc, vcvtq_f32_s32(s), d);
}
static inline facc fma_s8(facc acc, const WBlock& w, const int8_t* xq, float d) { return fma_u4(acc, w, xq, d); }

#endif

}  // namespace sglpy
