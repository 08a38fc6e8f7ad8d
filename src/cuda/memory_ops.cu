// fill and add_scaled (copy and read are plain cudaMemcpyAsync, in cuda_backend.cpp).
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

using cuda::Vec;

__global__ void fill_kernel(float* x, int64_t n, bool vec, float value) {
  const Vec<4> q{{value, value, value, value}};
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) cuda::store4(x, 4 * g, n, vec, q);
}

// y += alpha * x; x may be y itself (each element is read and written by one thread).
__global__ void add_scaled_kernel(const float* x, float alpha, float* y, int64_t n, bool vec) {
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    const Vec<4> a = cuda::load4(x, 4 * g, n, vec);
    Vec<4> b = cuda::load4(y, 4 * g, n, vec);
#pragma unroll
    for (int k = 0; k < 4; ++k) b.v[k] += alpha * a.v[k];
    cuda::store4(y, 4 * g, n, vec, b);
  }
}

}  // namespace

void CudaBackend::fill(Tensor& x, float value) {
  const int64_t n = x.numel();
  if (n == 0) return;
  float* p = x.f32();
  fill_kernel<<<cuda::blocks_for(cuda::groups_of_4(n)), cuda::kThreads, 0, stream()>>>(p, n, cuda::aligned16(p), value);
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::add_scaled(const Tensor& x, float alpha, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const float* xp = x.f32();
  float* yp = y.f32();
  const bool vec = cuda::aligned16(xp) && cuda::aligned16(yp);
  add_scaled_kernel<<<cuda::blocks_for(cuda::groups_of_4(n)), cuda::kThreads, 0, stream()>>>(xp, alpha, yp, n, vec);
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
