// int8 activations for the weight-only GEMV (llama.cpp's q8 trick): each row of x is quantized per block of 32
// inputs, x ~= d * xq (xq int8 in [-Q, Q], d = max |x| / Q, Q = 127; Q = S8_QMAX = 63 against int8 weights at
// AVX2 without VNNI, below), so a block's dot product with int4 codes or int8
// weights is one integer multiply-add instruction sequence (AVX2 vpmaddubsw + vpmaddwd, or vpdpbusd with VNNI;
// SSE2 pmaddwd on int16; NEON sdot) and one float FMA, instead of dequantizing the weights to float. Error per
// output: at most sum_k |W[n, k]| * d_block(k) / 2 (kernels/quant_linear_cpu.py:native_error_bound states it as the
// tolerance). Compiled where an integer dot product exists (every x86 level, aarch64 with dotprod): SGLPY_Q8_ACT.
// On ARM without dotprod the float-activation kernels run.
#pragma once
#include "cpu_common.h"

#if defined(SGLPY_FLOAT_ACT)  // -DSGLPY_FLOAT_ACT: the float-activation kernels everywhere (A/B measurements)
#elif defined(__AVX2__)
#include <immintrin.h>
#define SGLPY_Q8_ACT 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define SGLPY_Q8_ACT 1
#elif defined(__SSE2__)
#include <emmintrin.h>
#define SGLPY_Q8_ACT 1
#define SGLPY_Q8_I16 1  // the quantized activations are stored widened to int16 (pmaddwd's operand)
#endif

namespace sglpy {

constexpr int64_t QBLOCK = 32;

// The int8-weight tiles at AVX2 without VNNI multiply w + 128 (unsigned) by the activations with vpmaddubsw, whose
// pair sums must fit int16: activations for int8 weights are quantized to [-63, 63] there (elsewhere [-127, 127]).
// Against 8-bit activations with the signs moved onto them (vpsignb + vpmaddubsw + vpmaddwd + vpaddd per 4 inputs)
// this drops a quarter of a row's instructions: the 8-row int8 lm_head 4.3-4.6 -> 3.5-3.9 ms. The quality gate
// passes (benchmarks/README.md, "7-bit activations against int8 weights at AVX2"). int4 codes keep 8-bit activations.
#if defined(__AVX2__) && !defined(__AVXVNNI__) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
constexpr float S8_QMAX = 63.f;
#else
constexpr float S8_QMAX = 127.f;
#endif

// The stored quantized activations: int8, or at SSE2 the same values widened to int16 once, at quantization (the
// operand of pmaddwd: no per-row widening in the block loop; SSE2 has no sign-extending load).
#if defined(SGLPY_Q8_I16)
typedef int16_t qact_t;
#else
typedef int8_t qact_t;
#endif

// One row of quantized activations: q [K] (K rounded up to 32, zero-padded), per block d, d * sum(q) and sum(q)
// (as int32 and as float: exact either way, |sum| <= 32 * 127).
struct Q8Row {
  const qact_t* q;
  const float* d;
  const float* sum;
  const int32_t* qs;
  const float* qsf;
};

// x [K] -> xq, d [ceil(K / 32)], sum [ceil(K / 32)] (= d * sum(xq): W . x-hat for centered W, llama.cpp's q8_1),
// qs / qsf = sum(xq); K a multiple of 16 (a last block of 16 is zero-padded).
static inline void quantize_row_q8(const float* x, int64_t K, qact_t* xq, float* d, float* sum, int32_t* qs,
                                   float* qsf, float qmax = 127.f) {
  for (int64_t b = 0; b * QBLOCK < K; ++b) {
    const int64_t k0 = b * QBLOCK, n = std::min(QBLOCK, K - k0);
    float amax = 0.f;
#pragma omp simd reduction(max : amax)
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[k0 + i]));
    const float db = amax / qmax, inv = amax > 0.f ? qmax / amax : 0.f;
    int32_t s = 0;
#if defined(SGLPY_Q8_I16)
    // cvtps2dq rounds as nearbyint does (the current mode: nearest even); without SSE4.1's roundps, GCC called
    // nearbyintf once per input. n is 16 or 32.
    const __m128 vinv = _mm_set1_ps(inv);
    __m128i s4 = _mm_setzero_si128();
    for (int64_t i = 0; i < n; i += 4) {
      const __m128i v = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + k0 + i), vinv));
      s4 = _mm_add_epi32(s4, v);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(xq + k0 + i), _mm_packs_epi32(v, v));
    }
    alignas(16) int32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), s4);
    s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#else
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = (int32_t)std::nearbyint(x[k0 + i] * inv);
      xq[k0 + i] = (qact_t)v;
      s += v;
    }
#endif
    for (int64_t i = n; i < QBLOCK; ++i) xq[k0 + i] = 0;
    d[b] = db;
    sum[b] = db * (float)s;  // of the quantized block: the int4 zero term then sees the same x as the codes
    qs[b] = s;
    qsf[b] = (float)s;
  }
}

// Rows of a pass (up to PASS of them) block by block: block b's quantized rows at q + (b * PASS + m) * 32, their
// d, sum(xq) at d / qsf / qs + b * PASS + m (the tile kernels' layout: Q8Acts in quant_gemv.cpp); at SSE2 also d
// broadcast to 4 lanes at d4 + (b * PASS + m) * 4 (a multiply's memory operand instead of a load and a shuffle).
constexpr int64_t PASS = 8;
struct Q8Pass {
  const qact_t* q;
  const float* d;
  const float* qsf;
  const int32_t* qs;
  const float* d4;
};

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

// ---- Tiles of 8 output channels (x86). One int32 lane per channel: a block of 32 inputs is 8 integer dot-product
// instructions, each the 4 weight bytes of every channel that meet one dword of the activations (broadcast), summed
// in integers over the block; then one convert and the float scaling for all 8 channels. The per-channel layout
// (lanes = inputs) paid a convert, a scale product and an FMA per channel, block and row, and a horizontal sum per
// channel and row: with 8 rows that arithmetic, not the weight reads, bounded the step. The weights stay in the
// per-channel layout in memory; a tile's block is transposed in registers once and reused by every row of the pass.
#define SGLPY_Q8_TILE 1
constexpr int64_t TILE = 8;

// u[j] lane c: channel c's weight bytes for inputs 4j .. 4j + 3 of the block (int4: the codes 0..15; int8: w + 128,
// unsigned, with a - 128 sum(xq) correction).
struct TileBlock {
  __m256i u[8];
};

static inline __m256i bcast_dword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
static inline __m256i load_pair(const uint8_t* lo, const uint8_t* hi) {  // 16 bytes of channel c | of channel c + 4
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}
// y[c] = [dwords 0..3 of channel c | of channel c + 4] (c < 4) -> out[j] lane c = dword j of channel c (j < 4)
static inline void transpose_8x4(const __m256i y[4], __m256i out[4]) {
  const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}
// int4 codes of group g for channels c = 0..7 at p + c * stride (16 bytes each: input i low nibble, i + 16 high)
static inline void load_tile_u4(const uint8_t* p, int64_t stride, TileBlock& t) {
  __m256i y[4], d[4];
  for (int c = 0; c < 4; ++c) y[c] = load_pair(p + c * stride, p + (c + 4) * stride);
  transpose_8x4(y, d);
  const __m256i low = _mm256_set1_epi8(15);
  for (int j = 0; j < 4; ++j) {
    t.u[j] = _mm256_and_si256(d[j], low);                             // inputs 4j .. 4j + 3
    t.u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(d[j], 4), low);  // inputs 16 + 4j ..
  }
}
// int8 weights of one block for channels c = 0..7 at p + c * stride (32 bytes each)
static inline void load_tile_s8(const int8_t* p, int64_t stride, TileBlock& t) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
  __m256i y[4], d[8];
  for (int c = 0; c < 4; ++c) y[c] = load_pair(b + c * stride, b + (c + 4) * stride);
  transpose_8x4(y, d);
  for (int c = 0; c < 4; ++c) y[c] = load_pair(b + c * stride + 16, b + (c + 4) * stride + 16);
  transpose_8x4(y, d + 4);
  for (int j = 0; j < 8; ++j) t.u[j] = _mm256_xor_si256(d[j], _mm256_set1_epi8((char)0x80));  // w + 128: unsigned
}
// two chains of 4 (one chain of 8 dependent dot products is latency-bound at one row)
static inline __m256i dpbusd8(__m256i acc, const TileBlock& t, const int8_t* xq) {
  __m256i b = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int j = 0; j < 8; j += 2) {
#if defined(__AVXVNNI__)
    acc = _mm256_dpbusd_avx_epi32(acc, t.u[j], bcast_dword(xq + 4 * j));
    b = _mm256_dpbusd_avx_epi32(b, t.u[j + 1], bcast_dword(xq + 4 * j + 4));
#else
    acc = _mm256_dpbusd_epi32(acc, t.u[j], bcast_dword(xq + 4 * j));
    b = _mm256_dpbusd_epi32(b, t.u[j + 1], bcast_dword(xq + 4 * j + 4));
#endif
  }
  return _mm256_add_epi32(acc, b);
}
// Exact int32 sums over one block of 32 inputs, lane c = channel c: codes . xq (int4), w . xq (int8). For int4 codes
// AVX2 and VNNI give the same integers, so the float results that follow are the same at both levels; int8 weights
// meet 7-bit activations at AVX2 without VNNI (S8_QMAX), so there the two levels differ within the stated bound.
static inline __m256i tile_dot_u4(const TileBlock& t, const int8_t* xq) {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  return dpbusd8(_mm256_setzero_si256(), t, xq);
#else
  // 16-bit partial sums: each is at most 8 * 2 * 15 * 127 = 30480 in magnitude, no saturation
  __m256i s = _mm256_maddubs_epi16(t.u[0], bcast_dword(xq));
  for (int j = 1; j < 8; ++j) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(t.u[j], bcast_dword(xq + 4 * j)));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}
static inline __m256i tile_dot_s8(const TileBlock& t, const int8_t* xq, int32_t qsum) {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  return dpbusd8(_mm256_set1_epi32(-128 * qsum), t, xq);  // (w + 128) . xq - 128 sum(xq)
#else
  // (w + 128) * xq with |xq| <= S8_QMAX = 63: 2 products per 16-bit lane, at most 2 * 255 * 63 = 32130 (no
  // saturation), widened every step; then - 128 sum(xq)
  const __m256i one = _mm256_set1_epi16(1);
  __m256i acc = _mm256_set1_epi32(-128 * qsum), b = _mm256_setzero_si256();
  for (int j = 0; j < 8; j += 2) {
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(t.u[j], bcast_dword(xq + 4 * j)), one));
    b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_maddubs_epi16(t.u[j + 1], bcast_dword(xq + 4 * j + 4)), one));
  }
  return _mm256_add_epi32(acc, b);
#endif
}
static inline __m256 bf16x8(const uint16_t* p) {  // 8 bf16 -> float32
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// The tile kernels' vector of 8 channels (gemv_q8.h: int4_tiles_q8 / int8_tiles_q8 over tiles of 8).
struct Lanes8 {
  static constexpr int LANES = 8;
  typedef __m256 F;
  typedef TileBlock Tile;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F bf16(const uint16_t* p, int64_t) { return bf16x8(p); }  // one tile's 8 values (the next tile's unread)
  static void load_u4(const uint8_t* p, int64_t stride, Tile& t) { load_tile_u4(p, stride, t); }
  static void load_s8(const int8_t* p, int64_t stride, Tile& t) { load_tile_s8(p, stride, t); }
  static F dot_u4(const Tile& t, const int8_t* xq) { return _mm256_cvtepi32_ps(tile_dot_u4(t, xq)); }
  static F dot_s8(const Tile& t, const int8_t* xq, int32_t qs) { return _mm256_cvtepi32_ps(tile_dot_s8(t, xq, qs)); }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// ---- Tiles of 16 channels (AVX-512 VNNI): two 8-channel tiles side by side in one zmm register, lane c = channel
// c. Every lane runs the 8-channel tile's operations in its order (the same integer sums, then the same float
// convert, multiplies and FMAs), so the results are bit for bit those of the 8-channel tiles; but each row's
// broadcasts, convert and scaling serve 16 channels instead of 8, and those, not the dot products, bound a row.
#define SGLPY_Q8_TILE16 1
struct TileBlock16 {
  __m512i u[8];
};
// 16 bytes of channels c, c + 4, c + 8, c + 12 (channel stride `stride`)
static inline __m512i load_quad(const uint8_t* p, int64_t stride) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * stride)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * stride)), 2);
  return _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12 * stride)), 3);
}
// int4 codes of group g for channels c = 0..15 at p + c * stride (load_tile_u4's layout, 16 lanes)
static inline void load_tile16_u4(const uint8_t* p, int64_t stride, TileBlock16& t) {
  __m512i y[4];
  for (int c = 0; c < 4; ++c) y[c] = load_quad(p + c * stride, stride);
  const __m512i t0 = _mm512_unpacklo_epi32(y[0], y[1]), t1 = _mm512_unpackhi_epi32(y[0], y[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(y[2], y[3]), t3 = _mm512_unpackhi_epi32(y[2], y[3]);
  const __m512i d[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                        _mm512_unpackhi_epi64(t1, t3)};
  const __m512i low = _mm512_set1_epi8(15);
  for (int j = 0; j < 4; ++j) {
    t.u[j] = _mm512_and_si512(d[j], low);
    t.u[j + 4] = _mm512_and_si512(_mm512_srli_epi16(d[j], 4), low);
  }
}
// int8 weights of one block for channels c = 0..15 at p + c * stride (load_tile_s8's layout, 16 lanes)
static inline void load_tile16_s8(const int8_t* p, int64_t stride, TileBlock16& t) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
  for (int half = 0; half < 2; ++half) {
    __m512i y[4];
    for (int c = 0; c < 4; ++c) y[c] = load_quad(b + c * stride + 16 * half, stride);
    const __m512i t0 = _mm512_unpacklo_epi32(y[0], y[1]), t1 = _mm512_unpackhi_epi32(y[0], y[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(y[2], y[3]), t3 = _mm512_unpackhi_epi32(y[2], y[3]);
    const __m512i flip = _mm512_set1_epi8((char)0x80);  // w + 128: unsigned
    t.u[4 * half] = _mm512_xor_si512(_mm512_unpacklo_epi64(t0, t2), flip);
    t.u[4 * half + 1] = _mm512_xor_si512(_mm512_unpackhi_epi64(t0, t2), flip);
    t.u[4 * half + 2] = _mm512_xor_si512(_mm512_unpacklo_epi64(t1, t3), flip);
    t.u[4 * half + 3] = _mm512_xor_si512(_mm512_unpackhi_epi64(t1, t3), flip);
  }
}
// exact int32 sums over a block of 32 inputs, lane c = channel c (tile_dot_u4 / tile_dot_s8 with 16 lanes)
static inline __m512i dpbusd16(__m512i acc, const TileBlock16& t, const int8_t* xq) {
  __m512i b = _mm512_setzero_si512();
  for (int j = 0; j < 8; j += 2) {
    int32_t x0, x1;
    std::memcpy(&x0, xq + 4 * j, 4);
    std::memcpy(&x1, xq + 4 * j + 4, 4);
    acc = _mm512_dpbusd_epi32(acc, t.u[j], _mm512_set1_epi32(x0));
    b = _mm512_dpbusd_epi32(b, t.u[j + 1], _mm512_set1_epi32(x1));
  }
  return _mm512_add_epi32(acc, b);
}
static inline __m512 bf16x16(const uint16_t* lo, const uint16_t* hi) {  // 8 bf16 at lo, 8 at hi -> 16 float32
  const __m256i h = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
struct Lanes16 {  // Lanes8's operations on two tiles at once
  static constexpr int LANES = 16;
  typedef __m512 F;
  typedef TileBlock16 Tile;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F bf16(const uint16_t* p, int64_t next_tile) { return bf16x16(p, p + next_tile); }
  static void load_u4(const uint8_t* p, int64_t stride, Tile& t) { load_tile16_u4(p, stride, t); }
  static void load_s8(const int8_t* p, int64_t stride, Tile& t) { load_tile16_s8(p, stride, t); }
  static F dot_u4(const Tile& t, const int8_t* xq) {
    return _mm512_cvtepi32_ps(dpbusd16(_mm512_setzero_si512(), t, xq));
  }
  static F dot_s8(const Tile& t, const int8_t* xq, int32_t qs) {
    return _mm512_cvtepi32_ps(dpbusd16(_mm512_set1_epi32(-128 * qs), t, xq));  // (w + 128) . xq - 128 sum(xq)
  }
};
#endif

#elif defined(SGLPY_Q8_ACT) && defined(__aarch64__)  // aarch64 + dotprod

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

#elif defined(SGLPY_Q8_ACT)  // x86 SSE2 (the baseline level): pmaddwd, 8 int16 products summed in pairs

// One accumulator per row: 8 rows' accumulators, a block's 4 weight registers and the temporaries fit SSE2's 16
// registers (two chains per row spilled at 8 rows). The float work per block and row is one convert, a broadcast,
// a multiply and an add; the chain's add is not what bounds it.
constexpr int Q8_CHAINS = 1;
// int8 weights are widened by unpacking them into the high byte of each int16 (w * 256: no arithmetic shift per 8
// weights). The block's integer sum stays exact (|sum| <= 256 * 32 * 127 * 127 < 2^31) and exactly representable
// as float (256 times an integer below 2^24), and scaling every float step by a power of two changes no rounding, so
// sum * (scale / 256) is the same float as the unscaled sum times scale.
constexpr float S8_UNIT = 1.f / 256;
static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= 16, "Q8Acts' int16 blocks are read with aligned loads");
typedef __m128 facc;  // 4 float partial sums
static inline facc facc_zero() { return _mm_setzero_ps(); }
static inline float facc_sum(facc a) {  // (a0 + a2) + (a1 + a3), as hsumn
  const __m128 s = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
struct WBlock {
  __m128i v[4];  // inputs 8j .. 8j + 7 of the block as int16 (int4: the codes 0..15; int8: w * 256)
};
static inline WBlock load_w_u4(const uint8_t* p) {  // 16 bytes: input i low nibble, input i + 16 high nibble
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), zero = _mm_setzero_si128();
  const __m128i lo = _mm_unpacklo_epi8(b, zero), hi = _mm_unpackhi_epi8(b, zero), low = _mm_set1_epi16(15);
  return {{_mm_and_si128(lo, low), _mm_and_si128(hi, low), _mm_srli_epi16(lo, 4), _mm_srli_epi16(hi, 4)}};
}
static inline WBlock load_w_s8(const int8_t* p) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), zero = _mm_setzero_si128();
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  return {{_mm_unpacklo_epi8(zero, a), _mm_unpackhi_epi8(zero, a), _mm_unpacklo_epi8(zero, b),
           _mm_unpackhi_epi8(zero, b)}};
}
// sum_i w_i xq_i over the block in 4 int32 lanes (exact: the order of the integer adds does not matter)
static inline __m128i dot_i16(const WBlock& w, const int16_t* xq) {
  const __m128i* x = reinterpret_cast<const __m128i*>(xq);
  const __m128i a = _mm_add_epi32(_mm_madd_epi16(w.v[0], _mm_load_si128(x)), _mm_madd_epi16(w.v[1], _mm_load_si128(x + 1)));
  const __m128i b = _mm_add_epi32(_mm_madd_epi16(w.v[2], _mm_load_si128(x + 2)), _mm_madd_epi16(w.v[3], _mm_load_si128(x + 3)));
  return _mm_add_epi32(a, b);
}

#endif

#if defined(SGLPY_Q8_TILE) || defined(SGLPY_Q8_I16)
#define SGLPY_Q8_PASS 1  // the GEMV reads a pass's rows side by side per block (Q8Pass)
#endif

}  // namespace sglpy
