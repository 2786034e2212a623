// Segmented LoRA, decode steps and prefill chunks:                   oracle: kernels/lora.py:lora_delta_reference
//   sglpy_lora_delta   y[rows[i]] += per output slice s: (A_s x[rows[i]]) B_s, with A_s, B_s the slot's weights
// Segment k holds rows[indptr[k] .. indptr[k + 1]) and uses pool slot slots[k] of rank ranks[k] (<= pool_rank).
// A: [slots, n_slices * pool_rank, n_in], Bt: [slots, pool_rank, out] (B transposed: the expand adds rows of Bt,
// scaled by h, to y), contiguous, float32 or bf16 (w_dtype); x and y float32. y's slice s is the columns
// offsets[s] .. offsets[s + 1]. Two phases, each split across threads into work items that read disjoint weights:
// the shrink by (segment, 16-row block, slice, block of rank rows), the expand by (segment, block of output
// columns); every output element is summed by one thread in a fixed order (the result does not depend on the thread
// count).
// The fused decode layer (decode_layer.cpp) calls the same entry point per projection.
#include <type_traits>
#include <vector>

#include "cpu_common.h"
#include "kernels.h"

namespace sglpy {
namespace {

constexpr int64_t SHRINK_ROWS = 4;   // rank rows of A per shrink work item
constexpr int64_t EXPAND_COLS = 128;  // output columns per expand work item (Bt block: rank x 128 stays in L1)
constexpr int64_t ROW_BLOCK = 16;  // rows of x per shrink work item

static inline float to_f32(float v) { return v; }
static inline float to_f32(bf16_t v) {
  const uint32_t w = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

static inline vn splatn(float v) {  // one broadcast, as splat (a lane loop compiled to inserts: 2x slower)
#if SGLPY_NW == 16
  return splat(v);
#elif SGLPY_NW == 8
  return vn{v, v, v, v, v, v, v, v};
#else
  return vn{v, v, v, v};
#endif
}

template <typename T>
static inline float dot_w(const float* x, const T* w, int64_t n) {  // dot_n with the weights in T
  vn acc = vn{};
  int64_t j = 0;
  for (; j + NW <= n; j += NW) acc += loadn(x + j) * loadn(w + j);
  float s = hsumn(acc);
  for (; j < n; ++j) s += x[j] * to_f32(w[j]);
  return s;
}

// out[i] = dot_w(x, w + i * n, n) for i < 4, the same arithmetic per dot, as four independent FMA chains sharing
// x's loads (one chain is bound by the FMA latency)
template <typename T>
static inline void dot4_w(const float* x, const T* w, int64_t n, float* out) {
  vn acc0 = vn{}, acc1 = vn{}, acc2 = vn{}, acc3 = vn{};
  int64_t j = 0;
  for (; j + NW <= n; j += NW) {
    const vn xv = loadn(x + j);
    acc0 += xv * loadn(w + j);
    acc1 += xv * loadn(w + n + j);
    acc2 += xv * loadn(w + 2 * n + j);
    acc3 += xv * loadn(w + 3 * n + j);
  }
  float s0 = hsumn(acc0), s1 = hsumn(acc1), s2 = hsumn(acc2), s3 = hsumn(acc3);
  for (; j < n; ++j) {
    s0 += x[j] * to_f32(w[j]);
    s1 += x[j] * to_f32(w[n + j]);
    s2 += x[j] * to_f32(w[2 * n + j]);
    s3 += x[j] * to_f32(w[3 * n + j]);
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

// out0[i] = dot_w(x0, w + i * n, n), out1[i] = dot_w(x1, w + i * n, n) for i < 4 (dot4_w for two rows at once)
template <typename T>
static inline void dot4x2_w(const float* x0, const float* x1, const T* w, int64_t n, float* out0, float* out1) {
  vn a0 = vn{}, a1 = vn{}, a2 = vn{}, a3 = vn{}, b0 = vn{}, b1 = vn{}, b2 = vn{}, b3 = vn{};
  int64_t j = 0;
  for (; j + NW <= n; j += NW) {
    const vn u = loadn(x0 + j), v = loadn(x1 + j);
    const vn w0 = loadn(w + j), w1 = loadn(w + n + j), w2 = loadn(w + 2 * n + j), w3 = loadn(w + 3 * n + j);
    a0 += u * w0, a1 += u * w1, a2 += u * w2, a3 += u * w3;
    b0 += v * w0, b1 += v * w1, b2 += v * w2, b3 += v * w3;
  }
  float s[8] = {hsumn(a0), hsumn(a1), hsumn(a2), hsumn(a3), hsumn(b0), hsumn(b1), hsumn(b2), hsumn(b3)};
  for (; j < n; ++j)
    for (int i = 0; i < 4; ++i) {
      const float wi = to_f32(w[i * n + j]);
      s[i] += x0[j] * wi;
      s[4 + i] += x1[j] * wi;
    }
  for (int i = 0; i < 4; ++i) out0[i] = s[i], out1[i] = s[4 + i];
}

// y[c0:c1] += sum_j h[j] Bt[j, c0:c1], one register of columns at a time, then column by column (the per-column
// order of the 4-register groups: 0, then + h[j] Bt[j, c] for j ascending)
template <typename T>
static inline void expand_tail(const float* hp, const T* bs, int64_t n_out, int64_t r, int64_t c, int64_t c1,
                               float* yr) {
  for (; c + NW <= c1; c += NW) {  // one register of columns (16-float vectors spill on AVX2)
    vn acc = vn{};
    for (int64_t j = 0; j < r; ++j) acc += splatn(hp[j]) * loadn(bs + j * n_out + c);
    storen(yr + c, loadn(yr + c) + acc);
  }
  for (; c < c1; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < r; ++j) acc += hp[j] * to_f32(bs[j * n_out + c]);
    yr[c] += acc;
  }
}

// bf16 weights widened to float32 once per work item pay when they serve this many rows (decode rows, one or two
// per adapter, widen in registers instead: the same products either way, the widening is exact)
template <typename T>
static inline bool widen_pays(int64_t rows) { return !std::is_same<T, float>::value && rows >= 4; }

template <typename T>
static inline void widen(const T* w, int64_t n, std::vector<float>& out) {
  out.resize(n);
  for (int64_t i = 0; i < n; ++i) out[i] = to_f32(w[i]);
}

// x with each block of 2 NW floats split into its even then its odd elements (the tail past the last whole block
// as is): the order in which the shrink below reads bf16 weights two to a 32-bit lane
static inline void deinterleave(const float* x, int64_t n, float* out) {
  const int64_t n2 = n / (2 * NW) * (2 * NW);
  for (int64_t b = 0; b < n2; b += 2 * NW)
    for (int64_t i = 0; i < NW; ++i) out[b + i] = x[b + 2 * i], out[b + NW + i] = x[b + 2 * i + 1];
  for (int64_t j = n2; j < n; ++j) out[j] = x[j];
}

// out_r[i] = A[i] . x_r for i < 4 and ROWS rows, bf16 A read 32 bits at a time (a shift widens the even element, a
// mask the odd one: two ops per two registers of weights, where widening 16 bits to 32 takes four); xd: the rows
// deinterleaved (above), x: as is (the tail)
template <int ROWS>
static inline void dot4_bf16(const float* const* xd, const bf16_t* w, int64_t n, float* const* out) {
  vn acc[ROWS][4];
  for (int r = 0; r < ROWS; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = vn{};
  const int64_t n2 = n / (2 * NW) * (2 * NW);
  for (int64_t j = 0; j < n2; j += 2 * NW) {
    vn xe[ROWS], xo[ROWS];
    for (int r = 0; r < ROWS; ++r) xe[r] = loadn(xd[r] + j), xo[r] = loadn(xd[r] + j + NW);
    for (int i = 0; i < 4; ++i) {
      vnu u;
      std::memcpy(&u, w + i * n + j, sizeof u);
      const vnu ue = u << 16, uo = u & 0xFFFF0000u;
      vn we, wo;
      std::memcpy(&we, &ue, sizeof we);
      std::memcpy(&wo, &uo, sizeof wo);
      for (int r = 0; r < ROWS; ++r) acc[r][i] += xe[r] * we, acc[r][i] += xo[r] * wo;
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int i = 0; i < 4; ++i) {
      float s = hsumn(acc[r][i]);
      for (int64_t j = n2; j < n; ++j) s += xd[r][j] * to_f32(w[i * n + j]);
      out[r][i] = s;
    }
}

// shrink_rows for bf16 A without widening it first (a few rows): xd [positions, n_in] deinterleaved rows
static inline void shrink_rows_bf16(const float* xd, const float* x, int64_t x_stride, const int64_t* rows,
                                    int64_t p0, int64_t p1, const bf16_t* as, int64_t n_in, int64_t nj, float* h,
                                    int64_t hw) {
  int64_t p = p0;
  if (nj == SHRINK_ROWS) {
    for (; p + 2 <= p1; p += 2) {
      const float* xs[2] = {xd + p * n_in, xd + (p + 1) * n_in};
      float* const hs[2] = {h + p * hw, h + (p + 1) * hw};
      dot4_bf16<2>(xs, as, n_in, hs);
    }
    for (; p < p1; ++p) {
      const float* xs[1] = {xd + p * n_in};
      float* const hs[1] = {h + p * hw};
      dot4_bf16<1>(xs, as, n_in, hs);
    }
  }
  for (; p < p1; ++p)
    for (int64_t j = 0; j < nj; ++j) h[p * hw + j] = dot_w(x + rows[p] * x_stride, as + j * n_in, n_in);
}

// h[p * hw + j] = A[j] . x[rows[p]] for p in [p0, p1), j < nj (A: nj rows of n_in, row-major)
template <typename T>
static inline void shrink_rows(const float* x, int64_t x_stride, const int64_t* rows, int64_t p0, int64_t p1,
                               const T* as, int64_t n_in, int64_t nj, float* h, int64_t hw) {
  int64_t p = p0;
  if (nj == SHRINK_ROWS)  // rows in pairs: each weight load (and bf16 widening) serves two rows
    for (; p + 2 <= p1; p += 2)
      dot4x2_w(x + rows[p] * x_stride, x + rows[p + 1] * x_stride, as, n_in, h + p * hw, h + (p + 1) * hw);
  for (; p < p1; ++p) {
    float* hp = h + p * hw;
    const float* xp = x + rows[p] * x_stride;
    if (nj == SHRINK_ROWS)
      dot4_w(xp, as, n_in, hp);
    else
      for (int64_t j = 0; j < nj; ++j) hp[j] = dot_w(xp, as + j * n_in, n_in);
  }
}

// y[0:2 NW] += the columns of e (even) and o (odd) interleaved back: e[i] -> y[2 i], o[i] -> y[2 i + 1]
static inline void add_interleaved(float* y, vn e, vn o) {
#if SGLPY_NW == 16
  const vn lo = __builtin_shufflevector(e, o, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const vn hi = __builtin_shufflevector(e, o, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#elif SGLPY_NW == 8
  const vn lo = __builtin_shufflevector(e, o, 0, 8, 1, 9, 2, 10, 3, 11);
  const vn hi = __builtin_shufflevector(e, o, 4, 12, 5, 13, 6, 14, 7, 15);
#else
  const vn lo = __builtin_shufflevector(e, o, 0, 4, 1, 5);
  const vn hi = __builtin_shufflevector(e, o, 2, 6, 3, 7);
#endif
  storen(y, loadn(y) + lo);
  storen(y + NW, loadn(y + NW) + hi);
}

// The 4 NW columns at c of ROWS rows, bf16 Bt: each 32-bit load holds columns 2i (low half) and 2i + 1 (high half);
// a shift widens the even ones, a mask the odd ones (one op each, where widening 16 bits to 32 takes a shuffle and
// a shift per register). Each column's sum keeps expand_rows' order (0, then + h[j] Bt[j, c], j ascending).
template <int ROWS>
static inline void expand_group_bf16(const float* const* hp, const bf16_t* bs, int64_t ld, int64_t r, int64_t c,
                                     float* const* yr) {
  vn e0[ROWS], o0[ROWS], e1[ROWS], o1[ROWS];
  for (int i = 0; i < ROWS; ++i) e0[i] = o0[i] = e1[i] = o1[i] = vn{};
  for (int64_t j = 0; j < r; ++j) {
    vnu w0, w1;
    std::memcpy(&w0, bs + j * ld + c, sizeof w0);
    std::memcpy(&w1, bs + j * ld + c + 2 * NW, sizeof w1);
    const vnu ue0 = w0 << 16, uo0 = w0 & 0xFFFF0000u, ue1 = w1 << 16, uo1 = w1 & 0xFFFF0000u;
    vn we0, wo0, we1, wo1;
    std::memcpy(&we0, &ue0, sizeof we0);
    std::memcpy(&wo0, &uo0, sizeof wo0);
    std::memcpy(&we1, &ue1, sizeof we1);
    std::memcpy(&wo1, &uo1, sizeof wo1);
    for (int i = 0; i < ROWS; ++i) {
      const vn hv = splatn(hp[i][j]);
      e0[i] += hv * we0, o0[i] += hv * wo0, e1[i] += hv * we1, o1[i] += hv * wo1;
    }
  }
  for (int i = 0; i < ROWS; ++i) {
    add_interleaved(yr[i] + c, e0[i], o0[i]);
    add_interleaved(yr[i] + c + 2 * NW, e1[i], o1[i]);
  }
}

// y[rows[p], 0:nc] += sum_j h[p * hw + j] Bt[j, 0:nc] for p in [p0, p1), j < r (Bt rows ld apart; y and bs point at
// the block's first column)
template <typename T>
static void expand_rows(const float* h, int64_t hw, const T* bs, int64_t ld, int64_t nc, int64_t r,
                        const int64_t* rows, int64_t p0, int64_t p1, float* y, int64_t y_stride) {
  int64_t p = p0;
  const int64_t c4 = nc / (4 * NW) * (4 * NW);
  for (; p + 2 <= p1 && c4 > 0; p += 2) {  // rows in pairs over the 4-register groups
    const float* hp0 = h + p * hw;
    const float* hp1 = hp0 + hw;
    float* y0 = y + rows[p] * y_stride;
    float* y1 = y + rows[p + 1] * y_stride;
    if constexpr (std::is_same<T, bf16_t>::value) {
      const float* hps[2] = {hp0, hp1};
      float* const ys[2] = {y0, y1};
      for (int64_t c = 0; c < c4; c += 4 * NW) expand_group_bf16<2>(hps, bs, ld, r, c, ys);
    } else
    for (int64_t c = 0; c < c4; c += 4 * NW) {
      vn a0 = vn{}, a1 = vn{}, a2 = vn{}, a3 = vn{}, b0 = vn{}, b1 = vn{}, b2 = vn{}, b3 = vn{};
      for (int64_t j = 0; j < r; ++j) {
        const T* bj = bs + j * ld + c;
        const vn w0 = loadn(bj), w1 = loadn(bj + NW), w2 = loadn(bj + 2 * NW), w3 = loadn(bj + 3 * NW);
        const vn h0 = splatn(hp0[j]), h1 = splatn(hp1[j]);
        a0 += h0 * w0, a1 += h0 * w1, a2 += h0 * w2, a3 += h0 * w3;
        b0 += h1 * w0, b1 += h1 * w1, b2 += h1 * w2, b3 += h1 * w3;
      }
      storen(y0 + c, loadn(y0 + c) + a0);
      storen(y0 + c + NW, loadn(y0 + c + NW) + a1);
      storen(y0 + c + 2 * NW, loadn(y0 + c + 2 * NW) + a2);
      storen(y0 + c + 3 * NW, loadn(y0 + c + 3 * NW) + a3);
      storen(y1 + c, loadn(y1 + c) + b0);
      storen(y1 + c + NW, loadn(y1 + c + NW) + b1);
      storen(y1 + c + 2 * NW, loadn(y1 + c + 2 * NW) + b2);
      storen(y1 + c + 3 * NW, loadn(y1 + c + 3 * NW) + b3);
    }
    for (int64_t q = p; q < p + 2; ++q)  // the columns past the groups, row by row
      expand_tail(h + q * hw, bs, ld, r, c4, nc, y + rows[q] * y_stride);
  }
  for (; p < p1; ++p) {
    const float* hp = h + p * hw;
    float* yr = y + rows[p] * y_stride;
    int64_t c = 0;
    if constexpr (std::is_same<T, bf16_t>::value) {
      const float* hps[1] = {hp};
      float* const ys[1] = {yr};
      for (; c + 4 * NW <= nc; c += 4 * NW) expand_group_bf16<1>(hps, bs, ld, r, c, ys);
    }
    for (; c + 4 * NW <= nc; c += 4 * NW) {  // four registers of columns: four independent FMA chains
      vn acc0 = vn{}, acc1 = vn{}, acc2 = vn{}, acc3 = vn{};
      for (int64_t j = 0; j < r; ++j) {
        const vn hj = splatn(hp[j]);
        const T* bj = bs + j * ld + c;
        acc0 += hj * loadn(bj);
        acc1 += hj * loadn(bj + NW);
        acc2 += hj * loadn(bj + 2 * NW);
        acc3 += hj * loadn(bj + 3 * NW);
      }
      storen(yr + c, loadn(yr + c) + acc0);
      storen(yr + c + NW, loadn(yr + c + NW) + acc1);
      storen(yr + c + 2 * NW, loadn(yr + c + 2 * NW) + acc2);
      storen(yr + c + 3 * NW, loadn(yr + c + 3 * NW) + acc3);
    }
    expand_tail(hp, bs, ld, r, c, nc, yr);
  }
}

struct Segs {
  const int64_t* rows;
  const int64_t* indptr;
  const int64_t* slots;
  const int64_t* ranks;
  int64_t n_seg;
};

template <typename T>
void lora_apply(const float* x, int64_t x_stride, float* y, int64_t y_stride, const T* a, const T* bt, int64_t n_in,
                int64_t pool_rank, int64_t n_slices, const int64_t* offsets, const Segs& sg, int32_t nthreads) {
  const int64_t n = sg.indptr[sg.n_seg], n_out = offsets[n_slices];
  const int64_t a_slot = n_slices * pool_rank * n_in, b_slot = pool_rank * n_out, hw = n_slices * pool_rank;
  thread_local std::vector<float> hbuf;
  if (hbuf.size() < static_cast<size_t>(n * hw)) hbuf.resize(n * hw);
  float* h = hbuf.data();  // [n, slices, pool_rank] in segment order (position p of rows[p])
  // bf16 weights of segments too short to widen them first: their x rows deinterleaved, by position
  thread_local std::vector<float> xbuf;
  float* xd = nullptr;
  if (!std::is_same<T, float>::value) {
    for (int64_t k = 0; k < sg.n_seg; ++k) {
      if (widen_pays<T>(sg.indptr[k + 1] - sg.indptr[k])) continue;
      if (xd == nullptr) {
        if (xbuf.size() < static_cast<size_t>(n * n_in)) xbuf.resize(n * n_in);
        xd = xbuf.data();
      }
      for (int64_t p = sg.indptr[k]; p < sg.indptr[k + 1]; ++p)
        deinterleave(x + sg.rows[p] * x_stride, n_in, xd + p * n_in);
    }
  }
  const int64_t jb = (pool_rank + SHRINK_ROWS - 1) / SHRINK_ROWS;
  // the shrink's row blocks: (segment, first row) of at most ROW_BLOCK rows each, so that a work item's x rows stay
  // in L1 / L2 while it reads its rank rows of A (a prefill segment's x can be megabytes)
  thread_local std::vector<int64_t> blocks;
  blocks.clear();
  for (int64_t k = 0; k < sg.n_seg; ++k)
    for (int64_t p = sg.indptr[k]; p < sg.indptr[k + 1]; p += ROW_BLOCK) blocks.push_back(k), blocks.push_back(p);
  const int64_t n_blocks = static_cast<int64_t>(blocks.size()) / 2;
  const int64_t* blk_of = blocks.data();
  const int64_t shrink_items = n_blocks * n_slices * jb;
  int64_t col_blocks = 0;  // output column blocks, per slice (a block never straddles two slices)
  for (int64_t s = 0; s < n_slices; ++s) col_blocks += (offsets[s + 1] - offsets[s] + EXPAND_COLS - 1) / EXPAND_COLS;
  const int64_t expand_items = sg.n_seg * col_blocks;
  const int64_t work = n * hw * (n_in + n_out / n_slices);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && work >= 32768)
  {
#pragma omp for schedule(dynamic)
    for (int64_t u = 0; u < shrink_items; ++u) {  // h[p, s, j] = A_s[j] . x[rows[p]]
      const int64_t b = u / (n_slices * jb), s = (u / jb) % n_slices, j0 = (u % jb) * SHRINK_ROWS;
      const int64_t k = blk_of[2 * b], p0 = blk_of[2 * b + 1], p1 = std::min(p0 + ROW_BLOCK, sg.indptr[k + 1]);
      const int64_t r = sg.ranks[k], j1 = std::min(j0 + SHRINK_ROWS, r);
      if (j0 >= r) continue;  // rank rows past the adapter's rank (the pool's padding)
      const T* as = a + sg.slots[k] * a_slot + (s * pool_rank + j0) * n_in;
      float* hs = h + s * pool_rank + j0;
      // a long segment: widen the bf16 rank rows once for all the block's rows (exact); else xd (above)
      if (widen_pays<T>(sg.indptr[k + 1] - sg.indptr[k])) {
        thread_local std::vector<float> wbuf;
        widen(as, (j1 - j0) * n_in, wbuf);
        shrink_rows(x, x_stride, sg.rows, p0, p1, wbuf.data(), n_in, j1 - j0, hs, hw);
      } else if constexpr (std::is_same<T, bf16_t>::value) {
        shrink_rows_bf16(xd, x, x_stride, sg.rows, p0, p1, as, n_in, j1 - j0, hs, hw);
      } else {
        shrink_rows(x, x_stride, sg.rows, p0, p1, as, n_in, j1 - j0, hs, hw);
      }
    }
#pragma omp for schedule(dynamic)
    for (int64_t u = 0; u < expand_items; ++u) {  // y[rows[p], c0:c1] += sum_j h[p, s, j] Bt[j, c0:c1]
      const int64_t k = u / col_blocks;
      int64_t blk = u % col_blocks, s = 0;
      for (;; ++s) {
        const int64_t nb = (offsets[s + 1] - offsets[s] + EXPAND_COLS - 1) / EXPAND_COLS;
        if (blk < nb) break;
        blk -= nb;
      }
      const int64_t c0 = offsets[s] + blk * EXPAND_COLS, c1 = std::min(c0 + EXPAND_COLS, offsets[s + 1]);
      const int64_t r = sg.ranks[k], p0 = sg.indptr[k], p1 = sg.indptr[k + 1];
      const T* bs = bt + sg.slots[k] * b_slot + c0;
      if (widen_pays<T>(p1 - p0)) {  // the r x (c1 - c0) block of Bt widened once for all the segment's rows
        thread_local std::vector<float> wbuf;
        wbuf.resize(r * (c1 - c0));
        for (int64_t j = 0; j < r; ++j)
          for (int64_t c = 0; c < c1 - c0; ++c) wbuf[j * (c1 - c0) + c] = to_f32(bs[j * n_out + c]);
        expand_rows(h + s * pool_rank, hw, wbuf.data(), c1 - c0, c1 - c0, r, sg.rows, p0, p1, y + c0, y_stride);
      } else {
        expand_rows(h + s * pool_rank, hw, bs, n_out, c1 - c0, r, sg.rows, p0, p1, y + c0, y_stride);
      }
    }
  }
}

}  // namespace
}  // namespace sglpy

using namespace sglpy;

// Returns 0, or -1 (nothing written) when a segment names a row, slot or rank outside the tensors.
extern "C" int64_t sglpy_lora_delta(const float* x, int64_t x_stride, float* y, int64_t y_stride, const void* a,
                                    const void* bt, int32_t w_dtype, int64_t n_in, int64_t pool_rank,
                                    int64_t n_slices, const int64_t* offsets, const int64_t* rows,
                                    const int64_t* indptr, const int64_t* slots, const int64_t* ranks, int64_t n_seg,
                                    int64_t num_slots, int64_t num_rows, int32_t nthreads) {
  if (n_seg < 1 || n_slices < 1 || pool_rank < 1 || indptr[0] != 0 || (w_dtype != F32 && w_dtype != BF16))
    return -1;
  for (int64_t k = 0; k < n_seg; ++k)
    if (indptr[k] > indptr[k + 1] || slots[k] < 0 || slots[k] >= num_slots || ranks[k] < 0 || ranks[k] > pool_rank)
      return -1;
  for (int64_t i = 0; i < indptr[n_seg]; ++i)
    if (rows[i] < 0 || rows[i] >= num_rows) return -1;
  const Segs sg{rows, indptr, slots, ranks, n_seg};
  if (w_dtype == F32)
    lora_apply(x, x_stride, y, y_stride, static_cast<const float*>(a), static_cast<const float*>(bt), n_in,
               pool_rank, n_slices, offsets, sg, nthreads);
  else
    lora_apply(x, x_stride, y, y_stride, static_cast<const bf16_t*>(a), static_cast<const bf16_t*>(bt), n_in,
               pool_rank, n_slices, offsets, sg, nthreads);
  return 0;
}
