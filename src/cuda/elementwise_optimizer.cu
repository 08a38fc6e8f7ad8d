// Element-wise optimizers (SGD, Adagrad, bitsandbytes' 32-bit Lion): one launch for every
// slice of the list; operation for operation the CPU reference (src/ops/elementwise_optimizer.cpp),
// with _rn intrinsics so that no multiply-add is contracted.
#include <algorithm>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "cuda/param_copy.h"

namespace hone {
namespace {

using cuda::HalfCopy;
using cuda::Vec;

struct ElementwiseList {
  float* param[kMaxTensorList];
  const float* grad[kMaxTensorList];
  float* state[kMaxTensorList];  // null: SGD without momentum
  void* half[kMaxTensorList];
  int64_t n[kMaxTensorList];
  bool decay[kMaxTensorList];
  HalfCopy half_type[kMaxTensorList];
  bool vec[kMaxTensorList];
};

template <ElementwiseOptimizer Kind>
__device__ __forceinline__ void update(float& p, float& st, bool has_state, float g, float wd,
                                       const ElementwiseScalars& k) {
  if constexpr (Kind == ElementwiseOptimizer::Sgd) {
    if (wd != 0.0f) g = __fadd_rn(g, __fmul_rn(wd, p));
    if (has_state) {
      st = k.first != 0.0f ? g : __fadd_rn(__fmul_rn(st, k.beta1), __fmul_rn(k.beta2, g));
      g = k.nesterov != 0.0f ? __fadd_rn(g, __fmul_rn(k.beta1, st)) : st;
    }
    p = __fsub_rn(p, __fmul_rn(k.lr, g));
  } else if constexpr (Kind == ElementwiseOptimizer::Adagrad) {
    if (wd != 0.0f) g = __fadd_rn(g, __fmul_rn(wd, p));
    st = __fadd_rn(st, __fmul_rn(g, g));
    p = __fsub_rn(p, __fmul_rn(k.lr, __fdiv_rn(g, __fadd_rn(__fsqrt_rn(st), k.eps))));
  } else {
    if (wd != 0.0f) p = __fmul_rn(p, __fsub_rn(1.0f, __fmul_rn(k.lr, wd)));
    const float c = __fadd_rn(__fmul_rn(st, k.beta1), __fmul_rn(__fsub_rn(1.0f, k.beta1), g));
    p = __fsub_rn(p, __fmul_rn(k.lr, float((c > 0.0f) - (c < 0.0f))));
    st = __fadd_rn(__fmul_rn(st, k.beta2), __fmul_rn(__fsub_rn(1.0f, k.beta2), g));
  }
}

template <ElementwiseOptimizer Kind>
__global__ void elementwise_optimizer_kernel(ElementwiseList list, const ElementwiseScalars* scalars,
                                             const float* norm_coef) {
  if (norm_coef[2] != 0.0f) return;  // a skipped step: the gradients overflowed
  const ElementwiseScalars k = *scalars;
  const int t = blockIdx.y;
  float *param = list.param[t], *state = list.state[t];
  const int64_t n = list.n[t];
  const bool vec = list.vec[t], has_state = state != nullptr;
  const float wd = list.decay[t] ? k.weight_decay : 0.0f, clip = norm_coef[1];
  for (int64_t gi = cuda::grid_start(); gi < cuda::groups_of_4(n); gi += cuda::grid_stride()) {
    const int64_t i = 4 * gi;
    Vec<4> p = cuda::load4(param, i, n, vec), s{};
    if (has_state) s = cuda::load4(state, i, n, vec);
    const Vec<4> g = cuda::load4(list.grad[t], i, n, vec);
#pragma unroll
    for (int j = 0; j < 4; ++j) update<Kind>(p.v[j], s.v[j], has_state, __fmul_rn(g.v[j], clip), wd, k);
    cuda::store4(param, i, n, vec, p);
    if (has_state) cuda::store4(state, i, n, vec, s);
    cuda::store4_copy(list.half_type[t], list.half[t], i, n, vec, p);
  }
}

}  // namespace

void CudaBackend::elementwise_optimizer(ElementwiseOptimizer kind, const ElementwiseSlice* slices, int count,
                                        const Tensor& scalars, const Tensor& norm_coef) {
  ElementwiseList list{};
  int64_t longest = 0;
  for (int t = 0; t < count; ++t) {
    const ElementwiseSlice& x = slices[t];
    list.param[t] = x.param.f32();
    list.grad[t] = x.grad.f32();
    list.state[t] = x.state.data ? x.state.f32() : nullptr;
    list.half[t] = x.half.data;
    list.n[t] = x.param.numel();
    list.decay[t] = x.decay;
    list.half_type[t] = cuda::half_copy(x.half);
    list.vec[t] = cuda::aligned16(list.param[t]) && cuda::aligned16(list.grad[t]) &&
                  cuda::aligned16(list.state[t]) && reinterpret_cast<uintptr_t>(list.half[t]) % 8 == 0;
    longest = std::max(longest, list.n[t]);
  }
  if (count == 0 || longest == 0) return;
  constexpr int kMaxBlocksPerTensor = 2048;  // blocks past a short tensor's end return at once
  const dim3 grid(std::min(cuda::blocks_for(cuda::groups_of_4(longest)), kMaxBlocksPerTensor), count);
  const auto* k = reinterpret_cast<const ElementwiseScalars*>(scalars.f32());
  switch (kind) {
    case ElementwiseOptimizer::Sgd:
      elementwise_optimizer_kernel<ElementwiseOptimizer::Sgd><<<grid, cuda::kThreads, 0, stream()>>>(list, k, norm_coef.f32());
      break;
    case ElementwiseOptimizer::Adagrad:
      elementwise_optimizer_kernel<ElementwiseOptimizer::Adagrad><<<grid, cuda::kThreads, 0, stream()>>>(list, k, norm_coef.f32());
      break;
    case ElementwiseOptimizer::Lion:
      elementwise_optimizer_kernel<ElementwiseOptimizer::Lion><<<grid, cuda::kThreads, 0, stream()>>>(list, k, norm_coef.f32());
      break;
  }
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
