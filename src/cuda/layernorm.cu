// LayerNorm over the last dimension (biased variance), with the semantics of
// src/ops/layernorm.cpp. One row per warp up to 1024 columns (16-byte access when the
// width allows), the row held in registers so that the variance takes a second pass
// over registers rather than memory. x, gamma, beta, y, dy and dx are in the compute
// dtype T; the statistics, the parameter gradients and all arithmetic are F32.
#include <algorithm>
#include <initializer_list>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/rows.h"

namespace hone {

namespace {

// Runs of W columns per thread, W = 1 or kVec<T> (one 16-byte access). The vector
// variants keep 32 columns of each row array a thread whatever T, so 1024 columns fit one
// warp with W = 4 (F32) and W = 8 (BF16/F16) alike, at the same register cost (ptxas: at
// most 171 registers for the vector backward, 64 for the forward, no spills).
template <int W>
constexpr int kGroups = W == 1 ? 8 : 32 / W;
// The vector backward keeps 64 accumulators a thread and needs over 128 registers, so its
// rows may span at most this many threads (8192 columns).
constexpr int kBackwardVecThreads = 256;

// 16-byte access: the row length a multiple of kVec<T> and every pointer aligned.
template <typename T>
bool vec_ok(int64_t cols, std::initializer_list<const void*> ptrs) {
  return cols % cuda::kVec<T> == 0 && cuda::vec4_ok(cols, ptrs);
}

template <int W, typename T>
__device__ __forceinline__ void load_run(const T* p, float (&v)[W]) {
  if constexpr (W == 1)
    v[0] = cuda::to_float(*p);
  else
    cuda::load_floats<T, W>(p, v);
}

template <int W, typename T>
__device__ __forceinline__ void store_run(T* p, const float (&v)[W]) {
  if constexpr (W == 1)
    *p = cuda::from_float<T>(v[0]);
  else
    cuda::store_floats<T, W>(p, v);
}

template <typename T, int W>
__global__ void __launch_bounds__(1024)
    layernorm_forward_kernel(const T* x, const T* __restrict__ gamma, const T* __restrict__ beta, float eps, T* y,
                             float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int cols) {
  constexpr int G = kGroups<W>;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;  // dead threads still take part in the reductions
  const T* xr = x + row * cols;
  float v[G][W];
  float sum = 0.0f;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= cols) continue;
    load_run<W>(xr + c, v[g]);
    #pragma unroll
    for (int t = 0; t < W; ++t) sum += v[g][t];
  }
  const float mu = cuda::row_sum(sum) / cols;
  float sq = 0.0f;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= cols) continue;
    #pragma unroll
    for (int t = 0; t < W; ++t) sq += (v[g][t] - mu) * (v[g][t] - mu);
  }
  const float rs = 1.0f / sqrtf(cuda::row_sum(sq) / cols + eps);
  if (!live) return;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (c >= cols) continue;
    float gm[W], bt[W];
    load_run<W>(gamma + c, gm);
    load_run<W>(beta + c, bt);
    #pragma unroll
    for (int t = 0; t < W; ++t) v[g][t] = (v[g][t] - mu) * rs * gm[t] + bt[t];
    store_run<W>(y + row * cols + c, v[g]);
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, per row; dgamma and
// dbeta are summed over the block's rows in registers, then over the block's row slots
// through shared memory, and added with one atomic per column and block. Each thread
// reads its dy and x before writing the same elements of dx, so dx may alias dy.
template <typename T, int W>
__global__ void __launch_bounds__(W > 1 ? kBackwardVecThreads : 1024)
    layernorm_backward_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* dx,
                              float* __restrict__ dgamma, float* __restrict__ dbeta, int64_t rows, int cols) {
  constexpr int G = kGroups<W>;
  float dg[G][W] = {}, db[G][W] = {};
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < rows; first += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = first + threadIdx.y;
    const bool live = row < rows;
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float xh[G][W], gv[G][W];
    float sum_g = 0.0f, sum_gx = 0.0f;
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      const int c = (g * blockDim.x + threadIdx.x) * W;
      if (!live || c >= cols) continue;
      float d[W], gm[W];
      load_run<W>(dy + row * cols + c, d);
      load_run<W>(x + row * cols + c, xh[g]);
      load_run<W>(gamma + c, gm);
      #pragma unroll
      for (int t = 0; t < W; ++t) {
        xh[g][t] = (xh[g][t] - m) * rs;
        gv[g][t] = d[t] * gm[t];
        sum_g += gv[g][t];
        sum_gx += gv[g][t] * xh[g][t];
        dg[g][t] += d[t] * xh[g][t];
        db[g][t] += d[t];
      }
    }
    const float mean_g = cuda::row_sum(sum_g) / cols, mean_gx = cuda::row_sum(sum_gx) / cols;
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      const int c = (g * blockDim.x + threadIdx.x) * W;
      if (!live || c >= cols) continue;
      #pragma unroll
      for (int t = 0; t < W; ++t) gv[g][t] = rs * (gv[g][t] - mean_g - xh[g][t] * mean_gx);
      store_run<W>(dx + row * cols + c, gv[g]);
    }
  }

  if (blockDim.y == 1) {
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      const int c = (g * blockDim.x + threadIdx.x) * W;
      if (c >= cols) continue;
      #pragma unroll
      for (int t = 0; t < W; ++t) {
        atomicAdd(dgamma + c + t, dg[g][t]);
        atomicAdd(dbeta + c + t, db[g][t]);
      }
    }
    return;
  }
  // Several row slots share the columns: add them up first. With blockDim.y > 1 the
  // block has kRowBlockThreads threads.
  __shared__ float red[2][cuda::kRowBlockThreads * W];
  const int span = blockDim.x * W;  // columns of one group
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    __syncthreads();  // the previous group's sums have been read
    #pragma unroll
    for (int t = 0; t < W; ++t) {
      red[0][threadIdx.y * span + threadIdx.x * W + t] = dg[g][t];
      red[1][threadIdx.y * span + threadIdx.x * W + t] = db[g][t];
    }
    __syncthreads();
    for (int j = tid; j < span && g * span + j < cols; j += nthreads) {
      float a = 0.0f, b = 0.0f;
      for (int s = 0; s < int(blockDim.y); ++s) {
        a += red[0][s * span + j];
        b += red[1][s * span + j];
      }
      atomicAdd(dgamma + g * span + j, a);
      atomicAdd(dbeta + g * span + j, b);
    }
  }
}

template <typename T, int W>
void layernorm_forward_as(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                          Tensor& mean, Tensor& rstd, int64_t rows, int64_t cols, cudaStream_t stream) {
  const cuda::RowLaunch l = cuda::row_launch("layernorm_forward", rows, cols, W, kGroups<W>);
  layernorm_forward_kernel<T, W><<<l.grid, l.block, 0, stream>>>(x.ptr<T>(), gamma.ptr<T>(), beta.ptr<T>(), eps,
                                                                  y.ptr<T>(), mean.f32(), rstd.f32(), rows, int(cols));
  HONE_CUDA_LAUNCH_CHECK();
}

template <typename T, int W>
void layernorm_backward_as(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, int64_t rows, int64_t cols,
                           int sms, cudaStream_t stream) {
  cuda::RowLaunch l =
      cuda::row_launch("layernorm_backward", rows, cols, W, kGroups<W>, W > 1 ? kBackwardVecThreads : 1024);
  // One wave of blocks at most: more rows per block means fewer atomics per column.
  l.grid.x = std::min(l.grid.x, unsigned(4 * sms));
  layernorm_backward_kernel<T, W><<<l.grid, l.block, 0, stream>>>(dy.ptr<T>(), x.ptr<T>(), gamma.ptr<T>(),
                                                                   mean.f32(), rstd.f32(), dx.ptr<T>(), dgamma.f32(),
                                                                   dbeta.f32(), rows, int(cols));
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                    Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  cuda::with_dtype(x.dtype, "layernorm_forward", [&](auto t) {
    using T = decltype(t);
    if (vec_ok<T>(cols, {x.data, gamma.data, beta.data, y.data}))
      layernorm_forward_as<T, cuda::kVec<T>>(x, gamma, beta, eps, y, mean, rstd, rows, cols, stream_);
    else
      layernorm_forward_as<T, 1>(x, gamma, beta, eps, y, mean, rstd, rows, cols, stream_);
  });
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  int sms = 0;
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  cuda::with_dtype(x.dtype, "layernorm_backward", [&](auto t) {
    using T = decltype(t);
    if (vec_ok<T>(cols, {dy.data, x.data, gamma.data, dx.data}))
      layernorm_backward_as<T, cuda::kVec<T>>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, sms, stream_);
    else
      layernorm_backward_as<T, 1>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, sms, stream_);
  });
}

}  // namespace hone
