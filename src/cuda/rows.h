#pragma once
// Shared by the row-wise kernels (softmax, LayerNorm): a row is split over `tpr` threads
// (threadIdx.x, a power of two from 32 to 1024), several short rows share a block
// (threadIdx.y), and each thread keeps its part of the row in registers: `groups` runs
// of W consecutive columns (W = 4 for float4 access when the row allows it, else 1).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cuda/kernels.h"
#include "hone/error.h"

namespace hone::cuda {

constexpr int kRowBlockThreads = 256;  // threads per block when several rows share one

struct RowLaunch {
  dim3 grid, block;
};

// Geometry for `rows` rows of `cols` columns, `groups` runs of `w` columns per thread and
// at most `max_tpr` threads per row.
inline RowLaunch row_launch(const char* op, int64_t rows, int64_t cols, int w, int groups, int max_tpr = 1024) {
  const int64_t runs = (cols + w - 1) / w;
  int tpr = 32;
  while (int64_t(tpr) * groups < runs) tpr *= 2;
  if (tpr > max_tpr)
    fail("{} on CUDA: rows of {} columns are longer than the {} supported", op, cols, int64_t(max_tpr) * groups * w);
  const int per_block = tpr < kRowBlockThreads ? kRowBlockThreads / tpr : 1;
  return {dim3(unsigned((rows + per_block - 1) / per_block)), dim3(unsigned(tpr), unsigned(per_block))};
}

// Whether float4 access is possible: the row length and every pointer allow it.
inline bool vec4_ok(int64_t cols, std::initializer_list<const void*> ptrs) {
  if (cols % 4) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}

// Sum (or max) over the threads of one row; every thread of the row gets the result.
// Every thread of the block must call it (it synchronizes when rows span warps).
template <bool kMax>
__device__ __forceinline__ float row_reduce(float v) {
  __shared__ float scratch[32];  // one slot per warp of the block
  v = kMax ? warp_max(v) : warp_sum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warps = int(blockDim.x >> 5), first = threadIdx.y * warps;
  __syncthreads();  // a previous reduction may still be reading the scratch
  if (lane == 0) scratch[first + (threadIdx.x >> 5)] = v;
  __syncthreads();
  v = lane < warps ? scratch[first + lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float row_sum(float v) { return row_reduce<false>(v); }
__device__ __forceinline__ float row_max(float v) { return row_reduce<true>(v); }

template <int W, typename T>
__device__ __forceinline__ void load(const T* p, T (&v)[W]) {
  if constexpr (W == 4) {
    using V4 = std::conditional_t<std::is_same_v<T, float>, float4, int4>;
    const V4 q = *reinterpret_cast<const V4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = *p;
  }
}

template <int W>
__device__ __forceinline__ void store(float* p, const float (&v)[W]) {
  if constexpr (W == 4)
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else
    *p = v[0];
}

}  // namespace hone::cuda
