// Losses of the classification heads. Batches are small (B rows of a few classes), so
// each loss is one kernel of one block that also counts the rows and writes the mean:
// no second launch, no host read-back. The arithmetic is in double, as on the CPU;
// logits and their gradients are F32, BF16 or F16, the loss F32. The loss scale of mixed
// precision is read on the device, so the step never waits for the scaler.
#include <cmath>

#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

constexpr int kLossThreads = 512;
constexpr int32_t kIgnoreIndex = -100;  // torch.nn.CrossEntropyLoss's default

__device__ __forceinline__ double warp_max(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// grad_scale times loss_scale[0] when a loss scale is given.
__device__ __forceinline__ double gradient_scale(float grad_scale, const float* loss_scale) {
  return loss_scale ? double(grad_scale) * double(loss_scale[0]) : double(grad_scale);
}

// One warp per row. dlogits may alias logits: a lane reads only its own columns before
// writing them, except x[label], which lane 0 reads before the __syncwarp.
template <typename T>
__global__ void cross_entropy_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                     float grad_scale, const float* loss_scale, float* loss, T* dlogits) {
  __shared__ double scratch[32];
  int64_t valid = 0;  // the same in every thread
  for (int64_t r0 = 0; r0 < rows; r0 += blockDim.x) {
    const int64_t r = r0 + threadIdx.x;
    valid += __syncthreads_count(r < rows && labels[r] != kIgnoreIndex);
  }
  // With no valid row the loss and every gradient are 0 (torch gives NaN).
  const double coef = valid ? gradient_scale(grad_scale, loss_scale) / double(valid) : 0.0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double total = 0;  // lane 0's rows
  for (int64_t r = warp; r < rows; r += warps) {
    const T* x = logits + r * classes;
    T* dx = dlogits + r * classes;
    const int32_t label = labels[r];
    if (label == kIgnoreIndex) {
      for (int64_t c = lane; c < classes; c += 32) dx[c] = cuda::from_float<T>(0.0f);
      continue;
    }
    double mx = -INFINITY;
    for (int64_t c = lane; c < classes; c += 32) mx = fmax(mx, double(cuda::to_float(x[c])));
    mx = warp_max(mx);
    double sum = 0;
    for (int64_t c = lane; c < classes; c += 32) sum += exp(double(cuda::to_float(x[c])) - mx);
    const double lse = mx + log(cuda::warp_sum(sum));
    if (lane == 0) total += lse - double(cuda::to_float(x[label]));
    __syncwarp();
    for (int64_t c = lane; c < classes; c += 32)
      dx[c] = cuda::from_float<T>(float((exp(double(cuda::to_float(x[c])) - lse) - (c == label ? 1.0 : 0.0)) * coef));
  }
  total = cuda::block_sum(total, scratch);
  if (threadIdx.x == 0) loss[0] = valid ? float(total / double(valid)) : 0.0f;
}

// pred [B] or [B, 1], target [B]; dpred may alias pred (each element is one thread's).
template <typename T>
__global__ void mse_kernel(const T* pred, const float* target, int64_t n, float grad_scale, const float* loss_scale,
                           float* loss, T* dpred) {
  __shared__ double scratch[32];
  const double coef = n ? 2.0 * gradient_scale(grad_scale, loss_scale) / double(n) : 0.0;
  double total = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double diff = double(cuda::to_float(pred[i])) - target[i];
    total += diff * diff;
    dpred[i] = cuda::from_float<T>(float(diff * coef));
  }
  total = cuda::block_sum(total, scratch);
  if (threadIdx.x == 0) loss[0] = n ? float(total / double(n)) : 0.0f;
}

}  // namespace

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                const Tensor* loss_scale, Tensor& loss, Tensor& dlogits) {
  const float* sp = loss_scale ? loss_scale->f32() : nullptr;
  cuda::with_dtype(logits.dtype, "cross_entropy", [&](auto e) {
    using T = decltype(e);
    cross_entropy_kernel<<<1, kLossThreads, 0, stream()>>>(logits.ptr<T>(), labels.ptr<int32_t>(), logits.shape[0],
                                                            logits.shape[1], grad_scale, sp, loss.f32(),
                                                            dlogits.ptr<T>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor* loss_scale,
                      Tensor& loss, Tensor& dpred) {
  const float* sp = loss_scale ? loss_scale->f32() : nullptr;
  cuda::with_dtype(pred.dtype, "mse", [&](auto e) {
    using T = decltype(e);
    mse_kernel<<<1, kLossThreads, 0, stream()>>>(pred.ptr<T>(), target.f32(), target.numel(), grad_scale, sp,
                                                  loss.f32(), dpred.ptr<T>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace hone
