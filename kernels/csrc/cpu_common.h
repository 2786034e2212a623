// Shared by the native CPU kernels: K/V element loads per storage dtype, a vectorizable exp, threading.
#pragma once
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace sglpy {

// Storage dtype codes shared with kernels/cpu_native.py (DTYPE_CODES).
enum DType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

// 16-float vectors (GCC/clang vector extensions): one zmm with AVX-512, split into two ymm on AVX2 or four q
// registers on NEON by the compiler. Loads and stores go through memcpy (unaligned; compiled to one vmovups).
constexpr int64_t W = 16;
typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

static inline vf splat(float x) { return vf{} + x; }
static inline vf load(const float* p) {
  vf x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
static inline vf load(const bf16_t* p) {  // bf16 is the top half of a float32
  vh h;
  std::memcpy(&h, p, sizeof h);
  const vu w = __builtin_convertvector(h, vu) << 16;
  vf x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}
static inline vf load(const f16_t* p) {  // IEEE half -> float, exact: normals, subnormals, inf and nan
  vh h;
  std::memcpy(&h, p, sizeof h);
  const vu w = __builtin_convertvector(h, vu);
  const vu sign = (w & 0x8000u) << 16, mag = (w & 0x7fffu) << 13;
  vf x;
  std::memcpy(&x, &mag, sizeof x);
  x *= splat(5.192296858534828e+33f);  // 2^112 moves the exponent bias from 15 to 127 (subnormals too)
  vu bits;
  std::memcpy(&bits, &x, sizeof bits);
  const vu special = (w & 0x7c00u) == 0x7c00u;      // all ones where the half is inf or nan
  bits = (bits & ~special) | ((mag | 0x7f800000u) & special);
  bits |= sign;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
static inline void store(float* p, vf x) { std::memcpy(p, &x, sizeof x); }
static inline float hsum(vf x) {  // pairwise: 16 -> 8 -> 4 -> 1
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  const v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// exp(x) for x <= 0 (softmax after subtracting the running max); relative error ~2e-7. Written without calls so
// that `omp simd` loops vectorize it (libm's expf is scalar and was a third of the decode-attention time).
#pragma omp declare simd
static inline float exp_nonpos(float x) {
  x = std::max(x, -87.0f);  // exp(-87) ~ 1.6e-38: the smallest normal float; also maps -inf to ~0
  const float t = x * 1.44269504088896341f;
  const float n = std::nearbyint(t);
  const float f = t - n;  // [-0.5, 0.5]: 2^f by a degree-6 polynomial
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float s;
  std::memcpy(&s, &e, 4);
  return p * s;
}

}  // namespace sglpy
