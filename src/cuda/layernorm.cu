// LayerNorm over the last dimension (biased variance), with the semantics of
// src/ops/layernorm.cpp. One row per warp up to 1024 columns (16-byte access when the
// width allows; a forward of at most a row an SM spreads a row over more threads), the
// row held in registers so that the variance takes a second pass over registers rather
// than memory. x, gamma, beta, y, dy and dx are in the compute
// dtype T; the statistics, the parameter gradients and all arithmetic are F32.
//
// The fused residual ops are the same kernels with the residual dropout added where the
// row enters (forward) or leaves (backward) the registers, so the LayerNorm arithmetic,
// thread layout and reduction order are the unfused op's, and so are its results.
#include <cuda_pipeline.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/rows.h"
#include "hone/philox.h"

namespace hone {

namespace {

// The forward stages gamma and beta in shared memory (layernorm_forward_kernel) when its
// blocks fill the GPU at most once, where the kernel is one row's latency (bert-large at
// batch 1 x 128: 16 blocks, 1.10 -> 1.05 ms a batch on an H200), and up to this size (rows
// of 4096 bf16 columns, 2048 F32). Bandwidth-bound launches of many waves measured about
// 1% slower staged (the block's wait for the copy): they read them from global memory.
constexpr size_t kStagedParamBytes = 16 << 10;

// The forward that sums a split product's parts holds every part of a thread's runs in
// registers at once (sum_parts): one 16-byte run a thread (eight scalar ones), and at most
// this many threads a row, so that the registers fit. Rows of up to 2048 columns in half
// precision, 1024 in F32 (256 x 8 and 256 x 4 columns; 2048 scalar).
constexpr int kPartsThreads = 256;

// Runs of W columns per thread, W = 1 or kVec<T> (one 16-byte access). The vector
// variants keep 32 columns of each row array a thread whatever T, so 1024 columns fit one
// warp with W = 4 (F32) and W = 8 (BF16/F16) alike, at the same register cost.
template <int W>
constexpr int kGroups = W == 1 ? 8 : 32 / W;
// The forward's runs a thread where a row spreads over more threads (layernorm_forward_as):
// one 16-byte run, or eight scalar ones.
template <int W>
constexpr int kSpreadGroups = W == 1 ? 8 : 1;
// The backward keeps two F32 sums per column of its thread (dgamma, dbeta; in shared
// memory, layernorm_backward_kernel) beside the row's values, so its vector variant gives a
// thread 16 columns rather than 32: a 1024-column row spans two warps, and at 64 registers
// four blocks of 256 threads fit an SM (with the sums in registers: 80, 24-84 bytes of
// spill stores, three blocks). 32 columns a thread (171 registers) left one block, too few
// loads in flight to reach the memory's rate (bert-large bf16 batch 32: 96 us a call
// against the 45 us its bytes take). Its rows span at most one block of
// kBackwardVecThreads threads (4096 columns); longer rows take the scalar variant (up to
// 8192).
template <int W>
constexpr int kBackwardGroups = W == 1 ? 8 : 16 / W;
constexpr int kBackwardVecThreads = cuda::kRowBlockThreads;

// 16-byte access: the row length a multiple of kVec<T> and every pointer aligned.
template <typename T>
bool vec_ok(int64_t cols, std::initializer_list<const void*> ptrs) {
  return cols % cuda::kVec<T> == 0 && cuda::vec4_ok(cols, ptrs);
}

// The backward's vector variant also needs the row to fit one block.
template <typename T>
bool backward_vec_ok(int64_t cols, std::initializer_list<const void*> ptrs) {
  return vec_ok<T>(cols, ptrs) && cols <= int64_t(kBackwardVecThreads) * kBackwardGroups<cuda::kVec<T>> * cuda::kVec<T>;
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

// v rounded to T and back: the value a store and a later load would give.
template <typename T, int W>
__device__ __forceinline__ void round_run(float (&v)[W]) {
  #pragma unroll
  for (int t = 0; t < W; ++t) v[t] = cuda::to_float(cuda::from_float<T>(v[t]));
}

// Sums a and b over the threads of one row, as cuda::row_sum does each, with one barrier
// for both where a row spans warps: `parity` alternates between calls, so a call writes
// the half of the scratch that the call before it did not, and no thread can still be
// reading it (every thread passed that call's barrier after its last read here). The
// warps' sums are added in warp order, the same order on every thread.
__device__ __forceinline__ void row_sum2(float& a, float& b, int parity) {
  __shared__ float2 scratch[2][cuda::kRowBlockThreads / 32];
  a = cuda::warp_sum(a);
  b = cuda::warp_sum(b);
  if (blockDim.x == 32) return;
  const int warps = int(blockDim.x >> 5), first = threadIdx.y * warps;
  if ((threadIdx.x & 31) == 0) scratch[parity][first + (threadIdx.x >> 5)] = make_float2(a, b);
  __syncthreads();
  a = b = 0.0f;
  for (int w = 0; w < warps; ++w) {
    const float2 v = scratch[parity][first + w];
    a += v.x;
    b += v.y;
  }
}

// The dropout of a fused op: its spec and keep scale, 1 / (1 - p) as launch_dropout
// computes it (inf at p == 1, where nothing is kept and it is never used).
struct FusedDropout {
  DropoutSpec d;
  float scale = 1.0f;
};

FusedDropout fused_dropout(const DropoutSpec& d) { return {d, 1.0f / (1.0f - d.p)}; }

// v = dropout(v) for the W elements from flat index i, as dropout_kernel computes it
// (src/cuda/elementwise.cu): element j keeps word j % 4 of Philox block j / 4, and
// __fmul_rn keeps x * scale from fusing with a later add. With W > 1 the row length is a
// multiple of kVec<T> (vec_ok), so i is a multiple of 4 and the run spans whole blocks.
// `stream` is dropout_stream(d), read once per thread.
template <int W>
__device__ __forceinline__ void dropout_run(const DropoutSpec& d, uint64_t stream, float scale, int64_t i,
                                            float (&v)[W]) {
  if (!(d.p > 0.0f)) return;
  if constexpr (W == 1) {
    v[0] = dropout_keep(d.seed, stream, uint64_t(i), d.p) ? __fmul_rn(v[0], scale) : 0.0f;
  } else {
    #pragma unroll
    for (int b = 0; b < W / 4; ++b) {
      const Philox4 r = philox_block(d.seed, stream, uint64_t(i) / 4 + b);
      #pragma unroll
      for (int k = 0; k < 4; ++k) {
        float& e = v[4 * b + k];
        e = uniform_from_word(r.v[k]) >= d.p ? __fmul_rn(e, scale) : 0.0f;
      }
    }
  }
}

// A split product's parts (linear_split_forward), which a fused forward reads in place of
// x: out = parts[0] + ... + parts[count - 1] + bias, rounded to T as the product's output.
struct ProductParts {
  const float* parts = nullptr;
  int64_t stride = 0;  // elements from one part to the next: rows x cols
  int count = 0;       // 1 to CudaBackend::kMaxProductParts
  const void* bias = nullptr;
};

template <int W>
__device__ __forceinline__ void load_f32_run(const float* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = *p;
  } else {
    #pragma unroll
    for (int q = 0; q < W; q += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + q);
      v[q] = f.x, v[q + 1] = f.y, v[q + 2] = f.z, v[q + 3] = f.w;
    }
  }
}

// v[g] = the product's output at the thread's runs of row `row`: the parts added in order,
// then the bias, rounded to T. Every part of every run is loaded before the first add, so
// that a thread has them all in flight at once (read a part at a time, each was a trip to
// L2: 8.0 us a launch at batch 1 x 128 on an H200, against 4.4 for the norm reading the
// summed product); hence the kernel's few runs a thread when it reads parts.
template <typename T, int W, int G>
__device__ __forceinline__ void sum_parts(const ProductParts& pp, int64_t row, int cols, float (&v)[G][W]) {
  constexpr int S = CudaBackend::kMaxProductParts;
  auto column = [&](int g) { return (g * int(blockDim.x) + int(threadIdx.x)) * W; };
  float p[S][G][W];
  #pragma unroll
  for (int s = 0; s < S; ++s)
    #pragma unroll
    for (int g = 0; g < G; ++g)
      if (s < pp.count && column(g) < cols) load_f32_run<W>(pp.parts + s * pp.stride + row * cols + column(g), p[s][g]);
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    if (column(g) >= cols) continue;
    #pragma unroll
    for (int t = 0; t < W; ++t) v[g][t] = p[0][g][t];
    #pragma unroll
    for (int s = 1; s < S; ++s)
      if (s < pp.count)
        #pragma unroll
        for (int t = 0; t < W; ++t) v[g][t] += p[s][g][t];
    if (pp.bias) {
      float b[W];
      load_run<W>(static_cast<const T*>(pp.bias) + column(g), b);
      #pragma unroll
      for (int t = 0; t < W; ++t) v[g][t] += b[t];
    }
    round_run<T>(v[g]);
  }
}

// With kFused the row normalized is residual + dropout(x) (fd), rounded to T as
// dropout_add stores it and written to sum_out (unless null: not kept), which may be x:
// each thread reads its elements of x before writing them. With kParts as well, x is the
// product's output that pp's parts add up to.
// With `staged` (16-byte runs; dynamic shared memory of 2 cols T) the block copies gamma
// and beta into shared memory asynchronously before it loads its rows, so that the last
// pass reads them there rather than waiting on a load after the row's two reductions.
template <typename T, int W, int G, bool kFused, bool kParts>
__global__ void __launch_bounds__(kParts ? kPartsThreads : 1024)
    layernorm_forward_kernel(const T* x, const T* __restrict__ gamma, const T* __restrict__ beta, float eps, T* y,
                             float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int cols,
                             FusedDropout fd, const T* __restrict__ residual, T* sum_out, bool staged,
                             ProductParts pp) {
  static_assert(kFused || !kParts, "the parts are a residual branch's");
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;  // dead threads still take part in the reductions
  const T* xr = kParts ? nullptr : x + row * cols;  // with parts x is null: nothing to offset
  const uint64_t stream = kFused ? dropout_stream(fd.d) : 0;
  extern __shared__ __align__(16) unsigned char staged_params[];
  T* s_gamma = reinterpret_cast<T*>(staged_params);
  T* s_beta = s_gamma + cols;
  staged = W > 1 && staged;  // 16-byte runs only
  if (staged) {
    const int threads = int(blockDim.x * blockDim.y);
    for (int c = int(threadIdx.y * blockDim.x + threadIdx.x) * W; c < cols; c += threads * W) {
      __pipeline_memcpy_async(s_gamma + c, gamma + c, sizeof(T) * W);
      if (beta) __pipeline_memcpy_async(s_beta + c, beta + c, sizeof(T) * W);
    }
    __pipeline_commit();
  }
  float v[G][W];
  if constexpr (kParts)
    if (live) sum_parts<T, W, G>(pp, row, cols, v);
  float sum = 0.0f;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= cols) continue;
    if constexpr (!kParts) load_run<W>(xr + c, v[g]);
    if constexpr (kFused) {
      float res[W];
      load_run<W>(residual + row * cols + c, res);
      dropout_run<W>(fd.d, stream, fd.scale, row * cols + c, v[g]);
      #pragma unroll
      for (int t = 0; t < W; ++t) v[g][t] = res[t] + v[g][t];
      round_run<T>(v[g]);
      if (sum_out) store_run<W>(sum_out + row * cols + c, v[g]);
    }
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
  if (staged) {
    __pipeline_wait_prior(0);
    __syncthreads();
  }
  if (!live) return;
  const T* gm_src = staged ? s_gamma : gamma;
  const T* bt_src = staged ? s_beta : beta;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (c >= cols) continue;
    float gm[W], bt[W] = {};
    load_run<W>(gm_src + c, gm);
    if (beta) load_run<W>(bt_src + c, bt);  // null: no bias (ModernBERT)
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
// dbeta are summed over the block's rows in each thread's slots of shared memory (the
// block's dynamic shared memory, backward_sum_bytes), then over the block's row slots, and
// added with one atomic per column and block. Held in registers, those sums took 32 of the
// vector variant's 80 and left three blocks an SM; in shared memory four fit, with more
// loads in flight. Each thread reads its dy and x before writing the same elements of dx,
// so dx may alias dy.
// With kFused dx is the gradient of the sum, and dropped_dx receives dropout(dx) (fd) of
// the value stored (rounded to T), as the dropout op would from it; it too may alias dy.
template <int W>
constexpr int kSumLanes = W >= 4 ? 4 : 1;  // floats a thread reads or writes at once
template <int W>
using SumVec = std::conditional_t<(W >= 4), float4, float>;

// Thread tid's slot for its group g, lanes q * kSumLanes.. of its run, among `threads`: a
// warp's accesses are consecutive, so they take no bank twice.
template <int W>
__device__ __forceinline__ SumVec<W>& sum_slot(float* sums, int g, int q, int tid, int threads) {
  return reinterpret_cast<SumVec<W>*>(sums)[(g * (W / kSumLanes<W>) + q) * threads + tid];
}

// s += d * x (or s += d where x is null) over a run, in the slots' layout.
template <int W>
__device__ __forceinline__ void add_run(float* sums, int g, int tid, int threads, const float (&d)[W],
                                        const float* x) {
  #pragma unroll
  for (int q = 0; q < W / kSumLanes<W>; ++q) {
    SumVec<W>& slot = sum_slot<W>(sums, g, q, tid, threads);
    SumVec<W> v = slot;
    float* e = reinterpret_cast<float*>(&v);
    #pragma unroll
    for (int k = 0; k < kSumLanes<W>; ++k) e[k] += x ? d[q * kSumLanes<W> + k] * x[q * kSumLanes<W> + k]
                                                     : d[q * kSumLanes<W> + k];
    slot = v;
  }
}

template <int W>
size_t backward_sum_bytes(int threads) {
  return size_t(2) * kBackwardGroups<W> * W * threads * sizeof(float);
}

template <typename T, int W, bool kFused>
__global__ void __launch_bounds__(W > 1 ? kBackwardVecThreads : 1024, W > 1 ? 4 : 1)
    layernorm_backward_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* dx,
                              float* __restrict__ dgamma, float* __restrict__ dbeta, int64_t rows, int cols,
                              FusedDropout fd, T* dropped_dx) {
  constexpr int G = kBackwardGroups<W>;
  const uint64_t stream = kFused ? dropout_stream(fd.d) : 0;
  const int tid = int(threadIdx.y * blockDim.x + threadIdx.x), threads = int(blockDim.x * blockDim.y);
  extern __shared__ __align__(16) float sums[];  // [2][G][W / kSumLanes][threads] of kSumLanes: dgamma's, dbeta's
  float* dg = sums;
  float* db = sums + G * W * threads;
  #pragma unroll
  for (int g = 0; g < G; ++g)
    #pragma unroll
    for (int q = 0; q < W / kSumLanes<W>; ++q) sum_slot<W>(dg, g, q, tid, threads) = sum_slot<W>(db, g, q, tid, threads) = {};
  int parity = 0;
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < rows;
       first += int64_t(gridDim.x) * blockDim.y, parity ^= 1) {
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
      }
      add_run<W>(dg, g, tid, threads, d, xh[g]);
      add_run<W>(db, g, tid, threads, d, nullptr);
    }
    row_sum2(sum_g, sum_gx, parity);
    const float mean_g = sum_g / cols, mean_gx = sum_gx / cols;
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      const int c = (g * blockDim.x + threadIdx.x) * W;
      if (!live || c >= cols) continue;
      #pragma unroll
      for (int t = 0; t < W; ++t) gv[g][t] = rs * (gv[g][t] - mean_g - xh[g][t] * mean_gx);
      store_run<W>(dx + row * cols + c, gv[g]);
      if constexpr (kFused) {
        round_run<T>(gv[g]);
        dropout_run<W>(fd.d, stream, fd.scale, row * cols + c, gv[g]);
        store_run<W>(dropped_dx + row * cols + c, gv[g]);
      }
    }
  }

  // Column c = (g * blockDim.x + x) * W + t of every row slot y: its slots' sums in slot
  // order, then one atomic for the block.
  __syncthreads();
  const int span = blockDim.x * W;  // columns of one group
  for (int j = tid; j < G * span && j < cols; j += threads) {
    const int g = j / span, x_thread = j % span / W, t = j % W;
    float a = 0.0f, b = 0.0f;
    for (int s = 0; s < int(blockDim.y); ++s) {
      const int slot_tid = s * blockDim.x + x_thread;
      a += reinterpret_cast<const float*>(&sum_slot<W>(dg, g, t / kSumLanes<W>, slot_tid, threads))[t % kSumLanes<W>];
      b += reinterpret_cast<const float*>(&sum_slot<W>(db, g, t / kSumLanes<W>, slot_tid, threads))[t % kSumLanes<W>];
    }
    atomicAdd(dgamma + j, a);
    if (dbeta) atomicAdd(dbeta + j, b);
  }
}

// fd, residual and sum_out are only used when kFused; pp (and not x) when kParts.
// A launch whose rows fit one a block on the SMs spreads each row over more threads, one
// 16-byte run a thread (kSpreadGroups), one row a block; so does every launch that reads
// parts. Its sums add in another order than the usual 32 columns a thread, so the bits
// differ from a larger launch's, but not between the forward ops at the same shape. (At
// batch 1 x 128 that is 128 blocks of 128 threads against 16 of 256: the latency of one
// row's loads and reductions is what such a launch takes.)
template <typename T, int W, bool kFused, bool kParts = false>
void layernorm_forward_as(const T* x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                          Tensor& rstd, int64_t rows, int64_t cols, const FusedDropout& fd, const T* residual,
                          T* sum_out, int sms, cudaStream_t stream, const ProductParts& pp = {}) {
  const bool spread = kParts || (W > 1 && rows <= sms && (cols + W - 1) / W <= 1024);
  auto launch = [&](auto groups) {
    constexpr int G = decltype(groups)::value;
    cuda::RowLaunch l = cuda::row_launch("layernorm_forward", rows, cols, W, G, kParts ? kPartsThreads : 1024);
    if (spread) {  // one row a block, where that still leaves SMs without a block
      while (l.block.y > 1 && (rows + l.block.y - 1) / l.block.y < sms) l.block.y /= 2;
      l.grid.x = unsigned((rows + l.block.y - 1) / l.block.y);
    }
    const size_t staged_bytes = 2 * size_t(cols) * sizeof(T);
    const bool staged = W > 1 && staged_bytes <= kStagedParamBytes && l.grid.x <= unsigned(sms);
    layernorm_forward_kernel<T, W, G, kFused, kParts><<<l.grid, l.block, staged ? staged_bytes : 0, stream>>>(
        x, gamma.ptr<T>(), beta.ptr<T>(), eps, y.ptr<T>(), mean.f32(), rstd.f32(), rows, int(cols), fd, residual,
        sum_out, staged, pp);
    HONE_CUDA_LAUNCH_CHECK();
  };
  if constexpr (!kParts)  // parts always spread: their kernel has no kGroups layout
    if (!spread) return launch(std::integral_constant<int, kGroups<W>>{});
  launch(std::integral_constant<int, kSpreadGroups<W>>{});
}

// fd and dropped_dx are only used when kFused.
template <typename T, int W, bool kFused>
void layernorm_backward_as(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, int64_t rows, int64_t cols,
                           const FusedDropout& fd, T* dropped_dx, int sms, cudaStream_t stream) {
  cuda::RowLaunch l =
      cuda::row_launch("layernorm_backward", rows, cols, W, kBackwardGroups<W>, W > 1 ? kBackwardVecThreads : 1024);
  // One wave of blocks at most, as many as fit the SMs together: more rows per block
  // means fewer atomics per column, and a second, partial wave would leave SMs idle.
  const int threads = int(l.block.x * l.block.y);  // 256, 512 or 1024
  const size_t sum_bytes = backward_sum_bytes<W>(threads);
  static const bool smem_opted_in = [] {  // the scalar variant's 1024 threads take 64 KiB
    HONE_CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<T, W, kFused>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(backward_sum_bytes<W>(1024))));
    return true;
  }();
  (void)smem_opted_in;
  static std::atomic<int> per_sm[3] = {};  // by block size, asked once each
  std::atomic<int>& fit = per_sm[threads == 256 ? 0 : threads == 512 ? 1 : 2];
  if (fit.load() == 0) {
    int n = 0;
    HONE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, layernorm_backward_kernel<T, W, kFused>,
                                                                  threads, sum_bytes));
    fit.store(std::max(n, 1));
  }
  l.grid.x = std::min(l.grid.x, unsigned(fit.load() * sms));
  layernorm_backward_kernel<T, W, kFused><<<l.grid, l.block, sum_bytes, stream>>>(
      dy.ptr<T>(), x.ptr<T>(), gamma.ptr<T>(), mean.f32(), rstd.f32(), dx.ptr<T>(), dgamma.f32(),
      dbeta.data ? dbeta.f32() : nullptr, rows,
      int(cols), fd, dropped_dx);
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
      layernorm_forward_as<T, cuda::kVec<T>, false>(x.ptr<T>(), gamma, beta, eps, y, mean, rstd, rows, cols, {},
                                                    nullptr, nullptr, sms_, stream_);
    else
      layernorm_forward_as<T, 1, false>(x.ptr<T>(), gamma, beta, eps, y, mean, rstd, rows, cols, {}, nullptr,
                                        nullptr, sms_, stream_);
  });
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  cuda::with_dtype(x.dtype, "layernorm_backward", [&](auto t) {
    using T = decltype(t);
    if (backward_vec_ok<T>(cols, {dy.data, x.data, gamma.data, dx.data}))
      layernorm_backward_as<T, cuda::kVec<T>, false>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, {},
                                                     nullptr, sms_, stream_);
    else
      layernorm_backward_as<T, 1, false>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, {}, nullptr, sms_,
                                         stream_);
  });
}

// The statistics match layernorm_forward's bit for bit only in its thread layout, which
// the alignment of the tensors it sees (sum, gamma, beta, y) decides. The fused kernel
// takes that layout; if x or residual cannot follow it into 16-byte access, the unfused
// pair runs instead.
void CudaBackend::dropout_add_layernorm_forward(const Tensor& x, const Tensor& residual, const DropoutSpec& d,
                                                const Tensor& gamma, const Tensor& beta, float eps, Tensor& sum,
                                                Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  cuda::with_dtype(x.dtype, "dropout_add_layernorm_forward", [&](auto t) {
    using T = decltype(t);
    const bool vec = vec_ok<T>(cols, {sum.data, gamma.data, beta.data, y.data});
    if (vec && !vec_ok<T>(cols, {x.data, residual.data})) {
      Tensor& kept = sum.data ? sum : y;  // without sum, y holds it until normalized in place
      dropout_add(x, residual, d, kept);
      layernorm_forward(kept, gamma, beta, eps, y, mean, rstd);
      return;
    }
    if (vec)
      layernorm_forward_as<T, cuda::kVec<T>, true>(x.ptr<T>(), gamma, beta, eps, y, mean, rstd, rows, cols,
                                                   fused_dropout(d), residual.ptr<T>(), sum.ptr<T>(), sms_, stream_);
    else
      layernorm_forward_as<T, 1, true>(x.ptr<T>(), gamma, beta, eps, y, mean, rstd, rows, cols, fused_dropout(d),
                                       residual.ptr<T>(), sum.ptr<T>(), sms_, stream_);
  });
}

// The fused forward's kernel with the product's output summed from its parts where x was
// read, a row over more threads (kSpreadGroups): dropout_add_layernorm_forward's values
// on that output (stored in T), without dropout or sum, up to the order of the row's sums.
void CudaBackend::parts_add_layernorm_forward(const Tensor& parts, const Tensor* b, const Tensor& residual,
                                              const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                              Tensor& mean, Tensor& rstd) {
  const int64_t cols = residual.shape[1], rows = mean.numel(), count = parts.shape[0];
  if (rows == 0) return;
  HONE_CHECK(count >= 1 && count <= kMaxProductParts, "parts_add_layernorm_forward: {} parts, at most {} on CUDA",
             count, kMaxProductParts);
  const ProductParts pp{parts.f32(), rows * cols, int(count), b ? b->data : nullptr};
  cuda::with_dtype(residual.dtype, "parts_add_layernorm_forward", [&](auto t) {
    using T = decltype(t);
    if (vec_ok<T>(cols, {residual.data, gamma.data, beta.data, y.data, pp.bias}) && cuda::vec4_ok(cols, {parts.data}))
      layernorm_forward_as<T, cuda::kVec<T>, true, true>(nullptr, gamma, beta, eps, y, mean, rstd, rows, cols, {},
                                                         residual.ptr<T>(), nullptr, sms_, stream_, pp);
    else
      layernorm_forward_as<T, 1, true, true>(nullptr, gamma, beta, eps, y, mean, rstd, rows, cols, {},
                                             residual.ptr<T>(), nullptr, sms_, stream_, pp);
  });
}

// As the forward: layernorm_backward's layout (from dy, sum, gamma, dsum), or the unfused
// pair when dx cannot follow it into 16-byte access.
void CudaBackend::layernorm_dropout_backward(const Tensor& dy, const Tensor& sum, const Tensor& gamma,
                                             const Tensor& mean, const Tensor& rstd, const DropoutSpec& d,
                                             Tensor& dsum, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t cols = sum.shape[sum.shape.rank - 1], rows = mean.numel();
  if (rows == 0) return;
  cuda::with_dtype(sum.dtype, "layernorm_dropout_backward", [&](auto t) {
    using T = decltype(t);
    const bool vec = backward_vec_ok<T>(cols, {dy.data, sum.data, gamma.data, dsum.data});
    if (vec && !vec_ok<T>(cols, {dx.data})) {
      layernorm_backward(dy, sum, gamma, mean, rstd, dsum, dgamma, dbeta);
      dropout(dsum, d, dx);
      return;
    }
    if (vec)
      layernorm_backward_as<T, cuda::kVec<T>, true>(dy, sum, gamma, mean, rstd, dsum, dgamma, dbeta, rows, cols,
                                                    fused_dropout(d), dx.ptr<T>(), sms_, stream_);
    else
      layernorm_backward_as<T, 1, true>(dy, sum, gamma, mean, rstd, dsum, dgamma, dbeta, rows, cols,
                                        fused_dropout(d), dx.ptr<T>(), sms_, stream_);
  });
}

}  // namespace hone
