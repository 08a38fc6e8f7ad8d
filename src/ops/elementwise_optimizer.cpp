// Element-wise optimizers: torch.optim.SGD (momentum, dampening, Nesterov, L2 weight
// decay), torch.optim.Adagrad and bitsandbytes' 32-bit Lion (decoupled weight decay),
// each element read and written once.
#include <algorithm>
#include <cmath>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

void elementwise_optimizer(Backend& be, ElementwiseOptimizer kind, const ElementwiseSlice* slices, int count,
                           const Tensor& scalars, const Tensor& norm_coef) {
  const char* op = "elementwise_optimizer";
  for (int i = 0; i < count; ++i) {
    const ElementwiseSlice& x = slices[i];
    detail::expect_dtype(op, "param", x.param, DType::F32);
    detail::expect("elementwise_optimizer", "grad", x.grad, DType::F32, x.param.shape);
    const bool stateless = kind == ElementwiseOptimizer::Sgd && !x.state.data;
    if (!stateless) detail::expect(op, "state", x.state, DType::F32, x.param.shape);
    if (x.half.data) {
      if (x.half.dtype != DType::BF16 && x.half.dtype != DType::F16)
        fail("{}: half has dtype {}, expected BF16 or F16", op, dtype_name(x.half.dtype));
      detail::expect_shape(op, "half", x.half, x.param.shape);
    }
  }
  detail::expect(op, "scalars", scalars, DType::F32, {kElementwiseScalarsSize});
  detail::expect(op, "norm_coef", norm_coef, DType::F32, {kNormCoefSize});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Optimizer, [&] {
    double moved = 0;  // param and state read and written, grad read, the half copy written
    for (int i = 0; i < count; ++i)
      moved += detail::bytes(slices[i].param, slices[i].param, slices[i].grad, slices[i].half) +
               2 * detail::bytes(slices[i].state);
    return OpCost{0, moved};
  });
  for (int first = 0; first < count; first += kMaxTensorList)
    be.elementwise_optimizer(kind, slices + first, std::min(kMaxTensorList, count - first), scalars, norm_coef);
}

}  // namespace ops

void CpuBackend::elementwise_optimizer(ElementwiseOptimizer kind, const ElementwiseSlice* slices, int count,
                                       const Tensor& scalars, const Tensor& norm_coef) {
  if (norm_coef.f32()[2] != 0) return;  // a skipped step: the gradients overflowed
  const ElementwiseScalars k = *reinterpret_cast<const ElementwiseScalars*>(scalars.f32());
  const float clip = norm_coef.f32()[1];
  for (int t = 0; t < count; ++t) {
    const ElementwiseSlice& x = slices[t];
    float *p = x.param.f32(), *st = x.state.data ? x.state.f32() : nullptr;
    const float* gp = x.grad.f32();
    const float wd = x.decay ? k.weight_decay : 0.0f;
    uint16_t* hp = x.half.ptr<uint16_t>();
    uint16_t (*round)(float) = x.half.dtype == DType::F16 ? float_to_f16 : float_to_bf16;
    const int64_t n = x.param.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float g = gp[i] * clip;
      switch (kind) {
        case ElementwiseOptimizer::Sgd:
          if (wd != 0) g = g + wd * p[i];
          if (st) {
            st[i] = k.first != 0 ? g : st[i] * k.beta1 + k.beta2 * g;  // buf.mul_(momentum).add_(g, 1 - dampening)
            g = k.nesterov != 0 ? g + k.beta1 * st[i] : st[i];
          }
          p[i] = p[i] - k.lr * g;
          break;
        case ElementwiseOptimizer::Adagrad:
          if (wd != 0) g = g + wd * p[i];
          st[i] = st[i] + g * g;
          p[i] = p[i] - k.lr * (g / (std::sqrt(st[i]) + k.eps));
          break;
        case ElementwiseOptimizer::Lion: {
          if (wd != 0) p[i] = p[i] * (1.0f - k.lr * wd);
          const float c = st[i] * k.beta1 + (1.0f - k.beta1) * g;
          p[i] = p[i] - k.lr * float((c > 0) - (c < 0));
          st[i] = st[i] * k.beta2 + (1.0f - k.beta2) * g;
          break;
        }
      }
      if (hp) hp[i] = round(p[i]);
    }
  }
}

}  // namespace hone
