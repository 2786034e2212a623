// Weight-only quantized matrix x vector for a few rows (decode): y[m, n] = sum_k W[n, k] x[m, k] (+ bias[n]),
// float32 activations in and out. Where the CPU has an integer dot product (q8_dot.h: AVX-512, AVX2, SSE2's
// pmaddwd, aarch64 dotprod) the activations are quantized to int8 per block of 32 and the blocks multiplied in
// integers; elsewhere (ARM without dotprod) the weights are dequantized to float in registers. Either way each
// weight is read once per pass and reused by every row of the pass. At AVX2 and AVX-512 the int8-activation kernels
// work on tiles of 8 output channels (q8_dot.h: one lane per channel), so that a row costs little more than its
// integer dot products; the last N % 8 channels and the other builds run one channel at a time (SSE2: against the
// pass's rows side by side).
// Oracle: kernels/quant_linear.py:quant_linear_reference (tests/kernels/test_kernels_cpu_native.py).
//   int8: q int8 [N, K], scale float32 [N] (per output channel): W = q * scale.
//   int4: q uint8 [N, K / 32, 16]: byte i of a group holds input i in its low nibble and input i + 16 in its high
//         nibble; sz bf16 [ceil(N / 8), K / 32, 2, 8]: per tile of 8 channels and group, their 8 scales, then their
//         8 zeros (zero-padded past N): W = (code - 8) * scale + zero.
#include <vector>

#include "cpu_common.h"
#include "kernels.h"
#include "q8_dot.h"

namespace sglpy {
namespace {

constexpr int64_t ROW_BLOCK = 16;    // output rows per scheduling unit (parallel over N)
constexpr int64_t MAX_GROUPS = 1024;  // int4: K <= 32768 (kernels/quant_linear_cpu.py checks)

static inline float bf16_to_f32(uint16_t b) {
  const uint32_t w = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// Channel n's group scales and folded zeros (W = code * s + (z - 8 s)) as float32, from the tile-major planes.
static inline void int4_channel_scales(const uint16_t* sz, int64_t groups, int64_t n, float* sf, float* zf) {
  const uint16_t* st = sz + (n / 8) * groups * 16 + n % 8;  // [groups, 2, 8] of n's tile, at n's lane
  for (int64_t g = 0; g < groups; ++g) {
    sf[g] = bf16_to_f32(st[g * 16]);
    zf[g] = bf16_to_f32(st[g * 16 + 8]) - 8.f * sf[g];
  }
}

// The float-activation kernels (ARM without dotprod; -DSGLPY_FLOAT_ACT): one native-width accumulator per row, so that 8 rows'
// accumulators and a group's dequantized weights stay in registers (with 16-float vectors, two chains per row took
// 64 of SSE2's 16 registers at 8 rows: every product went through the stack and 8 rows cost 8.4x one row). Each
// block's products are summed as a fixed pairwise tree before they meet the accumulator: short dependency chains
// at one row, and an order that depends on K alone (a row's result never depends on how many rows share the call).
static inline vn splatn(float x) {  // one broadcast (x - 0 is x, -0 included: the subtraction folds away)
  return x - vn{};
}
typedef int32_t vni __attribute__((vector_size(NW * 4)));
constexpr int HALF = (int)(16 / NW);  // native-width parts of 16 inputs
// 16 int8 weights -> float in native-width parts (widened at once: cpu_common.h, load_i8_i32)
static inline void load_i8_parts(const int8_t* p, vn* w) {
  const vf f = __builtin_convertvector(load_i8_i32(p), vf);
  std::memcpy(w, &f, sizeof f);
}
// sum_p w[p] * x[p NW ..] over P parts, as a pairwise tree
template <int P>
static inline vn tree_dot(const vn* w, const float* x) {
  if constexpr (P == 1) {
    return w[0] * loadn(x);
  } else {
    return tree_dot<P / 2>(w, x) + tree_dot<P / 2>(w + P / 2, x + (P / 2) * NW);
  }
}
// MR rows of x at once (1..8). K a multiple of 16: blocks of 32, then a last one of 16.
template <int MR>
void int8_rows(const float* x, int64_t K, const int8_t* q, const float* scale, const float* bias, float* y,
               int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* qn = q + n * K;
    vn acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = vn{};
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      vn w[2 * HALF];
      for (int h = 0; h < 2; ++h) load_i8_parts(qn + k + h * 16, w + h * HALF);
      for (int m = 0; m < MR; ++m) acc[m] += tree_dot<2 * HALF>(w, x + m * K + k);
    }
    if (k < K) {
      vn w[HALF];
      load_i8_parts(qn + k, w);
      for (int m = 0; m < MR; ++m) acc[m] += tree_dot<HALF>(w, x + m * K + k);
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = hsumn(acc[m]) * scale[n] + add;
  }
}

// float32 weights [N, K] (quantization none under deterministic inference): the same two chains per row as int8_rows,
// so a row's result never depends on how many rows share the call. K's last K % 16 inputs run as a scalar tail.
template <int MR>
void f32_rows(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N, int64_t n0,
              int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* wn = w + n * K;
    vf acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = vf{};
    int64_t k = 0;
    for (; k + 2 * W <= K; k += 2 * W) {
      const vf w0 = load(wn + k), w1 = load(wn + k + W);
      for (int m = 0; m < MR; ++m) {
        acc[m][0] += w0 * load(x + m * K + k);
        acc[m][1] += w1 * load(x + m * K + k + W);
      }
    }
    if (k + W <= K) {
      const vf w0 = load(wn + k);
      for (int m = 0; m < MR; ++m) acc[m][0] += w0 * load(x + m * K + k);
      k += W;
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) {
      float tail = 0.f;
      for (int64_t j = k; j < K; ++j) tail += wn[j] * x[m * K + j];
      y[m * N + n] = (hsum(acc[m][0] + acc[m][1]) + tail) + add;
    }
  }
}

// A vectorized pre-pass per output row turns its bf16 (scale, zero) planes into float32 with the code offset folded
// in, W = code * s + (z - 8 s); the inner loop dequantizes a group's 32 weights once for the MR rows.
template <int MR>
void int4_rows(const float* x, int64_t K, const uint8_t* q, const uint16_t* sz, const float* bias, float* y,
               int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / 32;
  float sf[MAX_GROUPS], zf[MAX_GROUPS];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qn = q + n * groups * 16;
    int4_channel_scales(sz, groups, n, sf, zf);
    vn acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = vn{};
    for (int64_t g = 0; g < groups; ++g) {
      const vn s = splatn(sf[g]), z = splatn(zf[g]);
      vni c[HALF];  // the group's 16 bytes widened at once (cpu_common.h: load_u8_i32), in native-width parts
      const vi wide = load_u8_i32(qn + g * 16);
      std::memcpy(c, &wide, sizeof c);
      vn w[2 * HALF];  // inputs g*32 + 0..15 (low nibbles), then 16..31 (high nibbles)
      for (int p = 0; p < HALF; ++p) {
        w[p] = __builtin_convertvector(c[p] & 15, vn) * s + z;
        w[p + HALF] = __builtin_convertvector(c[p] >> 4, vn) * s + z;
      }
      for (int m = 0; m < MR; ++m) acc[m] += tree_dot<2 * HALF>(w, x + m * K + g * 32);
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = hsumn(acc[m]) + add;
  }
}

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

// Tiles t0 .. t1 (channels 8 t .. 8 t + 7) of int4 weights for MR rows of int8 activations. Per group and row:
// y += d * (s * (codes . xq) + z' * sum(xq)), lane-wise; a row's lanes run the same operations in the same order
// whatever the other rows are.
template <int MR>
void int4_tiles_q8(const Q8Pass& a, int64_t K, const uint8_t* q, const uint16_t* sz, const float* bias, float* y,
                   int64_t N, int64_t t0, int64_t t1) {
  const int64_t groups = K / 32;
  const PrefetchShare pf_q(TILE * groups * 16, groups), pf_s(groups * 16 * 2, groups);
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* qt = q + t * TILE * groups * 16;
    const uint16_t* st = sz + t * groups * 16;
    __m256 acc[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      pf_q(qt + PREFETCH_TILES * TILE * groups * 16, g);
      pf_s(st + PREFETCH_TILES * groups * 16, g);
      TileBlock w;
      load_tile_u4(qt + g * 16, groups * 16, w);
      const __m256 s = bf16x8(st + g * 16);
      const __m256 z = _mm256_fnmadd_ps(_mm256_set1_ps(8.f), s, bf16x8(st + g * 16 + 8));  // z - 8 s
      const int8_t* xg = a.q + g * PASS * QBLOCK;  // the pass's rows of block g, side by side
      const float *dg = a.d + g * PASS, *qg = a.qsf + g * PASS;
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m256 dot = _mm256_cvtepi32_ps(tile_dot_u4(w, xg + m * QBLOCK));
        const __m256 r = _mm256_fmadd_ps(dot, s, _mm256_mul_ps(z, _mm256_set1_ps(qg[m])));
        acc[m] = _mm256_fmadd_ps(r, _mm256_set1_ps(dg[m]), acc[m]);
      }
    }
    const __m256 b = bias != nullptr ? _mm256_loadu_ps(bias + t * TILE) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) _mm256_storeu_ps(y + m * N + t * TILE, _mm256_add_ps(acc[m], b));
  }
}

// Tiles t0 .. t1 of int8 weights (per-channel scale) for MR rows: y = s * sum_b d_b (w . xq)_b. A last block of 16
// inputs reads its weights through a zero-padded copy (the activations are zero-padded too).
template <int MR>
void int8_tiles_q8(const Q8Pass& a, int64_t K, const int8_t* q, const float* scale, const float* bias, float* y,
                   int64_t N, int64_t t0, int64_t t1) {
  const int64_t full = K / 32, blocks = (K + 31) / 32;
  const PrefetchShare pf(TILE * K, blocks);
  for (int64_t t = t0; t < t1; ++t) {
    const int8_t* qt = q + t * TILE * K;
    __m256 acc[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      pf(qt + PREFETCH_TILES * TILE * K, b);
      TileBlock w;
      if (b < full) {
        load_tile_s8(qt + b * 32, K, w);
      } else {
        alignas(32) int8_t pad[TILE * 32] = {};
        for (int c = 0; c < TILE; ++c) std::memcpy(pad + c * 32, qt + c * K + b * 32, (size_t)(K - b * 32));
        load_tile_s8(pad, 32, w);
      }
      const int8_t* xb = a.q + b * PASS * QBLOCK;
      const float* db = a.d + b * PASS;
      const int32_t* sb = a.qs + b * PASS;
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m256 dot = _mm256_cvtepi32_ps(tile_dot_s8(w, xb + m * QBLOCK, sb[m]));
        acc[m] = _mm256_fmadd_ps(dot, _mm256_set1_ps(db[m]), acc[m]);
      }
    }
    const __m256 sc = _mm256_loadu_ps(scale + t * TILE);
    const __m256 bb = bias != nullptr ? _mm256_loadu_ps(bias + t * TILE) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) _mm256_storeu_ps(y + m * N + t * TILE, _mm256_fmadd_ps(acc[m], sc, bb));
  }
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

// The activations of one call, quantized once before the row blocks split across threads.
struct Q8Acts {
  std::vector<qact_t> q;
  std::vector<float> d, sum, qsf;
  std::vector<int32_t> qs;
  int64_t blocks = 0;
  void quantize(const float* x, int64_t M, int64_t K) {
    blocks = (K + QBLOCK - 1) / QBLOCK;
    q.resize((size_t)(M * blocks * QBLOCK));
    for (auto* v : {&d, &sum, &qsf}) v->resize((size_t)(M * blocks));
    qs.resize((size_t)(M * blocks));
    for (int64_t m = 0; m < M; ++m) {
      const int64_t o = m * blocks;
      quantize_row_q8(x + m * K, K, q.data() + o * QBLOCK, d.data() + o, sum.data() + o, qs.data() + o,
                      qsf.data() + o);
    }
#if defined(SGLPY_Q8_PASS)
    interleave(M);
#endif
  }
  Q8Row row(int64_t m) const {
    const int64_t o = m * blocks;
    return {q.data() + o * QBLOCK, d.data() + o, sum.data() + o, qs.data() + o, qsf.data() + o};
  }
#if defined(SGLPY_Q8_PASS)
  // The tile kernels' copy (and SSE2's channel kernels'): per pass of PASS rows and block, the rows' quantized
  // blocks side by side (then their d, sum(xq)): a row's data sits at a fixed offset from one pointer per block,
  // not behind a pointer of its own (with 8 rows the AVX2 loop reloaded its 24 row pointers from the stack).
  std::vector<qact_t> pq;
  std::vector<float> pd, pqsf, pd4;
  std::vector<int32_t> pqs;
  void interleave(int64_t M) {
    const int64_t passes = (M + PASS - 1) / PASS, n = passes * blocks * PASS;
    pq.assign((size_t)(n * QBLOCK), 0);
    pd.assign((size_t)n, 0.f);
    pqsf.assign((size_t)n, 0.f);
    pqs.assign((size_t)n, 0);
#if defined(SGLPY_Q8_I16)
    pd4.assign((size_t)(n * 4), 0.f);
#endif
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i = ((m / PASS) * blocks + b) * PASS + m % PASS, o = m * blocks + b;
        std::memcpy(pq.data() + i * QBLOCK, q.data() + o * QBLOCK, QBLOCK * sizeof(qact_t));
        pd[i] = d[o], pqsf[i] = qsf[o], pqs[i] = qs[o];
#if defined(SGLPY_Q8_I16)
        for (int l = 0; l < 4; ++l) pd4[i * 4 + l] = d[o];
#endif
      }
  }
  Q8Pass pass(int64_t m0) const {
    const int64_t i = (m0 / PASS) * blocks * PASS;
    return {pq.data() + i * QBLOCK, pd.data() + i, pqsf.data() + i, pqs.data() + i,
            pd4.empty() ? nullptr : pd4.data() + i * 4};
  }
#endif
};

// One weight format each: MR rows of a call's activations (from row m0) against output channels n0 .. n1.
struct Int8Weights {
  const int8_t* q;
  const float* scale;
  template <int MR>
  void rows(const Q8Row* a, const Q8Pass& p, int64_t K, const float* bias, float* y, int64_t N, int64_t n0,
            int64_t n1) const {
#if defined(SGLPY_Q8_I16)
    (void)a;
    int8_channels_i16<MR>(p, K, q, scale, bias, y, N, n0, n1);
#else
    int64_t n = n0;
#if defined(SGLPY_Q8_TILE)
    const int64_t tiles = (n1 - n0) / TILE;  // n0 is a multiple of ROW_BLOCK, hence of TILE
    int8_tiles_q8<MR>(p, K, q, scale, bias, y, N, n0 / TILE, n0 / TILE + tiles);
    n += tiles * TILE;
#endif
    int8_rows_q8<MR>(a, K, q, scale, bias, y, N, n, n1);
#endif
  }
};

struct Int4Weights {
  const uint8_t* q;
  const uint16_t* sz;
  template <int MR>
  void rows(const Q8Row* a, const Q8Pass& p, int64_t K, const float* bias, float* y, int64_t N, int64_t n0,
            int64_t n1) const {
#if defined(SGLPY_Q8_I16)
    int4_channels_i16<MR>(a, p, K, q, sz, bias, y, N, n0, n1);
#else
    int64_t n = n0;
#if defined(SGLPY_Q8_TILE)
    const int64_t tiles = (n1 - n0) / TILE;
    int4_tiles_q8<MR>(p, K, q, sz, bias, y, N, n0 / TILE, n0 / TILE + tiles);
    n += tiles * TILE;
#endif
    int4_rows_q8<MR>(a, K, q, sz, bias, y, N, n, n1);
#endif
  }
};
using Acts = Q8Acts;
#else
struct Int8Weights {
  const int8_t* q;
  const float* scale;
  template <int MR>
  void rows(const float* x, int64_t K, const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) const {
    int8_rows<MR>(x, K, q, scale, bias, y, N, n0, n1);
  }
};

struct Int4Weights {
  const uint8_t* q;
  const uint16_t* sz;
  template <int MR>
  void rows(const float* x, int64_t K, const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) const {
    int4_rows<MR>(x, K, q, sz, bias, y, N, n0, n1);
  }
};

// Float activations: the call's x itself.
struct Acts {
  const float* x = nullptr;
  int64_t K = 0;
  void quantize(const float* x_, int64_t, int64_t K_) { x = x_, K = K_; }
};
#endif

template <typename Rows>
void for_row_blocks(int64_t N, int32_t nthreads, Rows rows) {
  const int64_t blocks = (N + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) rows(blk * ROW_BLOCK, std::min(N, (blk + 1) * ROW_BLOCK));
}

// Passes of up to eight rows over the weights (each pass reads every weight once), output rows split across
// threads; Kernel::rows<MR>(m0, n0, n1) computes rows m0 .. m0 + MR of outputs n0 .. n1. Above eight rows each
// thread runs every pass over its block of output rows while those weights are in cache (prefill and big
// batches). Either way output (m, n) is the same call on the same data: its value never depends on M.
template <typename Kernel>
void run_rows(const Kernel& k, int64_t m0, int64_t mr, int64_t n0, int64_t n1) {
  switch (mr) {
    case 1: k.template rows<1>(m0, n0, n1); break;
    case 2: k.template rows<2>(m0, n0, n1); break;
    case 3: k.template rows<3>(m0, n0, n1); break;
    case 4: k.template rows<4>(m0, n0, n1); break;
    case 5: k.template rows<5>(m0, n0, n1); break;
    case 6: k.template rows<6>(m0, n0, n1); break;
    case 7: k.template rows<7>(m0, n0, n1); break;
    default: k.template rows<8>(m0, n0, n1); break;
  }
}

template <typename Kernel>
void passes(const Kernel& k, int64_t M, int64_t N, int32_t nthreads) {
  for_row_blocks(N, nthreads, [&](int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < M; m0 += 8) run_rows(k, m0, std::min<int64_t>(8, M - m0), n0, n1);
  });
}

struct F32Kernel {
  const float* x;
  int64_t K;
  const float* w;
  const float* bias;
  float* y;
  int64_t N;
  template <int MR>
  void rows(int64_t m0, int64_t n0, int64_t n1) const {
    f32_rows<MR>(x + m0 * K, K, w, bias, y + m0 * N, N, n0, n1);
  }
};

// A quantized GEMV: the call's activations (int8 blocks or float rows) against one weight format.
template <typename Weights>
struct QuantKernel {
  const Acts& a;
  int64_t K;
  Weights w;
  const float* bias;
  float* y;
  int64_t N;
  template <int MR>
  void rows(int64_t m0, int64_t n0, int64_t n1) const {
#if defined(SGLPY_Q8_ACT)
    Q8Row r[MR];
    for (int m = 0; m < MR; ++m) r[m] = a.row(m0 + m);
#if defined(SGLPY_Q8_PASS)
    const Q8Pass p = a.pass(m0);
#else
    const Q8Pass p{};
#endif
    w.template rows<MR>(r, p, K, bias, y + m0 * N, N, n0, n1);
#else
    w.template rows<MR>(a.x + m0 * K, K, bias, y + m0 * N, N, n0, n1);
#endif
  }
};

template <typename Weights>
void quant_gemv(const float* x, int64_t M, int64_t K, Weights w, const float* bias, float* y, int64_t N,
                int32_t nthreads) {
  thread_local Acts acts;
  acts.quantize(x, M, K);
  passes(QuantKernel<Weights>{acts, K, w, bias, y, N}, M, N, nthreads);
}

}  // namespace
}  // namespace sglpy

using namespace sglpy;

// x float32 [M, K], y float32 [M, N]; K a multiple of 16. Returns 0.
extern "C" int64_t sglpy_gemv_int8(const float* x, int64_t M, int64_t K, const int8_t* q, const float* scale,
                                   const float* bias, float* y, int64_t N, int32_t nthreads) {
  quant_gemv(x, M, K, Int8Weights{q, scale}, bias, y, N, nthreads);
  return 0;
}

// x float32 [M, K], y float32 [M, N]; K a multiple of 32 (the group size), at most 32 * MAX_GROUPS. Returns 0.
extern "C" int64_t sglpy_gemv_int4(const float* x, int64_t M, int64_t K, const uint8_t* q, const uint16_t* sz,
                                   const float* bias, float* y, int64_t N, int32_t nthreads) {
  quant_gemv(x, M, K, Int4Weights{q, sz}, bias, y, N, nthreads);
  return 0;
}

// x float32 [M, K], w float32 [N, K] (row-major), y float32 [M, N]; any K. Row m of y depends on row m of x alone
// (the same reduction order for every M: docs/determinism.md). Returns 0.
extern "C" int64_t sglpy_gemv_f32(const float* x, int64_t M, int64_t K, const float* w, const float* bias, float* y,
                                  int64_t N, int32_t nthreads) {
  passes(F32Kernel{x, K, w, bias, y, N}, M, N, nthreads);
  return 0;
}

// 1 when this build quantizes the GEMV's activations to int8 (q8_dot.h), 0 when it keeps them float32: the tests'
// tolerance and get_server_info's description depend on it.
extern "C" int32_t sglpy_gemv_int8_activations() {
#if defined(SGLPY_Q8_ACT)
  return 1;
#else
  return 0;
#endif
}
