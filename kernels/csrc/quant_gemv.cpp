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
#include "gemv_q8.h"

namespace sglpy {
namespace {

constexpr int64_t ROW_BLOCK = 16;    // output rows per scheduling unit (parallel over N)

#if defined(SGLPY_Q8_ACT)
// The activations of one call, quantized once before the row blocks split across threads.
struct Q8Acts {
  std::vector<qact_t> q;
  std::vector<float> d, sum, qsf;
  std::vector<int32_t> qs;
  int64_t blocks = 0;
  void quantize(const float* x, int64_t M, int64_t K, float qmax) {
    blocks = (K + QBLOCK - 1) / QBLOCK;
    q.resize((size_t)(M * blocks * QBLOCK));
    for (auto* v : {&d, &sum, &qsf}) v->resize((size_t)(M * blocks));
    qs.resize((size_t)(M * blocks));
    for (int64_t m = 0; m < M; ++m) {
      const int64_t o = m * blocks;
      quantize_row_q8(x + m * K, K, q.data() + o * QBLOCK, d.data() + o, sum.data() + o, qs.data() + o,
                      qsf.data() + o, qmax);
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
  static constexpr float QMAX = S8_QMAX;
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
    over_tiles(n0 / TILE, n0 / TILE + tiles, [&](auto lanes, int64_t u0, int64_t u1) {
      int8_tiles_q8<decltype(lanes), MR>(p, K, q, scale, bias, y, N, u0, u1);
    });
    n += tiles * TILE;
#endif
    int8_rows_q8<MR>(a, K, q, scale, bias, y, N, n, n1);
#endif
  }
};

struct Int4Weights {
  static constexpr float QMAX = 127.f;
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
    over_tiles(n0 / TILE, n0 / TILE + tiles, [&](auto lanes, int64_t u0, int64_t u1) {
      int4_tiles_q8<decltype(lanes), MR>(p, K, q, sz, bias, y, N, u0, u1);
    });
    n += tiles * TILE;
#endif
    int4_rows_q8<MR>(a, K, q, sz, bias, y, N, n, n1);
#endif
  }
};
using Acts = Q8Acts;
#else
struct Int8Weights {
  static constexpr float QMAX = S8_QMAX;
  const int8_t* q;
  const float* scale;
  template <int MR>
  void rows(const float* x, int64_t K, const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) const {
    int8_rows<MR>(x, K, q, scale, bias, y, N, n0, n1);
  }
};

struct Int4Weights {
  static constexpr float QMAX = 127.f;
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
  void quantize(const float* x_, int64_t, int64_t K_, float) { x = x_, K = K_; }
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
  acts.quantize(x, M, K, Weights::QMAX);
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

// The largest activation code against int8 weights (q8_dot.h: S8_QMAX, 127 or 63; int4 codes always meet 127): the
// error bound of kernels/quant_linear_cpu.py:native_error_bound and the self-tests.
extern "C" int32_t sglpy_gemv_int8_weight_act_max() { return (int32_t)S8_QMAX; }

// 1 when this build quantizes the GEMV's activations to int8 (q8_dot.h), 0 when it keeps them float32: the tests'
// tolerance and get_server_info's description depend on it.
extern "C" int32_t sglpy_gemv_int8_activations() {
#if defined(SGLPY_Q8_ACT)
  return 1;
#else
  return 0;
#endif
}
