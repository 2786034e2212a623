// Paged decode attention on CPU: each request's one query over its first lens[i] cached tokens, K/V read in place
// through req_to_token (no gather, no padding), every query head of a kv head sharing one pass over its K/V rows.
// A sliding window (Gemma 2/3, Phi-3, Mistral) reads only each request's last `window` keys: the keys before it are
// never loaded. Soft-capping (Gemma 2) maps each scaled score s to tanh(s / cap) * cap before the softmax.
// Oracle: kernels/decode_attention.py:decode_attention_reference (tests/kernels/test_kernels_cpu_native.py).
#include <vector>

#include "cpu_common.h"
#include "kernels.h"

namespace sglpy {
namespace {

constexpr int64_t BLOCK = 64;    // keys scored before one softmax update (= softmax_block's 4 vectors)
constexpr int64_t PREFETCH = 6;  // keys ahead whose K/V rows are prefetched (scattered slots are latency-bound)
constexpr int64_t MAX_NV = 16;   // head_dim <= 256, a multiple of 16 (kernels/decode_attention_cpu.py:supports)

struct Args {
  const float* q;  // [b, H, D], rows q_row elements apart (a view into a fused qkv row is read in place)
  int64_t q_row;
  const void* k;   // [slots, Hkv, D] rows `row` elements apart
  const void* v;
  int64_t num_slots, row;
  const int32_t* r2t;  // [r2t_rows, r2t_stride]
  int64_t r2t_rows, r2t_stride;
  const int64_t* rows;  // [b]
  const int64_t* lens;  // [b]
  float* out;           // [b, H, D]
  int64_t b, H, Hkv, D;
  float scale;
  int64_t window;  // > 0: request i reads keys [lens[i] - window, lens[i]) only; 0: all of them
  float softcap;   // > 0: scores become tanh(s / softcap) * softcap; 0: as they are
};

// Key range [first, lens[i]) of request i (its window, or all its keys).
inline int64_t first_key(const Args& a, int64_t i) {
  return a.window > 0 ? std::max<int64_t>(0, a.lens[i] - a.window) : 0;
}

// Softmax state of one (request, key range) for all H heads: running max m, sum l, unnormalized acc [H, D].
// NV = head_dim / 16 vectors, fixed at compile time for 64 and 128 (a head's accumulator then lives in registers
// while a block's V rows stream through); NV == 0 reads it from the arguments (head_dim <= 256).
// Returns false when a slot id is out of range (nothing is read there).
template <typename KV, int NV>
bool attend(const Args& a, int64_t i, int64_t lo, int64_t hi, float* m, float* l, float* acc) {
  const int64_t H = a.H, nv = NV > 0 ? NV : a.D / W, D = nv * W, G = a.H / a.Hkv, Hkv = a.Hkv, row = a.row;
  const float* q = a.q + i * a.q_row;
  const int32_t* slots = a.r2t + a.rows[i] * a.r2t_stride;
  const KV* kc = static_cast<const KV*>(a.k);
  const KV* vc = static_cast<const KV*>(a.v);
  std::vector<float> s((size_t)(H * BLOCK));  // scores of one block [H, BLOCK]
  int64_t base[BLOCK];                          // element offset of each key's slot row
  vf k[MAX_NV];
  vn r[MAX_NV * (W / NW)];
  for (int64_t h = 0; h < H; ++h) m[h] = -INFINITY, l[h] = 0.f;
  std::fill(acc, acc + H * D, 0.f);
  for (int64_t j0 = lo; j0 < hi; j0 += BLOCK) {
    const int64_t n = std::min(BLOCK, hi - j0);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = slots[j0 + j];
      if (slot < 0 || slot >= a.num_slots) return false;
      base[j] = slot * row;
    }
    for (int64_t j = 0; j < n; ++j) {  // scores: each K row loaded once, shared by its G query heads
      if (j0 + j + PREFETCH < hi) {
        // K: scattered slots only (a contiguous run is what the hardware prefetcher already streams); V always: the
        // P V loop reads the block's V rows only after its scores and softmax, and nothing streams them before
        const int64_t ahead = slots[j0 + j + PREFETCH];
        if (ahead >= 0 && ahead < a.num_slots) {
          const bool scattered = ahead != slots[j0 + j] + PREFETCH;
          const char* pk = reinterpret_cast<const char*>(kc + ahead * row);
          const char* pv = reinterpret_cast<const char*>(vc + ahead * row);
          for (int64_t c = 0; c < Hkv * D * (int64_t)sizeof(KV); c += 64) {
            if (scattered) __builtin_prefetch(pk + c);
            __builtin_prefetch(pv + c);
          }
        }
      }
      for (int64_t kh = 0; kh < Hkv; ++kh) {
        const KV* kr = kc + base[j] + kh * D;
        for (int64_t v = 0; v < nv; ++v) k[v] = load(kr + v * W);
        for (int64_t g = 0; g < G; ++g) {
          const float* qh = q + (kh * G + g) * D;
          vf t = k[0] * load(qh);
          for (int64_t v = 1; v < nv; ++v) t += k[v] * load(qh + v * W);
          s[(kh * G + g) * BLOCK + j] = hsum(t) * a.scale;
        }
      }
    }
    if (a.softcap > 0.f) {  // Gemma 2: capped before the max is taken (it bounds every score)
      const float cap = a.softcap, inv = 1.0f / a.softcap;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < n; ++j) s[h * BLOCK + j] = std::tanh(s[h * BLOCK + j] * inv) * cap;
    }
    for (int64_t h = 0; h < H; ++h) {  // online softmax: rescale what came before to the new max
      float* sh = s.data() + h * BLOCK;
      const float c = softmax_block(sh, n, m[h], l[h]);  // the first block has n >= 1: m is finite after it
      // P V: the head's accumulator stays in registers (native-width vectors: cpu_common.h, NW) while the block's V
      // rows stream through
      float* ah = acc + h * D;
      const int64_t voff = (h / G) * D, nn = nv * (W / NW);
      for (int64_t u = 0; u < nn; ++u) r[u] = loadn(ah + u * NW) * c;
      for (int64_t j = 0; j < n; ++j) {
        const float p = sh[j];
        const KV* vr = vc + base[j] + voff;
        for (int64_t u = 0; u < nn; ++u) r[u] += p * loadn(vr + u * NW);
      }
      for (int64_t u = 0; u < nn; ++u) storen(ah + u * NW, r[u]);
    }
  }
  return true;
}

template <typename KV>
bool attend_any(const Args& a, int64_t i, int64_t lo, int64_t hi, float* m, float* l, float* acc) {
  switch (a.D) {
    case 64: return attend<KV, 4>(a, i, lo, hi, m, l, acc);
    case 128: return attend<KV, 8>(a, i, lo, hi, m, l, acc);
    default: return attend<KV, 0>(a, i, lo, hi, m, l, acc);
  }
}

enum Problem : int64_t { BAD_SLOT = 0, BAD_LEN = 1, BAD_ROW = 2 };  // decoded by kernels/decode_attention_cpu.py

struct Task {
  int64_t req, lo, hi, part;  // part: index of the partial-state slot, -1 = writes the output directly
};

template <typename KV>
int64_t run(const Args& a, int32_t nthreads) {
  const int64_t H = a.H, D = a.D;
  for (int64_t i = 0; i < a.b; ++i) {  // cheap host-side checks first: nothing is read for a bad batch
    if (a.rows[i] < 0 || a.rows[i] >= a.r2t_rows) return 1 + 4 * i + BAD_ROW;
    if (a.lens[i] < 1 || a.lens[i] > a.r2t_stride) return 1 + 4 * i + BAD_LEN;
  }
  // Requests longer than CHUNK keys split into chunks of CHUNK keys from their first key (flash-decoding: every
  // thread has work), merged below in chunk order. The chunks follow from the request's own length alone, never
  // from the batch, so a row's bits are the same alone, in any batch, and as a speculative verify row.
  constexpr int64_t chunk = 256;
  std::vector<Task> tasks;
  int64_t parts = 0;
  for (int64_t i = 0; i < a.b; ++i) {
    const int64_t first = first_key(a, i);
    if (a.lens[i] - first <= chunk) {
      tasks.push_back({i, first, a.lens[i], -1});
      continue;
    }
    for (int64_t lo = first; lo < a.lens[i]; lo += chunk)
      tasks.push_back({i, lo, std::min(a.lens[i], lo + chunk), parts++});
  }
  const int64_t stride = H * (D + 2);  // one partial: m [H], l [H], acc [H, D]
  std::vector<float> partial((size_t)(parts * stride));
  int64_t bad = INT64_MAX;  // smallest request index with an out-of-range slot
  const int64_t T = (int64_t)tasks.size();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (T > 1 && nthreads > 1)
  for (int64_t t = 0; t < T; ++t) {
    const Task& task = tasks[t];
    std::vector<float> own;
    float* p;
    if (task.part >= 0) {
      p = partial.data() + task.part * stride;
    } else {
      own.resize((size_t)stride);
      p = own.data();
    }
    if (!attend_any<KV>(a, task.req, task.lo, task.hi, p, p + H, p + 2 * H)) {
#pragma omp critical(sglpy_decode_bad)
      bad = std::min(bad, task.req);
      continue;
    }
    if (task.part < 0) {
      float* o = a.out + task.req * H * D;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) o[h * D + d] = p[2 * H + h * D + d] / p[H + h];
    }
  }
  if (bad != INT64_MAX) return 1 + 4 * bad + BAD_SLOT;
  for (int64_t t = 0; t < T;) {  // merge the chunks of each split request
    if (tasks[t].part < 0) {
      ++t;
      continue;
    }
    int64_t u = t;
    while (u < T && tasks[u].req == tasks[t].req) ++u;
    float* o = a.out + tasks[t].req * H * D;
    for (int64_t h = 0; h < H; ++h) {
      float mx = -INFINITY, l = 0.f;
      for (int64_t w = t; w < u; ++w) mx = std::max(mx, partial[tasks[w].part * stride + h]);
      std::fill(o + h * D, o + (h + 1) * D, 0.f);
      for (int64_t w = t; w < u; ++w) {
        const float* p = partial.data() + tasks[w].part * stride;
        const float c = exp_f32(p[h] - mx);
        l += p[H + h] * c;
        for (int64_t d = 0; d < D; ++d) o[h * D + d] += c * p[2 * H + h * D + d];
      }
      for (int64_t d = 0; d < D; ++d) o[h * D + d] /= l;
    }
    t = u;
  }
  return 0;
}

}  // namespace
}  // namespace sglpy

// Returns 0, -1 for an unknown kv_dtype, or 1 + 4 * i + problem for the first bad request i: BAD_SLOT (a slot id
// outside [0, num_slots)), BAD_LEN (lens[i] outside [1, r2t_stride]), BAD_ROW (rows[i] outside [0, r2t_rows)).
// window > 0: each request attends to its last `window` keys only; softcap > 0: scores -> tanh(s / cap) * cap.
extern "C" int64_t sglpy_decode_attention_windowed(const float* q, int64_t q_row, const void* k_cache,
                                                   const void* v_cache, int32_t kv_dtype, int64_t num_slots,
                                                   int64_t kv_row, const int32_t* req_to_token, int64_t r2t_rows,
                                                   int64_t r2t_stride, const int64_t* rows, const int64_t* lens,
                                                   float* out, int64_t b, int64_t heads, int64_t kv_heads,
                                                   int64_t head_dim, float scale, int64_t window, float softcap,
                                                   int32_t nthreads) {
  using namespace sglpy;
  const Args a{q, q_row, k_cache, v_cache, num_slots, kv_row, req_to_token, r2t_rows, r2t_stride, rows, lens, out,
               b, heads, kv_heads, head_dim, scale, std::max<int64_t>(window, 0), std::max(softcap, 0.f)};
  switch (kv_dtype) {
    case F32: return run<float>(a, nthreads);
    case BF16: return run<bf16_t>(a, nthreads);
    case F16: return run<f16_t>(a, nthreads);
    default: return -1;
  }
}

// sglpy_decode_attention_windowed without a window or a soft-cap (full causal attention).
extern "C" int64_t sglpy_decode_attention(const float* q, int64_t q_row, const void* k_cache, const void* v_cache,
                                          int32_t kv_dtype, int64_t num_slots, int64_t kv_row,
                                          const int32_t* req_to_token, int64_t r2t_rows, int64_t r2t_stride,
                                          const int64_t* rows, const int64_t* lens, float* out, int64_t b,
                                          int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                                          int32_t nthreads) {
  return sglpy_decode_attention_windowed(q, q_row, k_cache, v_cache, kv_dtype, num_slots, kv_row, req_to_token,
                                         r2t_rows, r2t_stride, rows, lens, out, b, heads, kv_heads, head_dim, scale,
                                         0, 0.f, nthreads);
}
