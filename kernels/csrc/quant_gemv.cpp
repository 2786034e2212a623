// Weight-only quantized matrix x vector for a few rows (decode): y[m, n] = sum_k W[n, k] x[m, k] (+ bias[n]),
// float32 activations in and out (no bf16 rounding), weights dequantized in registers and reused by every row.
// Oracle: kernels/quant_linear.py:quant_linear_reference (tests/kernels/test_kernels_cpu_native.py).
//   int8: q int8 [N, K], scale float32 [N] (per output channel): W = q * scale.
//   int4: q uint8 [N, K / 32, 16]: byte i of a group holds input i in its low nibble and input i + 16 in its high
//         nibble; sz bf16 [N, 2, K / 32] = each row's scales, then its zeros: W = (code - 8) * scale + zero.
#include "cpu_common.h"
#include "kernels.h"

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

// MR rows of x at once (1..8, fixed so that the accumulators stay in registers).
template <int MR>
void int8_rows(const float* x, int64_t K, const int8_t* q, const float* scale, const float* bias, float* y,
               int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* qn = q + n * K;
    vf acc[MR][2];  // two independent FMA chains per row (K is a multiple of 32 or the tail runs one)
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = vf{};
    int64_t k = 0;
    for (; k + 2 * W <= K; k += 2 * W) {
      const vf w0 = __builtin_convertvector(load_i8_i32(qn + k), vf);
      const vf w1 = __builtin_convertvector(load_i8_i32(qn + k + W), vf);
      for (int m = 0; m < MR; ++m) {
        acc[m][0] += w0 * load(x + m * K + k);
        acc[m][1] += w1 * load(x + m * K + k + W);
      }
    }
    if (k < K) {
      const vf w0 = __builtin_convertvector(load_i8_i32(qn + k), vf);
      for (int m = 0; m < MR; ++m) acc[m][0] += w0 * load(x + m * K + k);
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = hsum(acc[m][0] + acc[m][1]) * scale[n] + add;
  }
}

// A vectorized pre-pass per output row turns its bf16 (scale, zero) planes into float32 with the code offset folded
// in, W = code * s + (z - 8 s); the inner loop then dequantizes 32 weights with two FMAs (shared by the MR rows)
// and accumulates with two FMAs per row.
template <int MR>
void int4_rows(const float* x, int64_t K, const uint8_t* q, const uint16_t* sz, const float* bias, float* y,
               int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / 32;
  float sf[MAX_GROUPS], zf[MAX_GROUPS];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qn = q + n * groups * 16;
    const uint16_t* sn = sz + n * groups * 2;  // [2, groups]: scales, then zeros
    const uint16_t* zn = sn + groups;
#pragma omp simd
    for (int64_t g = 0; g < groups; ++g) {
      sf[g] = bf16_to_f32(sn[g]);
      zf[g] = bf16_to_f32(zn[g]) - 8.f * sf[g];
    }
    vf acc0[MR], acc1[MR];  // two independent FMA chains per row: one chain is latency-bound at MR = 1
    for (int m = 0; m < MR; ++m) acc0[m] = acc1[m] = vf{};
    for (int64_t g = 0; g < groups; ++g) {
      const vi wide = load_u8_i32(qn + g * 16);
      const vf s = splat(sf[g]), z = splat(zf[g]);
      const vf lo = __builtin_convertvector(wide & 15, vf) * s + z;  // weights of inputs g*32 + 0..15
      const vf hi = __builtin_convertvector(wide >> 4, vf) * s + z;  // inputs g*32 + 16..31
      for (int m = 0; m < MR; ++m) {
        const float* xm = x + m * K + g * 32;
        acc0[m] += lo * load(xm);
        acc1[m] += hi * load(xm + W);
      }
    }
    const float add = bias != nullptr ? bias[n] : 0.f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = hsum(acc0[m] + acc1[m]) + add;
  }
}

template <typename Rows>
void for_row_blocks(int64_t N, int32_t nthreads, Rows rows) {
  const int64_t blocks = (N + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) rows(blk * ROW_BLOCK, std::min(N, (blk + 1) * ROW_BLOCK));
}

// Passes of up to eight rows over the weights (each pass reads every weight once), output rows split across
// threads; Kernel::rows<MR>(m0, n0, n1) computes rows m0 .. m0 + MR of outputs n0 .. n1.
template <typename Kernel>
void passes(const Kernel& k, int64_t M, int64_t N, int32_t nthreads) {
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const int64_t mr = std::min<int64_t>(8, M - m0);
    for_row_blocks(N, nthreads, [&](int64_t n0, int64_t n1) {
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
    });
  }
}

struct Int8Kernel {
  const float* x;
  int64_t K;
  const int8_t* q;
  const float* scale;
  const float* bias;
  float* y;
  int64_t N;
  template <int MR>
  void rows(int64_t m0, int64_t n0, int64_t n1) const {
    int8_rows<MR>(x + m0 * K, K, q, scale, bias, y + m0 * N, N, n0, n1);
  }
};

struct Int4Kernel {
  const float* x;
  int64_t K;
  const uint8_t* q;
  const uint16_t* sz;
  const float* bias;
  float* y;
  int64_t N;
  template <int MR>
  void rows(int64_t m0, int64_t n0, int64_t n1) const {
    int4_rows<MR>(x + m0 * K, K, q, sz, bias, y + m0 * N, N, n0, n1);
  }
};

}  // namespace
}  // namespace sglpy

using namespace sglpy;

// x float32 [M, K], y float32 [M, N]; K a multiple of 16. Returns 0.
extern "C" int64_t sglpy_gemv_int8(const float* x, int64_t M, int64_t K, const int8_t* q, const float* scale,
                                   const float* bias, float* y, int64_t N, int32_t nthreads) {
  passes(Int8Kernel{x, K, q, scale, bias, y, N}, M, N, nthreads);
  return 0;
}

// x float32 [M, K], y float32 [M, N]; K a multiple of 32 (the group size), at most 32 * MAX_GROUPS. Returns 0.
extern "C" int64_t sglpy_gemv_int4(const float* x, int64_t M, int64_t K, const uint8_t* q, const uint16_t* sz,
                                   const float* bias, float* y, int64_t N, int32_t nthreads) {
  passes(Int4Kernel{x, K, q, sz, bias, y, N}, M, N, nthreads);
  return 0;
}
