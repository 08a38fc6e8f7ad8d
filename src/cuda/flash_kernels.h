#pragma once
// What the flash attention kernels (flash_forward.cu, flash_backward.cu) share: their
// arguments, the PTX they are built from (cp.async, ldmatrix, mma.sync m16n8k16 with F32
// accumulation), and the dropout bits of an accumulator tile.
//
// Fragment layouts of mma.sync.m16n8k16 (lane = 4 g + t): an accumulator tile holds, per
// lane, rows g and g + 8, columns 2t and 2t + 1. ldmatrix.x4 loads four 8x8 matrices, lanes
// 8m..8m+7 giving the row addresses of matrix m; .trans hands out columns instead of rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hone/backend.h"
#include "hone/philox.h"

namespace hone::cuda::flash {

constexpr int kThreads = 128;  // four warps per CTA
constexpr int kWarps = kThreads / 32;

struct ForwardArgs {
  const void* qkv;             // [B*S, 3H]
  const int32_t* mask;         // [B, S]
  const int32_t* key_lengths;  // [B]
  void* ctx;                   // [B*S, H]
  float2* stats;               // [B, heads, S]: {max, 1 / sum}
  int seq, heads;
  float scale_log2;  // scale * log2 e
  DropoutSpec drop;
  float keep_scale;  // 1 / (1 - p)
};

struct BackwardArgs {
  const void* qkv;
  const void* dctx;            // [B*S, H]
  const int32_t* mask;
  const int32_t* key_lengths;
  const float2* stats;
  const float* row_dot;        // [B, heads, S]: rowsum(dctx * ctx)
  float* dq_accum;             // [B*S, H], zeroed before the kernel
  void* dqkv;                  // [B*S, 3H]: dK and dV written here, dQ later from dq_accum
  int seq, heads;
  float scale, scale_log2;
  DropoutSpec drop;
  float keep_scale;
};

// Host launchers, instantiated for T in {__nv_bfloat16, __half} and D in {16, 32, 64, 128}.
template <typename T, int D>
void launch_forward(const ForwardArgs& a, int batch, cudaStream_t stream);
template <typename T, int D>
void launch_backward(const BackwardArgs& a, int batch, cudaStream_t stream);

// ---------------------------------------------------------------- PTX

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zeros when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

// c += a b for one 16x8 tile, k = 16.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T (nearest even), lo in the low half: one register of a fragment.
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t w) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v;
    memcpy(&v, &w, 4);
    return __bfloat1622float2(v);
  } else {
    __half2 v;
    memcpy(&v, &w, 4);
    return __half22float2(v);
  }
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------- scores and dropout

// What a key is to the softmax: live (1), masked (0: the score becomes -FLT_MAX, as on the
// CPU, so a row with every key masked is uniform), or past the sequence (-1: no weight).
__device__ __forceinline__ int key_kind(const int32_t* mask_row, int j, int seq) {
  return j < seq ? (mask_row[j] != 0 ? 1 : 0) : -1;
}

// A score in base-2 units (exp2 of it is exp of the scaled score).
__device__ __forceinline__ float score_log2(float dot, int kind, float scale_log2) {
  return kind > 0 ? dot * scale_log2 : kind == 0 ? -FLT_MAX : -INFINITY;
}

// The same as an addend, score_log2 = dot * scale_log2 + bias: 0 for a live key; -FLT_MAX
// for a masked one (the product is far below its ulp, so the sum is exactly -FLT_MAX); -inf
// past the sequence.
__device__ __forceinline__ float key_bias(const int32_t* mask_row, int j, int seq) {
  return j < seq ? (mask_row[j] != 0 ? 0.0f : -FLT_MAX) : -INFINITY;
}

// One element of the backward's tiles (rows keys, columns queries): the score s = q.k
// becomes P' (P kept and scaled by 1 / (1 - p), or 0: the factor of dV) and dp, the
// gradient of P', becomes dS = P (dP - D) (the factor of dK and dQ). max, inv and dot are
// the query's forward {max, 1 / sum} and D = rowsum(dO * O).
__device__ __forceinline__ void backward_element(float& s, float& dp, int kind, float scale_log2, float max, float inv,
                                                 float dot, bool keep, float keep_scale) {
  const float p = exp2_approx(score_log2(s, kind, scale_log2) - max) * inv;
  const float grad = keep ? dp * keep_scale : 0.0f;  // d(P) from d(P')
  s = keep ? p * keep_scale : 0.0f;
  dp = p * (grad - dot);
}

__device__ __forceinline__ uint32_t pick(const uint32_t (&v)[4], int i) {
  return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
}

// The dropout context of one kernel: the stream is read once (from device memory when the
// spec points at the step counter, so graph replays draw their step's masks).
struct Dropout {
  uint64_t seed, stream;
  float p;
  bool aligned;  // seq % 4 == 0: four consecutive keys of a row share one Philox block
};

__device__ __forceinline__ Dropout make_dropout(const DropoutSpec& d, int seq) {
  return {d.seed, d.p > 0.0f ? dropout_stream(d) : 0, d.p, seq % 4 == 0};
}

__device__ __forceinline__ bool kept(const Dropout& d, uint32_t word) { return uniform_from_word(word) >= d.p; }

// Keep bits of one accumulator tile whose rows are queries (forward): elements (row0, j),
// (row0, j + 1), (row1, j), (row1, j + 1), rowN_base = flat index of (rowN, key 0), j even.
// Aligned, lanes t and t ^ 1 hold keys 4u..4u+3 of both rows between them: each draws the
// block of one row and they swap halves.
__device__ __forceinline__ void keep_query_rows(const Dropout& d, uint64_t row0_base, uint64_t row1_base, int j,
                                                bool (&keep)[4]) {
  uint32_t w[4];
  if (d.aligned) {
    const bool odd = threadIdx.x & 1;
    const Philox4 r = philox_block(d.seed, d.stream, ((odd ? row1_base : row0_base) + (j & ~3)) >> 2);
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, odd ? r.v[0] : r.v[2], 1);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, odd ? r.v[1] : r.v[3], 1);
    w[0] = odd ? got0 : r.v[0];
    w[1] = odd ? got1 : r.v[1];
    w[2] = odd ? r.v[2] : got0;
    w[3] = odd ? r.v[3] : got1;
  } else {
    w[0] = philox_word(d.seed, d.stream, row0_base + j);
    w[1] = philox_word(d.seed, d.stream, row0_base + j + 1);
    w[2] = philox_word(d.seed, d.stream, row1_base + j);
    w[3] = philox_word(d.seed, d.stream, row1_base + j + 1);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) keep[e] = kept(d, w[e]);
}

// Keep bits of one accumulator tile whose rows are keys (backward): elements (key, q),
// (key, q + 1), (key + 8, q), (key + 8, q + 1), q even, key = the lane's row. `head_base`
// is the flat index of (this head, query 0, key 0). Aligned, the four lanes whose rows
// are keys 4v..4v+3 (lanes 4a + t for a = key % 4) need four blocks, (q or q + 1) x
// (keys 4v.. or 4v + 8..): lane a draws block a, and element e of every lane takes word a
// of block e, passed around in three xor-shuffles.
__device__ __forceinline__ void keep_key_rows(const Dropout& d, uint64_t head_base, int seq, int key, int q,
                                              bool (&keep)[4]) {
  uint32_t w[4];
  if (d.aligned) {
    const int a = key & 3;
    const int my_q = q + (a & 1), my_key = (key & ~3) + (a >> 1) * 8;
    Philox4 r = philox_block(d.seed, d.stream, (head_base + uint64_t(my_q) * seq + my_key) >> 2);
    uint32_t got[4];  // got[s] = word a of the block of lane a ^ s
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t send = pick(r.v, a ^ s);
      got[s] = s == 0 ? send : __shfl_xor_sync(0xffffffffu, send, 4 * s);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = pick(got, a ^ e);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      w[e] = philox_word(d.seed, d.stream, head_base + uint64_t(q + (e & 1)) * seq + key + (e >> 1) * 8);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) keep[e] = kept(d, w[e]);
}

// Rows [r0, r0 + rows) of a [*, ld] half matrix into shared memory rows of `sld` elements,
// D columns, 16 bytes per cp.async; rows at or past `limit` become zeros.
template <typename T, int D>
__device__ __forceinline__ void load_rows_async(T* dst, int sld, const T* src, int64_t ld, int r0, int rows,
                                                int limit) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, k = c % kChunks;
    const bool valid = r0 + r < limit;
    cp_async16(dst + r * sld + k * 8, src + (valid ? int64_t(r0 + r) * ld : 0) + k * 8, valid);
  }
}

}  // namespace hone::cuda::flash
