// A torch-free check of the native kernels for builds that Python cannot load here (a cross-compiled aarch64
// library run under qemu-user): linked with kernels/csrc/*.cpp into one static program, it runs the GEMVs, RMSNorm,
// SiLU-and-mul and decode attention on small inputs against plain loops and prints "ok" (exit 0) or the first
// mismatch (exit 1). Built and run by tests/kernels/test_kernels_cpu_isa.py.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../../kernels/csrc/kernels.h"

static int failures = 0;
static void expect(const char* what, int i, double got, double want, double tol) {
  if (!(std::fabs(got - want) <= tol)) {
    if (failures++ < 5) std::printf("%s[%d]: got %.6g want %.6g (tol %.3g)\n", what, i, got, want, tol);
  }
}
static float bf16(uint16_t b) {
  uint32_t w = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}
static uint16_t to_bf16(float f) {  // truncation is fine: the reference reads the same bits back
  uint32_t w;
  std::memcpy(&w, &f, 4);
  return (uint16_t)(w >> 16);
}

int main() {
  const int K = 96, N = 19, M = 3;  // N: two tiles of 8 output rows and a tail of 3
  std::vector<float> x(M * K), y(M * N);
  for (int i = 0; i < M * K; ++i) x[i] = std::sin(0.37 * i) * (1 + i % 5);
  // int8 weights, per-channel scale
  std::vector<int8_t> q8(N * K);
  std::vector<float> s8(N);
  for (int i = 0; i < N * K; ++i) q8[i] = (int8_t)((i * 37) % 255 - 127);
  for (int n = 0; n < N; ++n) s8[n] = 0.01f * (n + 1);
  const bool q8act = sglpy_gemv_int8_activations() != 0;
  sglpy_gemv_int8(x.data(), M, K, q8.data(), s8.data(), nullptr, y.data(), N, 1);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0, bound = 0;
      for (int k = 0; k < K; ++k) {
        want += q8[n * K + k] * s8[n] * (double)x[m * K + k];
        double amax = 0;  // this activation's block of 32
        for (int j = k / 32 * 32; j < k / 32 * 32 + 32; ++j) amax = std::fmax(amax, std::fabs(x[m * K + j]));
        bound += std::fabs(q8[n * K + k] * s8[n]) * amax / (2.0 * sglpy_gemv_int8_weight_act_max());
      }
      expect("gemv_int8", m * N + n, y[m * N + n], want, (q8act ? bound : 0) + 1e-4 * (1 + std::fabs(want)));
    }
  // int4: codes [N, K/32, 16] two per byte; bf16 [ceil(N/8), K/32, 2, 8]: per tile of 8 rows and group, their
  // scales, then their zeros
  const int G = K / 32;
  std::vector<uint8_t> q4(N * G * 16);
  std::vector<uint16_t> sz((N + 7) / 8 * G * 16);
  auto scale_at = [&](int n, int g) { return ((n / 8) * G + g) * 16 + n % 8; };
  for (size_t i = 0; i < q4.size(); ++i) q4[i] = (uint8_t)((i * 29 + 3) % 256);
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < G; ++g) {
      sz[scale_at(n, g)] = to_bf16(0.02f * (1 + (n + g) % 4));
      sz[scale_at(n, g) + 8] = to_bf16(-0.05f + 0.01f * g);
    }
  sglpy_gemv_int4(x.data(), M, K, q4.data(), sz.data(), nullptr, y.data(), N, 1);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0, bound = 0;
      for (int k = 0; k < K; ++k) {
        const int g = k / 32, i = k % 32;
        const uint8_t byte = q4[(n * G + g) * 16 + i % 16];
        const int code = i < 16 ? byte & 15 : byte >> 4;
        const double w = (code - 8) * bf16(sz[scale_at(n, g)]) + bf16(sz[scale_at(n, g) + 8]);
        want += w * x[m * K + k];
        double amax = 0;
        for (int j = g * 32; j < g * 32 + 32; ++j) amax = std::fmax(amax, std::fabs(x[m * K + j]));
        bound += std::fabs(w) * amax / 254.0;
      }
      expect("gemv_int4", m * N + n, y[m * N + n], want, (q8act ? bound : 0) + 1e-4 * (1 + std::fabs(want)));
    }
  // SiLU(gate) * up and RMSNorm
  const int I = 48;
  std::vector<float> gu(2 * I), act(I);
  for (int i = 0; i < 2 * I; ++i) gu[i] = (i - I) / 7.0f;
  sglpy_silu_mul(gu.data(), 1, I, act.data(), 1);
  for (int i = 0; i < I; ++i) {
    const double g = gu[i], want = g / (1 + std::exp(-g)) * gu[I + i];
    expect("silu_mul", i, act[i], want, 1e-5 * (1 + std::fabs(want)));
  }
  std::vector<float> wn(K, 1.5f), out(K), res(K);
  sglpy_rmsnorm(x.data(), nullptr, wn.data(), 1e-6f, out.data(), res.data(), 1, K, 1);
  double ss = 0;
  for (int k = 0; k < K; ++k) ss += (double)x[k] * x[k];
  for (int k = 0; k < K; ++k) expect("rmsnorm", k, out[k], 1.5 * x[k] / std::sqrt(ss / K + 1e-6), 1e-5);
  // decode attention: one request of L tokens, 2 query heads on 1 kv head, head_dim 64, float32 pool
  const int L = 70, D = 64, H = 2;
  std::vector<float> kc(L * D), vc(L * D), qv(H * D), att(H * D);
  for (int i = 0; i < L * D; ++i) {
    kc[i] = std::cos(0.11 * i);
    vc[i] = std::sin(0.07 * i);
  }
  for (int i = 0; i < H * D; ++i) qv[i] = std::sin(0.3 * i);
  std::vector<int32_t> r2t(L);
  for (int i = 0; i < L; ++i) r2t[i] = L - 1 - i;  // scattered slots
  const int64_t rows[1] = {0}, lens[1] = {L};
  const float scale = 0.125f;
  const int64_t rc = sglpy_decode_attention(qv.data(), H * D, kc.data(), vc.data(), 0, L, D, r2t.data(), 1, L, rows,
                                            lens, att.data(), 1, H, 1, D, scale, 1);
  if (rc != 0) std::printf("decode_attention returned %lld\n", (long long)rc), ++failures;
  for (int h = 0; h < H; ++h) {
    std::vector<double> p(L);
    double mx = -1e300, sum = 0;
    for (int t = 0; t < L; ++t) {
      double s = 0;
      for (int d = 0; d < D; ++d) s += qv[h * D + d] * kc[r2t[t] * D + d];
      p[t] = s * scale;
      mx = std::fmax(mx, p[t]);
    }
    for (int t = 0; t < L; ++t) sum += (p[t] = std::exp(p[t] - mx));
    for (int d = 0; d < D; ++d) {
      double want = 0;
      for (int t = 0; t < L; ++t) want += p[t] / sum * vc[r2t[t] * D + d];
      expect("decode_attention", h * D + d, att[h * D + d], want, 1e-5);
    }
  }
  if (failures) return 1;
  std::printf("ok (GEMV activations %s)\n", q8act ? "int8" : "float32");
  return 0;
}
