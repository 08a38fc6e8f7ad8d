// Gradient clipping (torch.nn.utils.clip_grad_norm_), dynamic loss scaling
// (torch.amp.GradScaler) and torch.optim.AdamW. The clip coefficient, the skip flag and the
// scaler stay on the device: adamw reads them there, so a step never waits on the host.
#include <algorithm>
#include <cmath>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "cuda/param_copy.h"

namespace hone {

namespace {

using cuda::HalfCopy;
using cuda::Vec;

// Blocks of sum_squares at most: one double partial each in the backend's reduction
// scratch (the loop below covers the rest of the elements).
constexpr int kSumSquaresMaxBlocks = CudaBackend::kReduceSlots;

// Tensor lists travel as kernel arguments (a few KB at most): one launch for every
// parameter group. blockIdx.y picks the tensor, blockIdx.x strides through it.
struct SumSquaresList {
  const float* x[kMaxTensorList];
  int64_t n[kMaxTensorList];
  bool vec[kMaxTensorList];
};

// Squares are exact in double and summed in double per thread and per block, as the CPU
// does. Each block leaves its partial in `partials`; the last block to finish (counted in
// `arrived`, which it resets) adds them in double and rounds once into out[0], so the
// result does not depend on how many blocks there were.
__global__ void sum_squares_kernel(SumSquaresList list, float* out, double* partials, unsigned* arrived) {
  __shared__ double scratch[32];
  __shared__ bool last;
  const int t = blockIdx.y;
  const float* x = list.x[t];
  const int64_t n = list.n[t];
  double acc = 0;
  const int64_t groups = cuda::groups_of_4(n), stride = cuda::grid_stride();
  // Each thread keeps four 16-byte loads in flight, issued before any is used: one at a
  // time left the memory system idle.
  constexpr int kInFlight = 4;
  for (int64_t g = cuda::grid_start(); g < groups; g += kInFlight * stride) {
    Vec<4> q[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
      q[j] = cuda::load4(x, 4 * (g + j * stride), n, list.vec[t]);  // past n: zeros, which add nothing
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc = fma(double(q[j].v[k]), double(q[j].v[k]), acc);
  }
  acc = cuda::block_sum(acc, scratch);
  const unsigned blocks = gridDim.x * gridDim.y;
  if (threadIdx.x == 0) {
    partials[blockIdx.y * gridDim.x + blockIdx.x] = acc;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(arrived, 1u) == blocks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  double total = 0;
  for (unsigned i = threadIdx.x; i < blocks; i += blockDim.x) total += static_cast<volatile double*>(partials)[i];
  total = cuda::block_sum(total, scratch);
  if (threadIdx.x == 0) {
    out[0] = float(double(out[0]) + total);
    *arrived = 0;
  }
}

// One thread; the CPU's formulas in double. Without a scaler inv_scale is 1 and the
// products by it are exact. scaler may be null.
__global__ void clip_coefficient_kernel(const float* sumsq, float max_norm, float* norm_coef, float* scaler,
                                        LossScaling ls) {
  const double inv_scale = scaler ? 1.0 / double(scaler[0]) : 1.0;
  const double norm = sqrt(double(sumsq[0])) * inv_scale;
  double coef = 1.0;
  if (max_norm > 0) {
    coef = double(max_norm) / (norm + 1e-6);
    if (coef > 1.0) coef = 1.0;  // written so that a NaN norm stays NaN, as torch's clamp
  }
  const bool overflow = scaler && !isfinite(sumsq[0]);
  norm_coef[0] = float(norm);
  norm_coef[1] = float(coef * inv_scale);
  norm_coef[2] = overflow ? 1.0f : 0.0f;
  if (!scaler) return;
  // torch's _amp_update_scale_: back off on an overflow, grow after growth_interval clean
  // steps in a row (unless the grown scale would overflow float).
  if (overflow) {
    scaler[0] *= ls.backoff_factor;
    scaler[1] = 0.0f;
  } else if (const float clean = scaler[1] + 1.0f; clean >= float(ls.growth_interval)) {
    const float grown = scaler[0] * ls.growth_factor;
    if (isfinite(grown)) scaler[0] = grown;
    scaler[1] = 0.0f;
  } else {
    scaler[1] = clean;
  }
}

struct AdamWList {
  float* param[kMaxTensorList];
  const float* grad[kMaxTensorList];
  float* m[kMaxTensorList];
  float* v[kMaxTensorList];
  void* half[kMaxTensorList];
  int64_t n[kMaxTensorList];
  float decay[kMaxTensorList];  // 1 - lr * weight_decay of each slice, unless decay_from_step
  bool decay_from_step[kMaxTensorList];  // the slice's decay is the step's scalars' (in memory)
  HalfCopy half_type[kMaxTensorList];
  bool vec[kMaxTensorList];  // 16-byte F32 access and 8-byte access to the half copy
};

// The CPU's update, operation for operation. The _rn intrinsics forbid FMA contraction
// and the default sqrtf and division are correctly rounded, so every element rounds
// exactly as the CPU reference (which is built without FMA).
// The step's scalars come by value, or from memory (step_scalars) when a replayed graph
// must read the current update's.
__global__ void adamw_kernel(AdamWList list, AdamWScalars by_value, const AdamWScalars* step_scalars,
                             const float* norm_coef) {
  if (norm_coef[2] != 0.0f) return;  // a skipped step: the gradients overflowed
  const AdamWScalars s = step_scalars ? *step_scalars : by_value;
  const int t = blockIdx.y;
  float *param = list.param[t], *m = list.m[t], *v = list.v[t];
  const float* grad = list.grad[t];
  const int64_t n = list.n[t];
  const bool vec = list.vec[t];
  const float decay = list.decay_from_step[t] ? s.decay : list.decay[t];
  const float clip = norm_coef[1];
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t gi = cuda::grid_start(); gi < groups; gi += cuda::grid_stride()) {
    const int64_t i = 4 * gi;
    Vec<4> p = cuda::load4(param, i, n, vec), mm = cuda::load4(m, i, n, vec), vv = cuda::load4(v, i, n, vec);
    const Vec<4> gr = cuda::load4(grad, i, n, vec);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float g = __fmul_rn(gr.v[k], clip);
      p.v[k] = __fmul_rn(p.v[k], decay);
      mm.v[k] = __fadd_rn(mm.v[k], __fmul_rn(s.w1, __fsub_rn(g, mm.v[k])));  // exp_avg.lerp_(grad, 1 - beta1)
      vv.v[k] = __fadd_rn(__fmul_rn(vv.v[k], s.b2), __fmul_rn(__fmul_rn(s.w2, g), g));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv.v[k]), s.bias2_sqrt), s.eps);
      p.v[k] = __fsub_rn(p.v[k], __fmul_rn(s.step_size, __fdiv_rn(mm.v[k], denom)));
    }
    cuda::store4(param, i, n, vec, p);
    cuda::store4(m, i, n, vec, mm);
    cuda::store4(v, i, n, vec, vv);
    cuda::store4_copy(list.half_type[t], list.half[t], i, n, vec, p);
  }
}

}  // namespace

void CudaBackend::sum_squares(const Tensor* xs, int count, Tensor& out) {
  SumSquaresList list{};
  int64_t longest = 0;
  for (int t = 0; t < count; ++t) {
    list.x[t] = xs[t].f32();
    list.n[t] = xs[t].numel();
    list.vec[t] = cuda::aligned16(list.x[t]);
    longest = std::max(longest, list.n[t]);
  }
  if (count == 0 || longest == 0) return;
  const int per_tensor = std::max(1, std::min(cuda::blocks_for(cuda::groups_of_4(longest)),
                                              kSumSquaresMaxBlocks / count));
  double* partials = static_cast<double*>(reduce_scratch_);
  sum_squares_kernel<<<dim3(per_tensor, count), cuda::kThreads, 0, stream()>>>(
      list, out.f32(), partials, reinterpret_cast<unsigned*>(partials + kReduceSlots));
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm_coef, Tensor* scaler,
                                   const LossScaling& ls) {
  clip_coefficient_kernel<<<1, 1, 0, stream()>>>(sumsq.f32(), max_norm, norm_coef.f32(),
                                                 scaler ? scaler->f32() : nullptr, ls);
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::adamw(const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef) {
  const AdamWScalars k = adamw_scalars(s);
  const auto* in_memory = s.scalars ? reinterpret_cast<const AdamWScalars*>(s.scalars->f32()) : nullptr;
  AdamWList list{};
  int64_t longest = 0;
  for (int t = 0; t < count; ++t) {
    const AdamWSlice& x = slices[t];
    list.param[t] = x.param.f32();
    list.grad[t] = x.grad.f32();
    list.m[t] = x.m.f32();
    list.v[t] = x.v.f32();
    list.n[t] = x.param.numel();
    list.decay[t] = x.weight_decay == 0 ? 1.0f : float(1.0 - s.lr * x.weight_decay);
    list.decay_from_step[t] = in_memory && x.weight_decay != 0;
    list.half[t] = x.half.data;
    list.half_type[t] = cuda::half_copy(x.half);
    list.vec[t] = cuda::aligned16(list.param[t]) && cuda::aligned16(list.grad[t]) && cuda::aligned16(list.m[t]) &&
                  cuda::aligned16(list.v[t]) && reinterpret_cast<uintptr_t>(list.half[t]) % 8 == 0;
    longest = std::max(longest, list.n[t]);
  }
  if (count == 0 || longest == 0) return;
  // Blocks past a short tensor's end return at once; a cap keeps them few.
  constexpr int kMaxBlocksPerTensor = 2048;
  const int per_tensor = std::min(cuda::blocks_for(cuda::groups_of_4(longest)), kMaxBlocksPerTensor);
  adamw_kernel<<<dim3(per_tensor, count), cuda::kThreads, 0, stream()>>>(
      list, k, in_memory, norm_coef.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
