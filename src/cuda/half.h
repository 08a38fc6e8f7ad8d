#pragma once
// The compute dtypes on the device: F32, BF16 and F16 storage with F32 arithmetic.
// Kernels are templates over the storage type T; `with_dtype` picks the instantiation
// from a tensor's dtype. Memory-bound kernels move 16 bytes per access: 4 floats or 8
// halves (kVec<T> elements).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "hone/dtype.h"
#include "hone/error.h"

namespace hone::cuda {

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return __half2float(v);
}

// Round to nearest even, as torch's casts.
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec = int(16 / sizeof(T));

// N consecutive elements (N * sizeof(T) == 16: one aligned 16-byte access) as floats.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  static_assert(N * sizeof(T) == 16, "one 16-byte access");
  const int4 raw = *reinterpret_cast<const int4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_float(e[k]);
}

template <typename T, int N>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  static_assert(N * sizeof(T) == 16, "one 16-byte access");
  int4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < N; ++k) e[k] = from_float<T>(in[k]);
  *reinterpret_cast<int4*>(p) = raw;
}

// Calls f(T{}) with T the storage type of a floating dtype (float, __nv_bfloat16, __half).
template <typename F>
decltype(auto) with_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(__nv_bfloat16{});
    case DType::F16: return f(__half{});
    default: fail("{} on CUDA: dtype {} is not a floating compute dtype", op, dtype_name(t));
  }
}

inline cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: fail("no cuBLAS data type for {}", dtype_name(t));
  }
}

}  // namespace hone::cuda
