// Adafactor's update of one parameter tensor (see Backend::adafactor): the factored
// second moment's row and column means, the mean of the row factors, the update's RMS
// and the update itself, in a few launches whose reductions run in double and in a fixed
// order (the result does not depend on timing, so resumed runs repeat bit for bit).
#include <algorithm>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "cuda/param_copy.h"

namespace hone {
namespace {

using cuda::HalfCopy;

// Column sums are split over this many chunks of rows, summed afterwards in chunk order.
constexpr int kColChunks = 64;
// Blocks of the RMS reduction: one double partial each.
constexpr int kSumBlocks = 256;

struct Operands {
  const float* grad;
  float *param, *row, *col, *v, *m;
  void* half;
  HalfCopy half_type;
  int64_t rows, cols;
  bool decay;
};

// The workspace, as doubles: column partials [kColChunks][cols], RMS partials
// [kSumBlocks], the mean of the row factors.
struct Scratch {
  double *col_partials, *sum_partials, *row_mean;
};

__device__ __forceinline__ bool skipped(const float* norm_coef) { return norm_coef[2] != 0.0f; }

__device__ __forceinline__ float squared(float g, float eps1) { return __fadd_rn(__fmul_rn(g, g), eps1); }

__device__ __forceinline__ float blend(float state, float value, float keep) {
  return __fadd_rn(__fmul_rn(state, keep), __fmul_rn(value, __fsub_rn(1.0f, keep)));
}

__device__ __forceinline__ float inv_sqrt(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }

// row[r] = beta2t row[r] + (1 - beta2t) mean_c(g^2 + eps1): a warp per row.
__global__ void row_kernel(Operands o, const AdafactorScalars* k, const float* norm_coef) {
  if (skipped(norm_coef)) return;
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= o.rows) return;
  const float clip = norm_coef[1];
  double sum = 0;
  for (int64_t c = threadIdx.x % 32; c < o.cols; c += 32)
    sum += double(squared(__fmul_rn(o.grad[r * o.cols + c], clip), k->eps1));
  sum = cuda::warp_sum(sum);
  if (threadIdx.x % 32 == 0) o.row[r] = blend(o.row[r], float(sum / double(o.cols)), k->beta2t);
}

// Partial column sums of g^2 + eps1 over chunk blockIdx.y of the rows.
__global__ void col_partial_kernel(Operands o, const AdafactorScalars* k, const float* norm_coef, Scratch s) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= o.cols) return;
  const int64_t per = (o.rows + kColChunks - 1) / kColChunks;
  const int64_t lo = blockIdx.y * per, hi = std::min(o.rows, lo + per);
  const float clip = norm_coef[1];
  double sum = 0;
  for (int64_t r = lo; r < hi; ++r) sum += double(squared(__fmul_rn(o.grad[r * o.cols + c], clip), k->eps1));
  s.col_partials[blockIdx.y * o.cols + c] = sum;
}

// col[c] from the partials; the last block also takes the mean of the (updated) rows.
__global__ void col_finish_kernel(Operands o, const AdafactorScalars* k, const float* norm_coef, Scratch s) {
  if (skipped(norm_coef)) return;
  if (blockIdx.x == gridDim.x - 1) {
    __shared__ double scratch[32];
    double sum = 0;
    for (int64_t r = threadIdx.x; r < o.rows; r += blockDim.x) sum += double(o.row[r]);
    sum = cuda::block_sum(sum, scratch);
    if (threadIdx.x == 0) *s.row_mean = sum / double(o.rows);
    return;
  }
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= o.cols) return;
  double sum = 0;
  for (int j = 0; j < kColChunks; ++j) sum += s.col_partials[j * o.cols + c];
  o.col[c] = blend(o.col[c], float(sum / double(o.rows)), k->beta2t);
}

// Unfactored: v = beta2t v + (1 - beta2t)(g^2 + eps1).
__global__ void vector_kernel(Operands o, const AdafactorScalars* k, const float* norm_coef) {
  if (skipped(norm_coef)) return;
  const float clip = norm_coef[1];
  for (int64_t i = cuda::grid_start(); i < o.cols; i += cuda::grid_stride())
    o.v[i] = blend(o.v[i], squared(__fmul_rn(o.grad[i], clip), k->eps1), k->beta2t);
}

// The update before scaling: g / sqrt(row / mean(row)) / sqrt(col), or g / sqrt(v).
__device__ __forceinline__ float unscaled(const Operands& o, int64_t i, float clip, float row_mean) {
  const float g = __fmul_rn(o.grad[i], clip);
  if (!o.row) return __fmul_rn(g, inv_sqrt(o.v[i]));
  const int64_t r = i / o.cols, c = i % o.cols;
  return __fmul_rn(g, __fmul_rn(inv_sqrt(__fdiv_rn(o.row[r], row_mean)), inv_sqrt(o.col[c])));
}

__global__ void sum_squares_kernel(Operands o, const float* norm_coef, Scratch s) {
  __shared__ double scratch[32];
  const float clip = norm_coef[1], row_mean = o.row ? float(*s.row_mean) : 1.0f;
  double sum = 0;
  for (int64_t i = cuda::grid_start(); i < o.rows * o.cols; i += cuda::grid_stride()) {
    const double u = unscaled(o, i, clip, row_mean);
    sum += u * u;
  }
  sum = cuda::block_sum(sum, scratch);
  if (threadIdx.x == 0) s.sum_partials[blockIdx.x] = sum;
}

__global__ void apply_kernel(Operands o, const AdafactorScalars* k, const float* norm_coef, Scratch s,
                             int partials) {
  if (skipped(norm_coef)) return;
  __shared__ double scratch[32];
  double sum = 0;
  for (int b = threadIdx.x; b < partials; b += blockDim.x) sum += s.sum_partials[b];
  sum = cuda::block_sum(sum, scratch);  // the same order in every block
  __shared__ float step;
  const int64_t n = o.rows * o.cols;
  if (threadIdx.x == 0) {
    const float rms = float(sqrt(sum / double(n)));
    step = __fdiv_rn(k->lr, fmaxf(1.0f, __fdiv_rn(rms, k->clip_threshold)));
  }
  __syncthreads();
  const float clip = norm_coef[1], row_mean = o.row ? float(*s.row_mean) : 1.0f;
  const float decay = o.decay ? -__fmul_rn(k->weight_decay, k->lr) : 0.0f;
  for (int64_t i = cuda::grid_start(); i < n; i += cuda::grid_stride()) {
    float upd = __fmul_rn(unscaled(o, i, clip, row_mean), step);
    if (o.m) upd = o.m[i] = __fadd_rn(__fmul_rn(o.m[i], k->beta1), __fmul_rn(upd, __fsub_rn(1.0f, k->beta1)));
    float p = o.param[i];
    if (decay != 0.0f) p = __fadd_rn(p, __fmul_rn(p, decay));
    p = __fsub_rn(p, upd);
    o.param[i] = p;
    if (o.half_type == HalfCopy::BF16)
      static_cast<__nv_bfloat16*>(o.half)[i] = cuda::from_float<__nv_bfloat16>(p);
    else if (o.half_type == HalfCopy::F16)
      static_cast<__half*>(o.half)[i] = cuda::from_float<__half>(p);
  }
}

}  // namespace

int64_t CudaBackend::adafactor_workspace_elems(int64_t rows, int64_t cols) const {
  const int64_t doubles = (rows > 1 ? kColChunks * cols : 0) + kSumBlocks + 1;
  return 2 * doubles;
}

void CudaBackend::adafactor(const AdafactorTensor& t, const Tensor& scalars, const Tensor& norm_coef,
                            Tensor& workspace) {
  const Operands o{t.grad.f32(), t.param.f32(), t.factored ? t.row.f32() : nullptr,
                   t.factored ? t.col.f32() : nullptr, t.factored ? nullptr : t.v.f32(),
                   t.m.data ? t.m.f32() : nullptr, t.half.data, cuda::half_copy(t.half), t.rows, t.cols, t.decay};
  auto* d = reinterpret_cast<double*>(workspace.f32());
  const int64_t col_doubles = t.factored ? kColChunks * t.cols : 0;
  const Scratch s{d, d + col_doubles, d + col_doubles + kSumBlocks};
  const auto* k = reinterpret_cast<const AdafactorScalars*>(scalars.f32());
  const float* coef = norm_coef.f32();
  const int64_t n = t.rows * t.cols;
  const int t256 = cuda::kThreads;
  if (t.factored) {
    row_kernel<<<cuda::blocks_for(t.rows * 32), t256, 0, stream()>>>(o, k, coef);
    HONE_CUDA_LAUNCH_CHECK();
    const int col_blocks = cuda::blocks_for(t.cols);
    col_partial_kernel<<<dim3(col_blocks, kColChunks), t256, 0, stream()>>>(o, k, coef, s);
    HONE_CUDA_LAUNCH_CHECK();
    col_finish_kernel<<<col_blocks + 1, t256, 0, stream()>>>(o, k, coef, s);
    HONE_CUDA_LAUNCH_CHECK();
  } else {
    vector_kernel<<<cuda::blocks_for(n), t256, 0, stream()>>>(o, k, coef);
    HONE_CUDA_LAUNCH_CHECK();
  }
  const int blocks = int(std::min<int64_t>(kSumBlocks, cuda::blocks_for(n)));
  sum_squares_kernel<<<blocks, t256, 0, stream()>>>(o, coef, s);
  HONE_CUDA_LAUNCH_CHECK();
  constexpr int kApplyBlocks = 2048;  // each block first sums the partials, so not too many
  apply_kernel<<<std::min(cuda::blocks_for(n), kApplyBlocks), t256, 0, stream()>>>(o, k, coef, s, blocks);
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
