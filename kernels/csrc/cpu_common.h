// Shared by the native CPU kernels: K/V element loads per storage dtype, a vectorizable exp, threading.
#pragma once
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
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

static inline vf splat(float x) {  // one broadcast (vf{} + x cannot be folded: it must turn -0 into +0)
  return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}
static inline vf load(const float* p) {
  vf x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
typedef int32_t vi __attribute__((vector_size(64)));
typedef int16_t vi16 __attribute__((vector_size(32)));
typedef uint16_t vu16 __attribute__((vector_size(32)));
typedef int8_t vi8 __attribute__((vector_size(16)));
typedef uint8_t vu8 __attribute__((vector_size(16)));

// Widening loads of 16 narrow integers. GCC 12 scalarizes an 8 -> 32-bit __builtin_convertvector (one insert per
// lane), so AVX-512 uses one vpmov[sz]x instruction and other targets widen through 16 bits (both vectorize).
static inline vi load_i8_i32(const int8_t* p) {
#if defined(__AVX512F__)
  return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  vi8 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(__builtin_convertvector(b, vi16), vi);
#endif
}
static inline vi load_u8_i32(const uint8_t* p) {
#if defined(__AVX512F__)
  return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  vu8 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(__builtin_convertvector(b, vu16), vi);
#endif
}
static inline vu load_u16_u32(const uint16_t* p) {
#if defined(__AVX512F__)
  return (vu)_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  vh h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vu);
#endif
}
static inline vf load(const bf16_t* p) {  // bf16 is the top half of a float32
  const vu w = load_u16_u32(&p->bits) << 16;
  vf x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}
// IEEE half bits (widened to 32-bit lanes) -> float, exact: normals, subnormals, inf and nan. U/F: the unsigned
// and float vector types of one width (16 lanes, or the native width below).
template <typename U, typename F>
static inline F half_to_float(U w) {
  const U sign = (w & 0x8000u) << 16, mag = (w & 0x7fffu) << 13;
  F x;
  std::memcpy(&x, &mag, sizeof x);
  x *= 5.192296858534828e+33f;  // 2^112 moves the exponent bias from 15 to 127 (subnormals too)
  U bits;
  std::memcpy(&bits, &x, sizeof bits);
  const U special = (U)((w & 0x7c00u) == 0x7c00u);  // all ones where the half is inf or nan
  bits = (bits & ~special) | ((mag | 0x7f800000u) & special);
  bits |= sign;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
static inline vf load(const f16_t* p) { return half_to_float<vu, vf>(load_u16_u32(&p->bits)); }
static inline void store(float* p, vf x) { std::memcpy(p, &x, sizeof x); }

// One register of floats: 16 with AVX-512, 8 with AVX/AVX2, 4 otherwise. For loops that keep several accumulators
// live across an inner loop: GCC keeps an array of those in registers, but spills an array of 16-float vectors to
// the stack wherever one spans two or four registers (AVX2's decode attention P V loop ran 2.5x slower for it).
#if defined(__AVX512F__)
#define SGLPY_NW 16
#elif defined(__AVX__)
#define SGLPY_NW 8
#else
#define SGLPY_NW 4
#endif
constexpr int64_t NW = SGLPY_NW;
typedef float vn __attribute__((vector_size(NW * 4)));
typedef uint32_t vnu __attribute__((vector_size(NW * 4)));
typedef uint16_t vnh __attribute__((vector_size(NW * 2)));
static inline vn loadn(const float* p) {
  vn x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
static inline vnu loadn_u16_u32(const uint16_t* p) {
  vnh h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vnu);
}
static inline vn loadn(const bf16_t* p) {
  const vnu w = loadn_u16_u32(&p->bits) << 16;
  vn x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}
static inline vn loadn(const f16_t* p) { return half_to_float<vnu, vn>(loadn_u16_u32(&p->bits)); }
static inline void storen(float* p, vn x) { std::memcpy(p, &x, sizeof x); }
static inline float hsum(vf x) {  // pairwise: 16 -> 8 -> 4 -> 1
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  const v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
static inline float hsumn(vn x) {  // a fixed pairwise tree, as hsum
#if SGLPY_NW == 16
  return hsum(x);
#else
#if SGLPY_NW == 8
  typedef float v4 __attribute__((vector_size(16)));
  const v4 b = __builtin_shufflevector(x, x, 0, 1, 2, 3) + __builtin_shufflevector(x, x, 4, 5, 6, 7);
#else
  const vn b = x;
#endif
  return (b[0] + b[2]) + (b[1] + b[3]);
#endif
}
// sum_j a[j] * b[j], j < n: NW lanes of partial sums, hsumn, then the tail in order. The order depends on n
// alone. (GCC 12 compiled an `omp simd` reduction of this to a chain of scalar adds at the AVX-512 level.)
static inline float dot_n(const float* a, const float* b, int64_t n) {
  vn acc = vn{};
  int64_t j = 0;
  for (; j + NW <= n; j += NW) acc += loadn(a + j) * loadn(b + j);
  float s = hsumn(acc);
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

// exp(x), relative error ~2e-7, written without calls so that `omp simd` loops vectorize it (libm's expf is scalar
// and was a third of the decode-attention time). x is clamped to [-87, 88]: exp(-87) ~ 1.6e-38 (the smallest normal
// float, also what -inf maps to: softmax weights of masked-out scores vanish) and exp(88) ~ 1.7e38 (finite).
#pragma omp declare simd
static inline float exp_f32(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
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

// Lane-wise max and min. GCC 12 scalarizes a select (a > b ? a : b) on 16-float vectors wider than the target's
// registers (one compare and blend per lane: that made the AVX2 softmax 3x slower than AVX-512's), so AVX2 runs
// the two ymm halves through vmaxps/vminps; the results are the same either way.
#if defined(__AVX2__) && !defined(__AVX512F__)
struct ymm2 { __m256 h[2]; };
template <typename F>
static inline vf on_halves(vf a, vf b, F op) {
  ymm2 x, y;
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  x.h[0] = op(x.h[0], y.h[0]);
  x.h[1] = op(x.h[1], y.h[1]);
  std::memcpy(&a, &x, sizeof a);
  return a;
}
static inline vf vmax(vf a, vf b) { return on_halves(a, b, [](__m256 x, __m256 y) { return _mm256_max_ps(x, y); }); }
static inline vf vmin(vf a, vf b) { return on_halves(a, b, [](__m256 x, __m256 y) { return _mm256_min_ps(x, y); }); }
#else
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline vf vmin(vf a, vf b) { return a < b ? a : b; }
#endif

// exp_f32 on 16 lanes (the same polynomial, explicit vector code: `omp simd` left the scalar one unvectorized in
// the softmax loops). Rounding to the nearest integer by adding and subtracting 1.5 * 2^23 (|t| <= 127 here).
static inline vf exp_v(vf x) {
  x = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
  const vf t = x * 1.44269504088896341f;
  const vf n = (t + 12582912.0f) - 12582912.0f;
  const vf f = t - n;
  vf p = splat(1.535336188319500e-4f);
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf sc;
  std::memcpy(&sc, &e, sizeof sc);
  return p * sc;
}
// exp_v on native-width vectors (one register: no split 16-float selects or conversions for GCC to scalarize).
static inline vn exp_vn(vn x) {
  const vn lo = vn{} - 87.0f, hi = vn{} + 88.0f;
  x = x > lo ? x : lo;
  x = x < hi ? x : hi;
  const vn t = x * 1.44269504088896341f;
  const vn n = (t + 12582912.0f) - 12582912.0f;
  const vn f = t - n;
  vn p = vn{} + 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  typedef int32_t vni __attribute__((vector_size(NW * 4)));
  const vni e = (__builtin_convertvector(n, vni) + 127) << 23;
  vn sc;
  std::memcpy(&sc, &e, sizeof sc);
  return p * sc;
}
static inline float hmax(vf x) {
  float r = x[0];
  for (int i = 1; i < W; ++i) r = std::max(r, x[i]);
  return r;
}

// x in lanes [0, r) and `fill` after (r in [0, W]), by bit masks (no select: see vmax); LANES + W - r holds r
// all-ones words, then zeros.
alignas(64) static const uint32_t LANES[2 * W] = {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u,
                                                   ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u};
static inline vf first_lanes(vf x, int64_t r, vf fill) {
  vu m, xb, fb;
  std::memcpy(&m, LANES + W - r, sizeof m);
  std::memcpy(&xb, &x, sizeof xb);
  std::memcpy(&fb, &fill, sizeof fb);
  xb = (xb & m) | (fb & ~m);
  std::memcpy(&x, &xb, sizeof x);
  return x;
}

// One online-softmax step of a row over a block of scores s[0, 4 W) of which the first `vis` count: updates the
// running max m and sum l, leaves exp(s - m) in s[0, vis) and zeros after it, and returns the factor the row's
// accumulator must be rescaled by. vis may be 0 (then c = 1) once m is finite.
static inline float softmax_block(float* s, int64_t vis, float& m, float& l) {
  constexpr int V = 4;
  vf x[V], mx = splat(-INFINITY);
  int64_t r[V];
  for (int v = 0; v < V; ++v) {
    r[v] = std::min<int64_t>(std::max<int64_t>(vis - v * W, 0), W);  // visible lanes of vector v
    x[v] = first_lanes(load(s + v * W), r[v], splat(-INFINITY));
    mx = vmax(mx, x[v]);
  }
  const float bm = std::max(m, hmax(mx));
  const float c = exp_f32(m - bm);
  vf sum = vf{};
  for (int v = 0; v < V; ++v) {
    const vf e = first_lanes(exp_v(x[v] - bm), r[v], vf{});
    store(s + v * W, e);
    sum += e;
  }
  l = l * c + hsum(sum);
  m = bm;
  return c;
}

}  // namespace sglpy
