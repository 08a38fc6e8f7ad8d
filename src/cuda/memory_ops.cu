// fill, fill_normal, cast and add_scaled (copy and read are plain cudaMemcpyAsync, in cuda_backend.cpp).
#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/kernels.h"
#include "hone/normal.h"

namespace hone {

namespace {

using cuda::Vec;

// Groups of V = kVec<T> elements: one 16-byte store each when aligned and whole.
template <typename T>
__global__ void fill_kernel(T* x, int64_t n, bool vec, float value) {
  constexpr int V = cuda::kVec<T>;
  float q[V];
#pragma unroll
  for (int k = 0; k < V; ++k) q[k] = value;
  const int64_t groups = (n + V - 1) / V;
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    const int64_t i = V * g;
    if (vec && i + V <= n) {
      cuda::store_floats(x + i, q);
    } else {
      for (int64_t j = i; j < n && j < i + V; ++j) x[j] = cuda::from_float<T>(value);
    }
  }
}

// Pair k of normal_pair into x[2k], x[2k + 1] (the second dropped past n).
__global__ void fill_normal_kernel(float* x, int64_t n, float std, uint64_t seed, uint64_t rng_stream) {
  for (int64_t k = cuda::grid_start(); k < (n + 1) / 2; k += cuda::grid_stride()) {
    const NormalPair v = normal_pair(seed, rng_stream, uint64_t(k), std);
    x[2 * k] = v.a;
    if (2 * k + 1 < n) x[2 * k + 1] = v.b;
  }
}

// dst = src rounded to T, in groups of V = kVec<T> elements: one 16-byte store and V / 4
// float4 loads each when aligned and whole.
template <typename T>
__global__ void cast_kernel(const float* src, T* dst, int64_t n, bool vec) {
  constexpr int V = cuda::kVec<T>;
  const int64_t groups = (n + V - 1) / V;
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    const int64_t i = V * g;
    if (vec && i + V <= n) {
      float v[V];
#pragma unroll
      for (int h = 0; h < V; h += 4) {
        const Vec<4> f = cuda::load_vec<4>(src + i + h);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[h + k] = f.v[k];
      }
      cuda::store_floats(dst + i, v);
    } else {
      for (int64_t j = i; j < n && j < i + V; ++j) dst[j] = cuda::from_float<T>(src[j]);
    }
  }
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
  cuda::with_dtype(x.dtype, "fill", [&](auto t) {
    using T = decltype(t);
    T* p = x.ptr<T>();
    const int64_t groups = (n + cuda::kVec<T> - 1) / cuda::kVec<T>;
    fill_kernel<<<cuda::blocks_for(groups), cuda::kThreads, 0, stream()>>>(p, n, cuda::aligned16(p), value);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::fill_normal(Tensor& x, float std, uint64_t seed, uint64_t rng_stream) {
  const int64_t n = x.numel();
  if (n == 0) return;
  fill_normal_kernel<<<cuda::blocks_for((n + 1) / 2), cuda::kThreads, 0, stream()>>>(x.f32(), n, std, seed,
                                                                                      rng_stream);
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::cast(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  const float* sp = src.f32();
  cuda::with_dtype(dst.dtype, "cast", [&](auto t) {
    using T = decltype(t);
    T* dp = dst.ptr<T>();
    const int64_t groups = (n + cuda::kVec<T> - 1) / cuda::kVec<T>;
    const bool vec = cuda::aligned16(sp) && cuda::aligned16(dp);
    cast_kernel<<<cuda::blocks_for(groups), cuda::kThreads, 0, stream()>>>(sp, dp, n, vec);
    HONE_CUDA_LAUNCH_CHECK();
  });
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
