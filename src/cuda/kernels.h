#pragma once
// Device helpers shared by the kernel files: launch geometry and reductions.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/check.h"

namespace hone::cuda {

constexpr int kThreads = 256;

inline int blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);  // grid-stride loops cover the rest
}

// Sums in float, or in double for the losses and norms that the CPU accumulates in double.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces over the block with `warp_op`; every thread gets the result. `scratch` holds
// 32 values; `identity` pads the lanes past the last warp.
template <typename T, typename WarpOp>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, WarpOp warp_op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_op(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_op(v);
}

template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  return block_reduce(v, scratch, T(0), [](T x) { return warp_sum(x); });
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -3.402823466e38f, [](float x) { return warp_max(x); });
}

// Grid-stride loops in int64: tensors reach 4e8 elements, and index * 4 must not overflow.
__device__ __forceinline__ int64_t grid_start() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// Blocks for kernels that give each block a row (block-stride loops cover the rest).
inline int blocks_for_rows(int64_t rows) { return int(std::clamp<int64_t>(rows, 1, 65535 * 16)); }

__host__ __device__ __forceinline__ int64_t groups_of_4(int64_t n) { return (n + 3) / 4; }

// Column sums of a [rows, cols] matrix into an F32 vector (bias gradients): a block of 32 x
// kColumnSumWarps threads takes 32 * W columns (W per thread) and a band of rows, which
// its warps split; column_sum_blocks sizes the grid at about four blocks an SM (the GPU
// full, few atomics a column) and add_column_sums ends a block's work.
constexpr int kColumnSumWarps = 8;

struct ColumnSumBlocks {
  dim3 grid, block;
  int64_t band;  // rows a block sums
};

inline ColumnSumBlocks column_sum_blocks(int64_t rows, int64_t cols, int w, int sms) {
  const int64_t col_blocks = (cols + 32 * w - 1) / (32 * w);
  const int64_t bands = std::clamp<int64_t>(4 * sms / col_blocks, 1, (rows + kColumnSumWarps - 1) / kColumnSumWarps);
  const int64_t band = (rows + bands - 1) / bands;
  return {dim3(unsigned(col_blocks), unsigned((rows + band - 1) / band)), dim3(32, kColumnSumWarps), band};
}

// Adds the block's per-thread sums acc of columns [c, c + W) into dst: the warps' sums
// through shared memory, in warp order, then one atomic per column and block.
template <int W>
__device__ __forceinline__ void add_column_sums(const float (&acc)[W], float* dst, int c, int cols) {
  __shared__ float part[kColumnSumWarps][32 * W];
#pragma unroll
  for (int t = 0; t < W; ++t) part[threadIdx.y][threadIdx.x * W + t] = acc[t];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
#pragma unroll
  for (int t = 0; t < W; ++t) {
    float s = 0.0f;
    for (int y = 0; y < kColumnSumWarps; ++y) s += part[y][threadIdx.x * W + t];
    atomicAdd(dst + c + t, s);
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The current GPU's multiprocessors: how many CTAs a persistent kernel launches.
inline int sm_count() {
  int device = 0, sms = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// V consecutive floats; V == 4 is one 16-byte access, so the address must be aligned.
template <int V>
struct Vec {
  float v[V];
};

template <int V>
__device__ __forceinline__ Vec<V> load_vec(const float* p) {
  Vec<V> r;
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    r.v[0] = t.x, r.v[1] = t.y, r.v[2] = t.z, r.v[3] = t.w;
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = p[k];
  }
  return r;
}

template <int V>
__device__ __forceinline__ void store_vec(float* p, const Vec<V>& r) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = r.v[k];
  }
}

// Elements [i, i + 4) of a flat array of n, i a multiple of 4: one float4 access when
// `vec` (every pointer of the kernel 16-byte aligned) and the group is whole, else
// scalar. Elements at or past n load as 0 and are not stored.
__device__ __forceinline__ Vec<4> load4(const float* p, int64_t i, int64_t n, bool vec) {
  if (vec && i + 4 <= n) return load_vec<4>(p + i);
  Vec<4> r;
#pragma unroll
  for (int k = 0; k < 4; ++k) r.v[k] = i + k < n ? p[i + k] : 0.0f;
  return r;
}

__device__ __forceinline__ void store4(float* p, int64_t i, int64_t n, bool vec, const Vec<4>& r) {
  if (vec && i + 4 <= n) return store_vec<4>(p + i, r);
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (i + k < n) p[i + k] = r.v[k];
}

}  // namespace hone::cuda
