// The library's C entry points (kernels/cpu_native.py:SIGNATURES declares the same for ctypes), so that one kernel
// can chain others (decode_layer.cpp).
#pragma once
#include <cstdint>

extern "C" {
int64_t sglpy_decode_attention(const float* q, int64_t q_row, const void* k_cache, const void* v_cache,
                               int32_t kv_dtype, int64_t num_slots, int64_t kv_row, const int32_t* req_to_token,
                               int64_t r2t_rows, int64_t r2t_stride, const int64_t* rows, const int64_t* lens,
                               float* out, int64_t b, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                               int32_t nthreads);
int64_t sglpy_extend_attention(const float* q, int64_t q_row, const void* k_cache, const void* v_cache,
                               int32_t kv_dtype, int64_t num_slots, int64_t kv_row, const int32_t* req_to_token,
                               int64_t r2t_rows, int64_t r2t_stride, const int64_t* rows, const int64_t* prefix,
                               const int64_t* ext, const int64_t* start, float* out, int64_t b, int64_t heads,
                               int64_t kv_heads, int64_t head_dim, float scale, int32_t nthreads);
int64_t sglpy_decode_attention_windowed(const float* q, int64_t q_row, const void* k_cache, const void* v_cache,
                                        int32_t kv_dtype, int64_t num_slots, int64_t kv_row,
                                        const int32_t* req_to_token, int64_t r2t_rows, int64_t r2t_stride,
                                        const int64_t* rows, const int64_t* lens, float* out, int64_t b,
                                        int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                                        int64_t window, float softcap, int32_t nthreads);
int64_t sglpy_extend_attention_windowed(const float* q, int64_t q_row, const void* k_cache, const void* v_cache,
                                        int32_t kv_dtype, int64_t num_slots, int64_t kv_row,
                                        const int32_t* req_to_token, int64_t r2t_rows, int64_t r2t_stride,
                                        const int64_t* rows, const int64_t* prefix, const int64_t* ext,
                                        const int64_t* start, float* out, int64_t b, int64_t heads,
                                        int64_t kv_heads, int64_t head_dim, float scale, int64_t window,
                                        float softcap, int32_t nthreads);
int64_t sglpy_gemv_int8(const float* x, int64_t M, int64_t K, const int8_t* q, const float* scale, const float* bias,
                        float* y, int64_t N, int32_t nthreads);
int64_t sglpy_gemv_int4(const float* x, int64_t M, int64_t K, const uint8_t* q, const uint16_t* sz, const float* bias,
                        float* y, int64_t N, int32_t nthreads);
int64_t sglpy_rmsnorm(const float* x, const float* residual, const float* weight, float eps, float* out,
                      float* residual_out, int64_t M, int64_t H, int32_t nthreads);
int64_t sglpy_rotary_store(float* qkv, int64_t M, int64_t row_stride, int64_t H, int64_t Hkv, int64_t D,
                           const float* cos_sin, int64_t max_pos, const int64_t* positions, void* k_cache,
                           void* v_cache, int32_t kv_dtype, int64_t num_slots, int64_t kv_row, const int64_t* loc,
                           int32_t nthreads);
int64_t sglpy_silu_mul(const float* gate_up, int64_t M, int64_t I, float* out, int32_t nthreads);
int64_t sglpy_dequant_rows(int32_t kind, const void* q, const void* scales, int64_t K, int64_t n0, int64_t n1,
                           void* out, int32_t out_dtype, int32_t nthreads);
int64_t sglpy_lora_delta(const float* x, int64_t x_stride, float* y, int64_t y_stride, const void* a, const void* bt,
                         int32_t w_dtype, int64_t n_in, int64_t pool_rank, int64_t n_slices, const int64_t* offsets,
                         const int64_t* rows, const int64_t* indptr, const int64_t* slots, const int64_t* ranks,
                         int64_t n_seg, int64_t num_slots, int64_t num_rows, int32_t nthreads);
int32_t sglpy_gemv_int8_activations();
int32_t sglpy_gemv_int8_weight_act_max();
}
