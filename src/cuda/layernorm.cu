// LayerNorm over the last dimension (biased variance), with the semantics of
// src/ops/layernorm.cpp. One row per warp up to 1024 columns (float4 access when the
// width allows), the row held in registers so that the variance takes a second pass
// over registers rather than memory.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/rows.h"

namespace hone {

namespace {

constexpr int kGroups = 8;  // runs of W columns per thread: 1024 columns fit one warp with W = 4
// The float4 backward keeps 64 accumulators a thread and needs over 128 registers, so its
// rows may span at most this many threads (8192 columns).
constexpr int kBackwardVecThreads = 256;

template <int W>
__global__ void __launch_bounds__(1024) layernorm_forward_kernel(const float* x, const float* __restrict__ gamma,
                                         const float* __restrict__ beta, float eps, float* y,
                                         float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                                         int cols) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;  // dead threads still take part in the reductions
  const float* xr = x + row * cols;
  float v[kGroups][W];
  float sum = 0.0f;
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= cols) continue;
    cuda::load<W>(xr + c, v[g]);
    #pragma unroll
    for (int t = 0; t < W; ++t) sum += v[g][t];
  }
  const float mu = cuda::row_sum(sum) / cols;
  float sq = 0.0f;
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= cols) continue;
    #pragma unroll
    for (int t = 0; t < W; ++t) sq += (v[g][t] - mu) * (v[g][t] - mu);
  }
  const float rs = 1.0f / sqrtf(cuda::row_sum(sq) / cols + eps);
  if (!live) return;
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (c >= cols) continue;
    float gm[W], bt[W];
    cuda::load<W>(gamma + c, gm);
    cuda::load<W>(beta + c, bt);
    #pragma unroll
    for (int t = 0; t < W; ++t) v[g][t] = (v[g][t] - mu) * rs * gm[t] + bt[t];
    cuda::store<W>(y + row * cols + c, v[g]);
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
template <int W>
__global__ void __launch_bounds__(W == 4 ? kBackwardVecThreads : 1024) layernorm_backward_kernel(const float* dy, const float* __restrict__ x,
                                          const float* __restrict__ gamma, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, float* dx, float* __restrict__ dgamma,
                                          float* __restrict__ dbeta, int64_t rows, int cols) {
  float dg[kGroups][W] = {}, db[kGroups][W] = {};
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < rows; first += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = first + threadIdx.y;
    const bool live = row < rows;
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float xh[kGroups][W], gv[kGroups][W];
    float sum_g = 0.0f, sum_gx = 0.0f;
    #pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int c = (g * blockDim.x + threadIdx.x) * W;
      if (!live || c >= cols) continue;
      float d[W], gm[W];
      cuda::load<W>(dy + row * cols + c, d);
      cuda::load<W>(x + row * cols + c, xh[g]);
      cuda::load<W>(gamma + c, gm);
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
    for (int g = 0; g < kGroups; ++g) {
      const int c = (g * blockDim.x + threadIdx.x) * W;
      if (!live || c >= cols) continue;
      #pragma unroll
      for (int t = 0; t < W; ++t) gv[g][t] = rs * (gv[g][t] - mean_g - xh[g][t] * mean_gx);
      cuda::store<W>(dx + row * cols + c, gv[g]);
    }
  }

  if (blockDim.y == 1) {
    #pragma unroll
    for (int g = 0; g < kGroups; ++g) {
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
  for (int g = 0; g < kGroups; ++g) {
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

}  // namespace

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                    Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  if (cuda::vec4_ok(cols, {x.data, gamma.data, beta.data, y.data})) {
    const cuda::RowLaunch l = cuda::row_launch("layernorm_forward", rows, cols, 4, kGroups);
    layernorm_forward_kernel<4><<<l.grid, l.block, 0, stream_>>>(x.f32(), gamma.f32(), beta.f32(), eps, y.f32(),
                                                                  mean.f32(), rstd.f32(), rows, int(cols));
  } else {
    const cuda::RowLaunch l = cuda::row_launch("layernorm_forward", rows, cols, 1, kGroups);
    layernorm_forward_kernel<1><<<l.grid, l.block, 0, stream_>>>(x.f32(), gamma.f32(), beta.f32(), eps, y.f32(),
                                                                  mean.f32(), rstd.f32(), rows, int(cols));
  }
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  // One wave of blocks at most: more rows per block means fewer atomics per column.
  int sms = 0;
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  const bool vec = cuda::vec4_ok(cols, {dy.data, x.data, gamma.data, dx.data});
  cuda::RowLaunch l =
      cuda::row_launch("layernorm_backward", rows, cols, vec ? 4 : 1, kGroups, vec ? kBackwardVecThreads : 1024);
  l.grid.x = std::min(l.grid.x, unsigned(4 * sms));
  if (vec)
    layernorm_backward_kernel<4><<<l.grid, l.block, 0, stream_>>>(dy.f32(), x.f32(), gamma.f32(), mean.f32(),
                                                                   rstd.f32(), dx.f32(), dgamma.f32(), dbeta.f32(),
                                                                   rows, int(cols));
  else
    layernorm_backward_kernel<1><<<l.grid, l.block, 0, stream_>>>(dy.f32(), x.f32(), gamma.f32(), mean.f32(),
                                                                   rstd.f32(), dx.f32(), dgamma.f32(), dbeta.f32(),
                                                                   rows, int(cols));
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
