// prepare_cuda (hone/cuda.h): what the first training step would otherwise wait for, done
// on another thread while the inputs are read.
//
// Measured at bert-large's seed run (bf16, batch 4, H200, 2026-11-29): the first step took
// 240-275 ms on the host against 14 for the others. Of that, cuBLASLt's first algorithm
// query of each kind of product took 140-150 ms (the forward's half products 90-100 ms
// beside the first timed candidates, the first weight gradient of half operands into F32
// 36-38, the first bias gradient 9, the first input gradient 4-6), while later queries of
// the same kinds took 0.1-0.3 ms whatever their shapes. One query of each kind readies
// them: with it the first step took 135-145 ms, and train_runtime fell from 1.99-2.02 s
// to 1.87-1.89. Which algorithm runs each real product is still chosen in lt_matmul.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <utility>

#include "cuda/cuda_backend.h"
#include "cuda/warm_start.h"
#include "hone/cuda.h"

namespace hone {

namespace {

// The handle prepare_cuda queried through, until a CudaBackend of that device takes it
// (should cuBLASLt keep what the queries set up per handle rather than per process).
std::mutex prepared_mutex;
cublasLtHandle_t prepared_lt = nullptr;
int prepared_device = -1;

struct ProductKind {
  cublasOperation_t op_a, op_b;
  cudaDataType_t ab_type, d_type;
  bool bias;
  int64_t m, n, k;
};

bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// One heuristic query for a product of this kind, described as lt_matmul describes it.
// False when a call fails: the caller stops (the backend's own calls report such errors).
bool query(cublasLtHandle_t lt, const ProductKind& p, cublasComputeType_t compute) {
  cublasLtMatmulDescOpaque_t desc_storage;
  cublasLtMatmulDesc_t desc = &desc_storage;
  if (!ok(cublasLtMatmulDescInit(desc, compute, CUDA_R_32F)) ||
      !ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &p.op_a, sizeof(p.op_a))) ||
      !ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &p.op_b, sizeof(p.op_b))))
    return false;
  if (p.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = p.d_type;
    if (!ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue))) ||
        !ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type))))
      return false;
  }
  const bool ta = p.op_a == CUBLAS_OP_T, tb = p.op_b == CUBLAS_OP_T;
  cublasLtMatrixLayoutOpaque_t la_storage, lb_storage, ld_storage;
  cublasLtMatrixLayout_t la = &la_storage, lb = &lb_storage, ld = &ld_storage;
  if (!ok(cublasLtMatrixLayoutInit(la, p.ab_type, ta ? p.k : p.m, ta ? p.m : p.k, ta ? p.k : p.m)) ||
      !ok(cublasLtMatrixLayoutInit(lb, p.ab_type, tb ? p.n : p.k, tb ? p.k : p.n, tb ? p.n : p.k)) ||
      !ok(cublasLtMatrixLayoutInit(ld, p.d_type, p.m, p.n, p.m)))
    return false;
  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  const uint64_t workspace = CudaBackend::kGemmWorkspaceBytes;
  if (!ok(cublasLtMatmulPreferenceInit(pref)) ||
      !ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                               sizeof(workspace))))
    return false;
  if (p.d_type != CUDA_R_32F) {  // lt_matmul's split-K restriction for half outputs
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (!ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                 sizeof(reductions))))
      return false;
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  return ok(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &result, &found));
}

}  // namespace

void prepare_cuda(int device, DType products, bool tf32) {
  // Errors end the preparation quietly: make_cuda_backend repeats each of these steps
  // and names what failed.
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {  // the primary context
    cudaGetLastError();
    return;
  }
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return;
  const cudaDataType_t half = products == DType::BF16 ? CUDA_R_16BF : products == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  const cublasComputeType_t compute =
      half == CUDA_R_32F && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // The kinds of CudaBackend's products (lt_matmul's descriptions of y = x w^T over
  // `tokens` rows): forward with and without a bias, the input gradient, the weight
  // gradient into F32, the bias gradient as a product with a vector of ones. Each at a
  // layer's size and at a classifier's: the first product of a kind paid as much whatever
  // its size, but a second query is cheap.
  struct Linear {
    int64_t tokens, in, out;
  };
  for (const Linear l : {Linear{2048, 1024, 1024}, Linear{4, 1024, 2}}) {
    const ProductKind kinds[] = {
        {CUBLAS_OP_T, CUBLAS_OP_N, half, half, true, l.out, l.tokens, l.in},
        {CUBLAS_OP_T, CUBLAS_OP_N, half, half, false, l.out, l.tokens, l.in},
        {CUBLAS_OP_N, CUBLAS_OP_N, half, half, false, l.in, l.tokens, l.out},
        {CUBLAS_OP_N, CUBLAS_OP_T, half, CUDA_R_32F, false, l.in, l.out, l.tokens},
        {CUBLAS_OP_N, CUBLAS_OP_N, half, CUDA_R_32F, false, l.out, 1, l.tokens},
    };
    for (const ProductKind& p : kinds)
      if (!query(lt, p, compute)) {
        cublasLtDestroy(lt);
        return;
      }
  }
  const std::lock_guard lock(prepared_mutex);
  if (prepared_lt) cublasLtDestroy(prepared_lt);
  prepared_lt = lt;
  prepared_device = device;
}

namespace cuda {

cublasLtHandle_t take_prepared_lt(int device) {
  const std::lock_guard lock(prepared_mutex);
  if (device != prepared_device) return nullptr;
  prepared_device = -1;
  return std::exchange(prepared_lt, nullptr);
}

}  // namespace cuda

}  // namespace hone
