// Dequantize rows of a natively packed weight (kernels/quant_linear_cpu.py's layout) into float32 or bf16 tiles:
// many-row calls (prefill chunks, big batches) multiply such a tile with a GEMM instead of keeping a dense copy of
// every weight beside the packed one (the copy was 2-4x the packed bytes).
#include "cpu_common.h"
#include "kernels.h"

namespace {

using namespace sglpy;

inline uint16_t to_bf16(float f) {  // round to nearest even (the weights are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
inline void put(T* out, int64_t i, float v);
template <>
inline void put<float>(float* out, int64_t i, float v) { out[i] = v; }
template <>
inline void put<uint16_t>(uint16_t* out, int64_t i, float v) { out[i] = to_bf16(v); }

// int8: q [N, K] int8, scale float32 [N] -> out [n1 - n0, K]
template <typename T>
void dequant_int8(const int8_t* q, const float* scale, int64_t K, int64_t n0, int64_t n1, T* out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    T* o = out + (n - n0) * K;
    const float s = scale[n];
#pragma omp simd
    for (int64_t k = 0; k < K; ++k) put(o, k, static_cast<float>(row[k]) * s);
  }
}

// int4: q [N, K / 32, 16] (byte i: input i low nibble, input i + 16 high), sz bf16 [ceil(N / 8), K / 32, 2, 8]
// -> out [n1 - n0, K], w = (code - 8) * scale + zero
template <typename T>
void dequant_int4(const uint8_t* q, const uint16_t* sz, int64_t K, int64_t n0, int64_t n1, T* out, int nthreads) {
  const int64_t groups = K / 32;
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * groups * 16;
    const uint16_t* tile = sz + (n / 8) * groups * 16;
    T* o = out + (n - n0) * K;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = bf16_value(tile[g * 16 + n % 8]);
      const float z = bf16_value(tile[g * 16 + 8 + n % 8]) - 8.0f * s;
      const uint8_t* b = row + g * 16;
      T* og = o + g * 32;
#pragma omp simd
      for (int i = 0; i < 16; ++i) {
        put(og, i, static_cast<float>(b[i] & 15) * s + z);
        put(og, i + 16, static_cast<float>(b[i] >> 4) * s + z);
      }
    }
  }
}

}  // namespace

// kind 0 = int8, 1 = int4; out_dtype: DType F32 or BF16. Rows n0 .. n1 - 1 of the packed weight. Returns 0, or -1
// for an argument it cannot serve.
extern "C" int64_t sglpy_dequant_rows(int32_t kind, const void* q, const void* scales, int64_t K, int64_t n0,
                                      int64_t n1, void* out, int32_t out_dtype, int32_t nthreads) {
  if (n0 < 0 || n1 < n0 || (kind == 1 && K % 32) || (out_dtype != F32 && out_dtype != BF16) || kind < 0 || kind > 1)
    return -1;
  const bool f32 = out_dtype == F32;
  if (kind == 0) {
    auto* qw = static_cast<const int8_t*>(q);
    auto* s = static_cast<const float*>(scales);
    if (f32) dequant_int8(qw, s, K, n0, n1, static_cast<float*>(out), nthreads);
    else dequant_int8(qw, s, K, n0, n1, static_cast<uint16_t*>(out), nthreads);
  } else {
    auto* qw = static_cast<const uint8_t*>(q);
    auto* s = static_cast<const uint16_t*>(scales);
    if (f32) dequant_int4(qw, s, K, n0, n1, static_cast<float*>(out), nthreads);
    else dequant_int4(qw, s, K, n0, n1, static_cast<uint16_t*>(out), nthreads);
  }
  return 0;
}
