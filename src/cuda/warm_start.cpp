// prepare_cuda (hone/cuda.h): what the first training step or inference batch would otherwise
// wait for, done on another thread while the inputs are read.
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
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/warm_start.h"
#include "hone/cuda.h"
#include "hone/error.h"

namespace hone {

namespace {

// The handle prepare_cuda queried through, until a CudaBackend of that device takes it
// (should cuBLASLt keep what the queries set up per handle rather than per process).
std::mutex prepared_mutex;
cublasLtHandle_t prepared_lt = nullptr;
int prepared_device = -1;

// A bias for the descriptions of biased products: described, never read, as a heuristic
// query runs nothing.
const float described_bias = 0.0f;

// One heuristic query for a product of lt_matmul's kind g. False when a call fails: the
// caller stops (the backend's own calls report such errors).
bool query(cublasLtHandle_t lt, const CudaBackend::LtGemm& g, bool tf32) {
  try {
    const CudaBackend::LtDescription described(g, tf32);
    cublasLtMatmulHeuristicResult_t result = {};
    CudaBackend::lt_heuristics(lt, g, described, 1, &result);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

void prepare_cuda(int device, DType products, bool tf32, PreparedWork work) {
  // Errors end the preparation quietly: make_cuda_backend repeats each of these steps
  // and names what failed.
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {  // the primary context
    cudaGetLastError();
    return;
  }
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return;
  const cudaDataType_t half = products == DType::BF16 ? CUDA_R_16BF : products == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  // The kinds of CudaBackend's products, as linear.cu's linear_forward, linear_backward,
  // bias_backward and linear_split_forward describe y = x w^T over `tokens` rows: forward
  // with and without a bias; for training the input gradient, the weight gradient into F32
  // and the bias gradient as a product with a vector of ones; for half-precision inference
  // the forward split into parts of k, each into F32 (small batches). Each at a layer's size
  // and at a classifier's: the first product of a kind paid as much whatever its size, but
  // a second query is cheap.
  using LtGemm = CudaBackend::LtGemm;
  std::vector<LtGemm> kinds;
  auto add = [&](LtGemm g, bool into_f32) {
    g.ab_type = half;
    g.d_type = into_f32 ? CUDA_R_32F : half;
    kinds.push_back(g);
  };
  struct Linear {
    int64_t tokens, in, out;
  };
  for (const Linear l : {Linear{2048, 1024, 1024}, Linear{4, 1024, 2}}) {
    add({CUBLAS_OP_T, CUBLAS_OP_N, l.out, l.tokens, l.in, nullptr, l.in, nullptr, l.in, nullptr, l.out, 0.0f,
         &described_bias},
        false);
    add({CUBLAS_OP_T, CUBLAS_OP_N, l.out, l.tokens, l.in, nullptr, l.in, nullptr, l.in, nullptr, l.out, 0.0f}, false);
    if (work != PreparedWork::Training) continue;
    add({CUBLAS_OP_N, CUBLAS_OP_N, l.in, l.tokens, l.out, nullptr, l.in, nullptr, l.out, nullptr, l.in, 0.0f}, false);
    add({CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, l.tokens, nullptr, l.in, nullptr, l.out, nullptr, l.in, 1.0f}, true);
    add({CUBLAS_OP_N, CUBLAS_OP_N, l.out, 1, l.tokens, nullptr, l.out, nullptr, l.tokens, nullptr, l.out, 1.0f}, true);
  }
  if (work == PreparedWork::Inference && half != CUDA_R_32F) {  // a down projection of 128 rows in 4 parts
    constexpr int64_t rows = 128, in = 4096, out = 1024, parts = 4;
    LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in / parts, nullptr, in, nullptr, in, nullptr, out, 0.0f};
    g.batch = int(parts);
    g.stride_a = g.stride_b = in / parts;
    g.stride_d = rows * out;
    g.whole_k = true;
    add(g, true);
  }
  for (const LtGemm& g : kinds)
    if (!query(lt, g, tf32)) {
      cublasLtDestroy(lt);
      return;
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
