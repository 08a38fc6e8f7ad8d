#pragma once
// Device helpers shared by the kernel files: launch geometry and reductions.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"

namespace hone::cuda {

constexpr int kThreads = 256;

inline int blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);  // grid-stride loops cover the rest
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? scratch[threadIdx.x] : 0.0f;
  v = warp_sum(v);
  return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? scratch[threadIdx.x] : -3.402823466e38f;
  v = warp_max(v);
  return v;
}

}  // namespace hone::cuda
