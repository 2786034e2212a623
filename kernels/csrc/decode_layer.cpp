// One Llama decoder layer of a decode step, for weight-only quantized projections in the native layout: the per-op
// kernels chained here, so Python makes one call per layer instead of ~10 (each with its checks, views and
// allocations: ~100 us per layer at batch 1, a third of the step).
//   residual += x (first layer: residual = x); h = rmsnorm1(residual); qkv = h Wqkv^T (+ b); rotary on q, k;
//   k, v -> pool; a = attention(q); x = a Wo^T; residual += x; h = rmsnorm2(residual);
//   x = silu(h Wg^T) * (h Wu^T) Wd^T
// With LoRA adapters (sglpy_decode_layer_lora), each adapted projection's output gets its rows' segmented LoRA
// deltas (lora.cpp, the same entry point the per-op path calls) right after its GEMV: q/k/v before rotary.
// Oracle: the model's per-op path (runtime/model/llama.py, tests/runtime/test_cpu_kernels_engine.py).
// Struct layouts are mirrored by ctypes Structures in kernels/decode_layer_cpu.py.
#include <vector>

#include "cpu_common.h"
#include "kernels.h"

namespace sglpy {
namespace {

struct QLinear {  // one projection: kind 0 = int8 (scales float32 [N]), 1 = int4 (scales bf16 [N, 2, K / 32])
  int64_t kind;
  const void* q;
  const void* scales;
  const float* bias;  // nullable
  int64_t n, k;
};

int64_t gemv(const QLinear& w, const float* x, int64_t M, float* y, int32_t nthreads) {
  if (w.kind == 0)
    return sglpy_gemv_int8(x, M, w.k, static_cast<const int8_t*>(w.q), static_cast<const float*>(w.scales), w.bias,
                           y, w.n, nthreads);
  return sglpy_gemv_int4(x, M, w.k, static_cast<const uint8_t*>(w.q), static_cast<const uint16_t*>(w.scales),
                         w.bias, y, w.n, nthreads);
}

}  // namespace
}  // namespace sglpy

using namespace sglpy;

struct SglpyDecodeLayer {  // per layer, built once at load
  QLinear qkv, o, gate_up, down;
  const float* norm1;
  const float* norm2;
  int64_t layer, heads, kv_heads, head_dim, hidden, intermediate;
  float eps, scale;
};

struct SglpyDecodeStep {  // per forward, shared by every layer
  const int64_t* positions;  // [M]
  const float* cos_sin;      // [max_pos, head_dim] float32
  int64_t max_pos;
  char* k_base;  // the pools [layers, slots, kv_heads, head_dim]: layer l at base + l * layer_bytes
  char* v_base;
  int64_t layer_bytes, num_slots, kv_row;
  int32_t kv_dtype, nthreads;
  const int64_t* loc;  // [M] slot of each row's new token
  const int32_t* req_to_token;
  int64_t r2t_rows, r2t_stride;
  const int64_t* rows;  // [M]
  const int64_t* lens;  // [M]
};

struct SglpyLoraProj {  // one fused projection's adapter pool (lora.cpp's layout); a == nullptr: not adapted
  const void* a;   // [slots, n_slices * pool_rank, in]
  const void* bt;  // [slots, pool_rank, out]
  const int64_t* offsets;  // [n_slices + 1] output columns of each slice
  int64_t n_slices;
};

struct SglpyLoraLayer {  // per layer, built once with the pool
  SglpyLoraProj qkv, o, gate_up, down;
};

struct SglpyLoraStep {  // per forward: the adapter rows grouped by adapter (kernels/lora.py:LoraSegments)
  const int64_t* rows;
  const int64_t* indptr;
  const int64_t* slots;
  const int64_t* ranks;
  int64_t n_seg, num_slots, pool_rank;
  int32_t w_dtype;
};

namespace {

int64_t lora(const SglpyLoraProj& p, const SglpyLoraStep* LS, const float* x, int64_t n_in, float* y, int64_t n_out,
             int64_t M, int32_t nt) {
  if (LS == nullptr || p.a == nullptr) return 0;
  return sglpy_lora_delta(x, n_in, y, n_out, p.a, p.bt, LS->w_dtype, n_in, LS->pool_rank, p.n_slices, p.offsets,
                          LS->rows, LS->indptr, LS->slots, LS->ranks, LS->n_seg, LS->num_slots, M, nt);
}

// the layer; prefix == nullptr: decode attention, else each row a one-token extend (prefix/ext/start [M])
// LL / LS == nullptr: no adapters
int64_t run_layer(const SglpyDecodeLayer* L, const SglpyDecodeStep* S, float* x, float* residual, int32_t first,
                  int64_t M, const int64_t* prefix, const int64_t* ext, const int64_t* start,
                  const SglpyLoraLayer* LL = nullptr, const SglpyLoraStep* LS = nullptr) {
  if (LL == nullptr) LS = nullptr;
  const int64_t hidden = L->hidden, qkv_w = L->qkv.n, attn_w = L->heads * L->head_dim;
  const int32_t nt = S->nthreads;
  // scratch: h [M, hidden], qkv [M, qkv_w], attn [M, attn_w], gate_up [M, 2I], act [M, I]
  thread_local std::vector<float> scratch;
  const size_t need = (size_t)(M * (hidden + qkv_w + attn_w + 3 * L->intermediate));
  if (scratch.size() < need) scratch.resize(need);
  float* h = scratch.data();
  float* qkv = h + M * hidden;
  float* attn = qkv + M * qkv_w;
  float* gate_up = attn + M * attn_w;
  float* act = gate_up + M * 2 * L->intermediate;
  void* k_cache = S->k_base + L->layer * S->layer_bytes;
  void* v_cache = S->v_base + L->layer * S->layer_bytes;

  sglpy_rmsnorm(x, first ? nullptr : residual, L->norm1, L->eps, h, residual, M, hidden, nt);
  if (first) std::memcpy(residual, x, sizeof(float) * M * hidden);
  gemv(L->qkv, h, M, qkv, nt);
  int64_t rc = LS ? lora(LL->qkv, LS, h, hidden, qkv, qkv_w, M, nt) : 0;
  if (rc != 0) return 3000000000;
  rc = sglpy_rotary_store(qkv, M, qkv_w, L->heads, L->kv_heads, L->head_dim, S->cos_sin, S->max_pos,
                          S->positions, k_cache, v_cache, S->kv_dtype, S->num_slots, S->kv_row, S->loc, nt);
  if (rc != 0) return 1000000000 + rc;
  if (prefix == nullptr)
    rc = sglpy_decode_attention(qkv, qkv_w, k_cache, v_cache, S->kv_dtype, S->num_slots, S->kv_row,
                                S->req_to_token, S->r2t_rows, S->r2t_stride, S->rows, S->lens, attn, M, L->heads,
                                L->kv_heads, L->head_dim, L->scale, nt);
  else
    rc = sglpy_extend_attention(qkv, qkv_w, k_cache, v_cache, S->kv_dtype, S->num_slots, S->kv_row,
                                S->req_to_token, S->r2t_rows, S->r2t_stride, S->rows, prefix, ext, start, attn, M,
                                L->heads, L->kv_heads, L->head_dim, L->scale, nt);
  if (rc != 0) return 2000000000 + rc;
  gemv(L->o, attn, M, x, nt);
  if (LS && lora(LL->o, LS, attn, attn_w, x, hidden, M, nt) != 0) return 3000000000;
  sglpy_rmsnorm(x, residual, L->norm2, L->eps, h, residual, M, hidden, nt);
  gemv(L->gate_up, h, M, gate_up, nt);
  if (LS && lora(LL->gate_up, LS, h, hidden, gate_up, 2 * L->intermediate, M, nt) != 0) return 3000000000;
  sglpy_silu_mul(gate_up, M, L->intermediate, act, nt);
  gemv(L->down, act, M, x, nt);
  if (LS && lora(LL->down, LS, act, L->intermediate, x, hidden, M, nt) != 0) return 3000000000;
  return 0;
}

}  // namespace

// x, residual: float32 [M, hidden], updated in place (x -> the layer's output; residual -> the residual stream;
// first != 0: residual is only written). Returns 0, or the failing kernel's code offset by its stage:
// 1'000'000'000 + code (rotary/store), 2'000'000'000 + code (attention), 3'000'000'000 (LoRA segments out of
// range, found before that projection's delta is written); nothing past a failing stage runs.
extern "C" int64_t sglpy_decode_layer(const SglpyDecodeLayer* L, const SglpyDecodeStep* S, float* x, float* residual,
                                      int32_t first, int64_t M) {
  return run_layer(L, S, x, residual, first, M, nullptr, nullptr, nullptr);
}

// sglpy_decode_layer for deterministic inference: attention runs each row as a one-token extend (the extend
// kernel's fixed 64-key blocks from position 0, never split by the batch: the per-op path's order, docs/
// determinism.md). prefix [M] = lens - 1, ext [M] = ones, start [M] = 0 .. M - 1 (int64).
extern "C" int64_t sglpy_decode_layer_extend(const SglpyDecodeLayer* L, const SglpyDecodeStep* S, float* x,
                                             float* residual, int32_t first, int64_t M, const int64_t* prefix,
                                             const int64_t* ext, const int64_t* start) {
  return run_layer(L, S, x, residual, first, M, prefix, ext, start);
}

// sglpy_decode_layer with LoRA adapters: LL the layer's pools, LS the forward's segments (both non-null).
extern "C" int64_t sglpy_decode_layer_lora(const SglpyDecodeLayer* L, const SglpyDecodeStep* S, float* x,
                                           float* residual, int32_t first, int64_t M, const SglpyLoraLayer* LL,
                                           const SglpyLoraStep* LS) {
  return run_layer(L, S, x, residual, first, M, nullptr, nullptr, nullptr, LL, LS);
}
