// The GEMV's weight-format helpers (bf16 group scales -> float), its float-activation kernels (ARM without dotprod,
// and every level under -DSGLPY_FLOAT_ACT) and the float32-weight kernel (quantization none under deterministic
// inference). quant_gemv.cpp drives them; the weight layouts are in its header comment.
#pragma once
#include "cpu_common.h"

namespace sglpy {
namespace {

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

}  // namespace
}  // namespace sglpy
