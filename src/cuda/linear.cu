// Fully connected layers on cuBLASLt. cuBLASLt is column-major and a row-major [R, C]
// matrix is a column-major [C, R] one, so every product is computed transposed (w as
// stored reads as column-major w^T):
//   y^T  = w x^T + b    (forward; the bias epilogue adds b to every column)
//   dx^T = w^T dy^T
//   dw^T += x^T dy
// db += column sums of dy is a kernel of its own: the BGRADB epilogue, which overwrites,
// would need a scratch and an add, and measured slower (it steers cuBLASLt to slower
// kernels: +8 to +21 us a product at bert-large shapes on TF32) than a separate pass.
#include <algorithm>
#include <cstring>
#include <utility>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/rows.h"

namespace hone {

namespace {

// Largest power of two (at most 256) dividing the address: what the heuristic must
// assume about the pointer's alignment.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
}

constexpr int kColumnSumWarps = 8;

// db[c] += sum over rows of dy[r, c]. A block takes 32 * W columns and a band of rows;
// its warps split the band, combine through shared memory, and add one atomic per
// column into db.
template <int W>
__global__ void __launch_bounds__(32 * kColumnSumWarps)
    column_sum_kernel(const float* __restrict__ dy, float* __restrict__ db, int64_t rows, int cols, int64_t band) {
  __shared__ float part[kColumnSumWarps][32 * W];
  const int c = (blockIdx.x * 32 + threadIdx.x) * W;
  const int64_t r0 = int64_t(blockIdx.y) * band, r1 = std::min(rows, r0 + band);
  float acc[W] = {};
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnSumWarps) {
      float v[W];
      cuda::load<W>(dy + r * cols + c, v);
#pragma unroll
      for (int t = 0; t < W; ++t) acc[t] += v[t];
    }
  }
#pragma unroll
  for (int t = 0; t < W; ++t) part[threadIdx.y][threadIdx.x * W + t] = acc[t];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
#pragma unroll
  for (int t = 0; t < W; ++t) {
    float s = 0.0f;
    for (int y = 0; y < kColumnSumWarps; ++y) s += part[y][threadIdx.x * W + t];
    atomicAdd(db + c + t, s);
  }
}

}  // namespace

void CudaBackend::lt_matmul(const LtGemm& g) {
  // Opaque descriptors on the stack: nothing to allocate or destroy per call.
  cublasLtMatmulDescOpaque_t desc_storage;
  cublasLtMatmulDesc_t desc = &desc_storage;
  HONE_CUBLAS_CHECK(
      cublasLtMatmulDescInit(desc, tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  HONE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.op_a, sizeof(g.op_a)));
  HONE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.op_b, sizeof(g.op_b)));
  if (g.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    HONE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    HONE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  }

  const bool ta = g.op_a == CUBLAS_OP_T, tb = g.op_b == CUBLAS_OP_T;
  cublasLtMatrixLayoutOpaque_t la_storage, lb_storage, ld_storage;
  cublasLtMatrixLayout_t la = &la_storage, lb = &lb_storage, ld = &ld_storage;
  HONE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(la, CUDA_R_32F, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
  HONE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(lb, CUDA_R_32F, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
  HONE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(ld, CUDA_R_32F, g.m, g.n, g.ldd));
  if (g.batch > 1) {  // the attention's per-head products: one call for all heads
    const int32_t count = g.batch;
    for (auto [layout, stride] : {std::pair{la, g.stride_a}, std::pair{lb, g.stride_b}, std::pair{ld, g.stride_d}}) {
      HONE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      HONE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)));
    }
  }

  const uint32_t align_a = alignment(g.a), align_b = alignment(g.b), align_d = alignment(g.d);
  // alignment(nullptr) is 256, hence the flag for the bias.
  const int64_t key[kLtKey] = {g.m,     g.n,     g.k,     g.op_a,           g.op_b,     g.bias != nullptr,
                               align_a, align_b, align_d, alignment(g.bias), g.lda,      g.ldb,
                               g.ldd,   g.batch, g.stride_a, g.stride_b,      g.stride_d};
  const cublasLtMatmulAlgo_t* algo = nullptr;
  for (int i = 0; i < std::min(lt_algo_count_, kLtAlgoCache) && !algo; ++i)
    if (std::memcmp(lt_algos_[i].key, key, sizeof(key)) == 0) algo = &lt_algos_[i].algo;
  if (!algo) {
    cublasLtMatmulPreferenceOpaque_t pref_storage;
    cublasLtMatmulPreference_t pref = &pref_storage;
    HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(pref));
    const uint64_t ws_limit = kGemmWorkspaceBytes;
    HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit,
                                                           sizeof(ws_limit)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attr, value] : aligns)
      HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    HONE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, desc, la, lb, ld, ld, pref, 1, &result, &found));
    if (found == 0)
      fail("cuBLASLt has no algorithm for the product m={} n={} k={} (ops {}{}{})", g.m, g.n, g.k, ta ? 'T' : 'N',
           tb ? 'T' : 'N', g.bias ? ", bias" : "");
    LtAlgo& slot = lt_algos_[lt_algo_count_++ % kLtAlgoCache];
    std::memcpy(slot.key, key, sizeof(key));
    slot.algo = result.algo;
    algo = &slot.algo;
  }
  HONE_CUBLAS_CHECK(cublasLtMatmul(lt_, desc, &g.alpha, g.a, la, g.b, lb, &g.beta, g.d, ld, g.d, ld, algo,
                                   gemm_workspace_, kGemmWorkspaceBytes, stream_));
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  lt_matmul({CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, w.f32(), k, x.f32(), k, y.f32(), n, 0.0f, b ? b->f32() : nullptr});
}

void CudaBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                                  Tensor& dw, Tensor* db) {
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  if (dx)
    lt_matmul({CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, w.f32(), k, dy.f32(), n, dx->f32(), k, accumulate_dx ? 1.0f : 0.0f,
               nullptr});
  lt_matmul({CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, x.f32(), k, dy.f32(), n, dw.f32(), k, 1.0f, nullptr});
  if (!db || m == 0) return;
  // About four blocks per SM: enough bands of rows to fill the GPU, few atomics per column.
  int sms = 0;
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  const bool vec = cuda::vec4_ok(n, {dy.data});
  const int64_t col_blocks = (n + 32 * (vec ? 4 : 1) - 1) / (32 * (vec ? 4 : 1));
  const int64_t bands = std::clamp<int64_t>(4 * sms / col_blocks, 1, (m + kColumnSumWarps - 1) / kColumnSumWarps);
  const int64_t band = (m + bands - 1) / bands;
  const dim3 grid(unsigned(col_blocks), unsigned((m + band - 1) / band)), block(32, kColumnSumWarps);
  if (vec)
    column_sum_kernel<4><<<grid, block, 0, stream_>>>(dy.f32(), db->f32(), m, int(n), band);
  else
    column_sum_kernel<1><<<grid, block, 0, stream_>>>(dy.f32(), db->f32(), m, int(n), band);
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
