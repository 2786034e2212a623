// The GEMV's int8-activation kernels (q8_dot.h's primitives): one channel at a time against a pass's rows
// (AVX2 / AVX-512 tails, aarch64 dotprod), tiles of 8 channels (AVX2 / AVX-512) and SSE2's int16 pass kernels
// (quant_gemv.cpp drives them; layouts in its header comment).
#pragma once
#include "gemv_float.h"
#include "q8_dot.h"

namespace sglpy {
namespace {

#if defined(SGLPY_Q8_ACT)
#if !defined(SGLPY_Q8_I16)
// MR rows of int8 activations (a[m]) against int4 codes: y = sum_g s_g * d_g * (codes . xq)_g + sum_g z'_g * xsum_g,
// W = code * s + z' with z' = z - 8 s folded in by the same pre-pass as the float kernel.
template <int MR>
void int4_rows_q8(const Q8Row* a, int64_t K, const uint8_t* q, const uint16_t* sz, const float* bias, float* y,
                  int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / 32;
  float sf[MAX_GROUPS], zf[MAX_GROUPS];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qn = q + n * groups * 16;
    int4_channel_scales(sz, groups, n, sf, zf);
    facc acc[MR][2];  // two chains per row (a cvt + FMA per block is latency-bound on one)
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = facc_zero();
    int64_t g = 0;
    for (; g + 2 <= groups; g += 2) {
      const WBlock w0 = load_w_u4(qn + g * 16), w1 = load_w_u4(qn + g * 16 + 16);
      for (int m = 0; m < MR; ++m) {
        acc[m][0] = fma_u4(acc[m][0], w0, a[m].q + g * 32, sf[g] * a[m].d[g]);
        acc[m][1] = fma_u4(acc[m][1], w1, a[m].q + g * 32 + 32, sf[g + 1] * a[m].d[g + 1]);
      }
    }
    if (g < groups) {
      const WBlock w0 = load_w_u4(qn + g * 16);
      for (int m = 0; m < MR; ++m) acc[m][0] = fma_u4(acc[m][0], w0, a[m].q + g * 32, sf[g] * a[m].d[g]);
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) {
      const float zsum = dot_n(zf, a[m].sum, groups);  // the zero-point term (cpu_common.h: why not omp simd)
      y[m * N + n] = facc_sum(acc[m][0] + acc[m][1]) + zsum + add;
    }
  }
}

// MR rows of int8 activations against int8 weights (per-channel scale); K a multiple of 16: a last block of 16
// reads its weights through a zero-padded copy (the activations are padded with zeros too).
template <int MR>
void int8_rows_q8(const Q8Row* a, int64_t K, const int8_t* q, const float* scale, const float* bias, float* y,
                  int64_t N, int64_t n0, int64_t n1) {
  const int64_t full = K / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* qn = q + n * K;
    facc acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = facc_zero();
    int64_t b = 0;
    for (; b + 2 <= full; b += 2) {
      const WBlock w0 = load_w_s8(qn + b * 32), w1 = load_w_s8(qn + b * 32 + 32);
      for (int m = 0; m < MR; ++m) {
        acc[m][0] = fma_s8(acc[m][0], w0, a[m].q + b * 32, a[m].d[b]);
        acc[m][1] = fma_s8(acc[m][1], w1, a[m].q + b * 32 + 32, a[m].d[b + 1]);
      }
    }
    for (; b * 32 < K; ++b) {
      alignas(32) int8_t pad[32] = {};
      std::memcpy(pad, qn + b * 32, (size_t)std::min<int64_t>(32, K - b * 32));
      const WBlock w0 = load_w_s8(pad);
      for (int m = 0; m < MR; ++m) acc[m][0] = fma_s8(acc[m][0], w0, a[m].q + b * 32, a[m].d[b]);
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = facc_sum(acc[m][0] + acc[m][1]) * scale[n] + add;
  }
}
#endif

#if defined(SGLPY_Q8_TILE)
// A tile reads its 8 channels' rows a block at a time, 8 places at once: the hardware prefetchers, which follow one
// ascending stream, leave each line a DRAM round trip (the int8 lm_head ran at a quarter of the 1-row layout's
// bandwidth). So each block also prefetches its share of the lines of the tile PREFETCH_TILES ahead.
constexpr int64_t PREFETCH_TILES = 2;
struct PrefetchShare {  // lines of `bytes` from base in `parts` equal shares (the divisions out of the block loop)
  int64_t lines, per;
  PrefetchShare(int64_t bytes, int64_t parts) : lines((bytes + 63) / 64), per((lines + parts - 1) / parts) {}
  void operator()(const void* base, int64_t part) const {
    const char* p = static_cast<const char*>(base);
    for (int64_t i = part * per; i < std::min(lines, (part + 1) * per); ++i) __builtin_prefetch(p + i * 64);
  }
};

// Tiles t0 .. t1 (channels 8 t .. 8 t + 7) of int4 weights for MR rows of int8 activations, V::LANES / 8 tiles a
// step (q8_dot.h: Lanes8, Lanes16). Per group and row: y += d * (s * (codes . xq) + z' * sum(xq)), lane-wise; a
// row's lanes run the same operations in the same order whatever the other rows are, and whatever the lane width.
template <typename V, int MR>
void int4_tiles_q8(const Q8Pass& a, int64_t K, const uint8_t* q, const uint16_t* sz, const float* bias, float* y,
                   int64_t N, int64_t t0, int64_t t1) {
  constexpr int64_t STEP = V::LANES / TILE;
  const int64_t groups = K / 32, tile_q = TILE * groups * 16, tile_s = groups * 16;
  const PrefetchShare pf_q(STEP * tile_q, groups), pf_s(STEP * tile_s * 2, groups);
  for (int64_t t = t0; t < t1; t += STEP) {
    const uint8_t* qt = q + t * tile_q;
    const uint16_t* st = sz + t * tile_s;
    typename V::F acc[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) acc[m] = V::zero();
    for (int64_t g = 0; g < groups; ++g) {
      pf_q(qt + PREFETCH_TILES * tile_q, g);
      pf_s(st + PREFETCH_TILES * tile_s, g);
      typename V::Tile w;
      V::load_u4(qt + g * 16, groups * 16, w);
      const typename V::F s = V::bf16(st + g * 16, tile_s);
      const typename V::F z = V::fnmadd(V::set1(8.f), s, V::bf16(st + g * 16 + 8, tile_s));  // z - 8 s
      const int8_t* xg = a.q + g * PASS * QBLOCK;  // the pass's rows of block g, side by side
      const float *dg = a.d + g * PASS, *qg = a.qsf + g * PASS;
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const typename V::F dot = V::dot_u4(w, xg + m * QBLOCK);
        const typename V::F r = V::fmadd(dot, s, V::mul(z, V::set1(qg[m])));
        acc[m] = V::fmadd(r, V::set1(dg[m]), acc[m]);
      }
    }
    const typename V::F b = bias != nullptr ? V::load(bias + t * TILE) : V::zero();
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) V::store(y + m * N + t * TILE, V::add(acc[m], b));
  }
}

// Tiles t0 .. t1 of int8 weights (per-channel scale) for MR rows: y = s * sum_b d_b (w . xq)_b. A last block of 16
// inputs reads its weights through a zero-padded copy (the activations are zero-padded too).
template <typename V, int MR>
void int8_tiles_q8(const Q8Pass& a, int64_t K, const int8_t* q, const float* scale, const float* bias, float* y,
                   int64_t N, int64_t t0, int64_t t1) {
  constexpr int64_t STEP = V::LANES / TILE;
  const int64_t full = K / 32, blocks = (K + 31) / 32;
  const PrefetchShare pf(STEP * TILE * K, blocks);
  for (int64_t t = t0; t < t1; t += STEP) {
    const int8_t* qt = q + t * TILE * K;
    typename V::F acc[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) acc[m] = V::zero();
    for (int64_t b = 0; b < blocks; ++b) {
      pf(qt + PREFETCH_TILES * TILE * K, b);
      typename V::Tile w;
      if (b < full) {
        V::load_s8(qt + b * 32, K, w);
      } else {
        alignas(64) int8_t pad[V::LANES * 32] = {};
        for (int c = 0; c < V::LANES; ++c) std::memcpy(pad + c * 32, qt + c * K + b * 32, (size_t)(K - b * 32));
        V::load_s8(pad, 32, w);
      }
      const int8_t* xb = a.q + b * PASS * QBLOCK;
      const float* db = a.d + b * PASS;
      const int32_t* sb = a.qs + b * PASS;
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m] = V::fmadd(V::dot_s8(w, xb + m * QBLOCK, sb[m]), V::set1(db[m]), acc[m]);
    }
    const typename V::F sc = V::load(scale + t * TILE);
    const typename V::F bb = bias != nullptr ? V::load(bias + t * TILE) : V::zero();
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) V::store(y + m * N + t * TILE, V::fmadd(acc[m], sc, bb));
  }
}

// Tiles t0 .. t1 through run(lanes, a, b): pairs of tiles 16 lanes wide where the build has them, the rest 8 wide.
template <typename Run>
void over_tiles(int64_t t0, int64_t t1, Run run) {
#if defined(SGLPY_Q8_TILE16)
  const int64_t paired = t0 + (t1 - t0) / 2 * 2;
  run(Lanes16{}, t0, paired);
  t0 = paired;
#endif
  run(Lanes8{}, t0, t1);
}
#endif

#if defined(SGLPY_Q8_I16)
// SSE2 (pmaddwd): one output channel at a time against the pass's rows, read side by side per block (Q8Pass). A
// block's weights are widened to int16 once (q8_dot.h) for every row; per row, 4 pmaddwd and 3 paddd give the
// block's exact integer sums in 4 lanes, then one convert, the scaling (the row's d from a pre-broadcast memory
// operand) and one add to the row's accumulator. A row runs the same operations whatever the other rows are.
template <int MR>
void int4_channels_i16(const Q8Row* r, const Q8Pass& a, int64_t K, const uint8_t* q, const uint16_t* sz,
                       const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / 32;
  float sf[MAX_GROUPS], zf[MAX_GROUPS];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qn = q + n * groups * 16;
    int4_channel_scales(sz, groups, n, sf, zf);
    __m128 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const WBlock w = load_w_u4(qn + g * 16);
      const __m128 s = _mm_set1_ps(sf[g]);
      const int16_t* xg = a.q + g * PASS * QBLOCK;
      const float* dg = a.d4 + g * PASS * 4;
      for (int m = 0; m < MR; ++m) {
        const __m128 dot = _mm_cvtepi32_ps(dot_i16(w, xg + m * QBLOCK));
        acc[m] = _mm_add_ps(acc[m], _mm_mul_ps(_mm_mul_ps(dot, s), _mm_load_ps(dg + m * 4)));
      }
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) {
      const float zsum = dot_n(zf, r[m].sum, groups);  // the zero-point term, as int4_rows_q8
      y[m * N + n] = facc_sum(acc[m]) + zsum + add;
    }
  }
}

// int8 weights: y = scale * sum_b d_b (w . xq)_b (w * 256 in the integer sums: S8_UNIT folds it into the scale). A
// last block of 16 inputs reads its weights through a zero-padded copy (the activations are zero-padded too).
template <int MR>
void int8_channels_i16(const Q8Pass& a, int64_t K, const int8_t* q, const float* scale, const float* bias, float* y,
                       int64_t N, int64_t n0, int64_t n1) {
  const int64_t full = K / 32, blocks = (K + 31) / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* qn = q + n * K;
    __m128 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      WBlock w;
      if (b < full) {
        w = load_w_s8(qn + b * 32);
      } else {
        alignas(16) int8_t pad[32] = {};
        std::memcpy(pad, qn + b * 32, (size_t)(K - b * 32));
        w = load_w_s8(pad);
      }
      const int16_t* xb = a.q + b * PASS * QBLOCK;
      const float* db = a.d4 + b * PASS * 4;
      for (int m = 0; m < MR; ++m)
        acc[m] = _mm_add_ps(acc[m], _mm_mul_ps(_mm_cvtepi32_ps(dot_i16(w, xb + m * QBLOCK)), _mm_load_ps(db + m * 4)));
    }
    const float sc = scale[n] * S8_UNIT, add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = facc_sum(acc[m]) * sc + add;
  }
}
#endif
#endif  // SGLPY_Q8_ACT

}  // namespace
}  // namespace sglpy
