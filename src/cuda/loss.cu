// Losses of the classification heads. Batches are small (B rows of a few classes), so
// each loss is one kernel of one block that also counts the rows and writes the mean:
// no second launch, no host read-back. The arithmetic is in double, as on the CPU.
#include <cmath>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

constexpr int kLossThreads = 512;
constexpr int32_t kIgnoreIndex = -100;  // torch.nn.CrossEntropyLoss's default

__device__ __forceinline__ double warp_max(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp per row. dlogits may alias logits: a lane reads only its own columns before
// writing them, except x[label], which lane 0 reads before the __syncwarp.
__global__ void cross_entropy_kernel(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                     float grad_scale, float* loss, float* dlogits) {
  __shared__ double scratch[32];
  int64_t valid = 0;  // the same in every thread
  for (int64_t r0 = 0; r0 < rows; r0 += blockDim.x) {
    const int64_t r = r0 + threadIdx.x;
    valid += __syncthreads_count(r < rows && labels[r] != kIgnoreIndex);
  }
  // With no valid row the loss and every gradient are 0 (torch gives NaN).
  const double coef = valid ? double(grad_scale) / double(valid) : 0.0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double total = 0;  // lane 0's rows
  for (int64_t r = warp; r < rows; r += warps) {
    const float* x = logits + r * classes;
    float* dx = dlogits + r * classes;
    const int32_t label = labels[r];
    if (label == kIgnoreIndex) {
      for (int64_t c = lane; c < classes; c += 32) dx[c] = 0.0f;
      continue;
    }
    double mx = -INFINITY;
    for (int64_t c = lane; c < classes; c += 32) mx = fmax(mx, double(x[c]));
    mx = warp_max(mx);
    double sum = 0;
    for (int64_t c = lane; c < classes; c += 32) sum += exp(double(x[c]) - mx);
    const double lse = mx + log(cuda::warp_sum(sum));
    if (lane == 0) total += lse - double(x[label]);
    __syncwarp();
    for (int64_t c = lane; c < classes; c += 32)
      dx[c] = float((exp(double(x[c]) - lse) - (c == label ? 1.0 : 0.0)) * coef);
  }
  total = cuda::block_sum(total, scratch);
  if (threadIdx.x == 0) loss[0] = valid ? float(total / double(valid)) : 0.0f;
}

// pred [B] or [B, 1], target [B]; dpred may alias pred (each element is one thread's).
__global__ void mse_kernel(const float* pred, const float* target, int64_t n, float grad_scale, float* loss,
                           float* dpred) {
  __shared__ double scratch[32];
  const double coef = n ? 2.0 * double(grad_scale) / double(n) : 0.0;
  double total = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double diff = double(pred[i]) - target[i];
    total += diff * diff;
    dpred[i] = float(diff * coef);
  }
  total = cuda::block_sum(total, scratch);
  if (threadIdx.x == 0) loss[0] = n ? float(total / double(n)) : 0.0f;
}

}  // namespace

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, Tensor& loss,
                                Tensor& dlogits) {
  cross_entropy_kernel<<<1, kLossThreads, 0, stream()>>>(logits.f32(), labels.ptr<int32_t>(), logits.shape[0],
                                                          logits.shape[1], grad_scale, loss.f32(), dlogits.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& loss, Tensor& dpred) {
  mse_kernel<<<1, kLossThreads, 0, stream()>>>(pred.f32(), target.f32(), target.numel(), grad_scale, loss.f32(),
                                                dpred.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
