// Gradient clipping (torch.nn.utils.clip_grad_norm_) and torch.optim.AdamW. The clip
// coefficient stays on the device: adamw reads it there, so a step never waits on the host.
#include <cmath>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

using cuda::Vec;

// Blocks of sum_squares at most. Each block adds its partial to out[0] with one float
// atomic, which rounds; a few hundred of them keep the sum within ~1e-6 of the CPU's
// double sum while still filling the GPU (the loop below covers the rest).
constexpr int kSumSquaresMaxBlocks = 512;

// Squares are exact in double and summed in double per thread and per block, as the CPU
// does; only the final atomicAdd into the F32 output rounds.
__global__ void sum_squares_kernel(const float* x, int64_t n, bool vec, float* out) {
  __shared__ double scratch[32];
  double acc = 0;
  const int64_t groups = cuda::groups_of_4(n);
#pragma unroll 4
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    const Vec<4> q = cuda::load4(x, 4 * g, n, vec);  // past n: zeros, which add nothing
#pragma unroll
    for (int k = 0; k < 4; ++k) acc = fma(double(q.v[k]), double(q.v[k]), acc);
  }
  acc = cuda::block_sum(acc, scratch);
  if (threadIdx.x == 0) atomicAdd(out, float(acc));
}

// One thread; the CPU's formula in double.
__global__ void clip_coefficient_kernel(const float* sumsq, float max_norm, float* norm_coef) {
  const double norm = sqrt(double(sumsq[0]));
  double coef = 1.0;
  if (max_norm > 0) {
    coef = double(max_norm) / (norm + 1e-6);
    if (coef > 1.0) coef = 1.0;  // written so that a NaN norm stays NaN, as torch's clamp
  }
  norm_coef[0] = float(norm);
  norm_coef[1] = float(coef);
}

// The step's scalars, computed on the host in double as the CPU backend does.
struct AdamWScalars {
  float decay, step_size, bias2_sqrt, w1, w2, b2, eps;
};

// The CPU's update, operation for operation. The _rn intrinsics forbid FMA contraction
// and the default sqrtf and division are correctly rounded, so every element rounds
// exactly as the CPU reference (which is built without FMA).
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, bool vec,
                             AdamWScalars s, const float* norm_coef) {
  const float clip = norm_coef[1];
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t gi = cuda::grid_start(); gi < groups; gi += cuda::grid_stride()) {
    const int64_t i = 4 * gi;
    Vec<4> p = cuda::load4(param, i, n, vec), mm = cuda::load4(m, i, n, vec), vv = cuda::load4(v, i, n, vec);
    const Vec<4> gr = cuda::load4(grad, i, n, vec);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float g = __fmul_rn(gr.v[k], clip);
      p.v[k] = __fmul_rn(p.v[k], s.decay);
      mm.v[k] = __fadd_rn(mm.v[k], __fmul_rn(s.w1, __fsub_rn(g, mm.v[k])));  // exp_avg.lerp_(grad, 1 - beta1)
      vv.v[k] = __fadd_rn(__fmul_rn(vv.v[k], s.b2), __fmul_rn(__fmul_rn(s.w2, g), g));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv.v[k]), s.bias2_sqrt), s.eps);
      p.v[k] = __fsub_rn(p.v[k], __fmul_rn(s.step_size, __fdiv_rn(mm.v[k], denom)));
    }
    cuda::store4(param, i, n, vec, p);
    cuda::store4(m, i, n, vec, mm);
    cuda::store4(v, i, n, vec, vv);
  }
}

}  // namespace

void CudaBackend::sum_squares(const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const float* xp = x.f32();
  const int blocks = std::min(cuda::blocks_for(cuda::groups_of_4(n)), kSumSquaresMaxBlocks);
  sum_squares_kernel<<<blocks, cuda::kThreads, 0, stream()>>>(xp, n, cuda::aligned16(xp), out.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm_coef) {
  clip_coefficient_kernel<<<1, 1, 0, stream()>>>(sumsq.f32(), max_norm, norm_coef.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                        const Tensor& norm_coef) {
  const int64_t n = param.numel();
  if (n == 0) return;
  // As src/ops/optimizer.cpp: the step's scalars in double, as torch computes them from
  // Python floats, then rounded to float once.
  const double lr = s.lr;
  AdamWScalars k;
  k.decay = float(1.0 - lr * s.weight_decay);
  k.step_size = float(lr / (1.0 - std::pow(double(s.beta1), double(s.step))));
  k.bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(s.beta2), double(s.step))));
  k.w1 = float(1.0 - s.beta1);
  k.w2 = float(1.0 - s.beta2);
  k.b2 = float(s.beta2);
  k.eps = float(s.eps);
  float *pp = param.f32(), *mp = m.f32(), *vp = v.f32();
  const float* gp = grad.f32();
  const bool vec = cuda::aligned16(pp) && cuda::aligned16(gp) && cuda::aligned16(mp) && cuda::aligned16(vp);
  adamw_kernel<<<cuda::blocks_for(cuda::groups_of_4(n)), cuda::kThreads, 0, stream()>>>(pp, gp, mp, vp, n, vec, k,
                                                                                         norm_coef.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
