#pragma once
// What every optimizer kernel shares: writing the updated parameters' rounded copy (the
// weights mixed precision reads) in the same pass as the update.
#include "cuda/half.h"
#include "cuda/kernels.h"
#include "hone/error.h"
#include "hone/tensor.h"

namespace hone::cuda {

// The dtype of a slice's rounded copy of the parameters.
enum class HalfCopy : uint8_t { None, BF16, F16 };

inline HalfCopy half_copy(const Tensor& h) {
  if (!h.data) return HalfCopy::None;
  switch (h.dtype) {
    case DType::BF16: return HalfCopy::BF16;
    case DType::F16: return HalfCopy::F16;
    default: fail("optimizer on CUDA: the rounded copy of the parameters is {}, not BF16 or F16", dtype_name(h.dtype));
  }
}

// Elements [i, i + 4) of the half copy, as store4 does for floats.
template <typename H>
__device__ __forceinline__ void store4_half(void* dst, int64_t i, int64_t n, bool vec, const Vec<4>& r) {
  H* h = static_cast<H*>(dst) + i;
  if (vec && i + 4 <= n) {
    uint2 raw;
    H* e = reinterpret_cast<H*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = from_float<H>(r.v[k]);
    *reinterpret_cast<uint2*>(h) = raw;
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (i + k < n) h[k] = from_float<H>(r.v[k]);
}

__device__ __forceinline__ void store4_copy(HalfCopy type, void* dst, int64_t i, int64_t n, bool vec,
                                            const Vec<4>& r) {
  if (type == HalfCopy::BF16)
    store4_half<__nv_bfloat16>(dst, i, n, vec, r);
  else if (type == HalfCopy::F16)
    store4_half<__half>(dst, i, n, vec, r);
}

}  // namespace hone::cuda
