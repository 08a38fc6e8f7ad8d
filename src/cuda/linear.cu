// Fully connected layers on cuBLASLt. cuBLASLt is column-major and a row-major [R, C]
// matrix is a column-major [C, R] one, so every product is computed transposed (w as
// stored reads as column-major w^T):
//   y^T  = w x^T + b    (forward; the bias epilogue adds b to every column)
//   dx^T = w^T dy^T
//   dw^T += x^T dy
// db += column sums of dy is a product of its own with a vector of ones in half precision,
// and a column-sum kernel in F32: the BGRADB epilogue, which overwrites, would need a
// scratch and an add, and measured slower (it steers cuBLASLt to slower kernels: +8 to
// +21 us a product at bert-large shapes on TF32; in bf16 at batch 32 on an H100, +18 to +72
// us against 12 to 50 us for the ones product) than a separate pass.
// The feed-forward block's tanh GELU runs in the epilogues (GELU_AUX_BIAS forward, DGELU on
// the dx product backward). BERT's erf GELU cannot: cuBLASLt has only the tanh form, and
// cuDNN's runtime-fused matmul + erf GELU measured slower than this product plus a separate
// pass (bert-large FFN on an H200: 40.8 against 37.3 us forward, 44.9 against 42.3 backward).
// On Hopper the erf GELU's forward runs in hone's own product (hopper_gemm.h).
// Under BF16/F16 x, w, y, dy and dx are in the compute dtype and the products accumulate
// in F32; dw and db stay F32 (the weight-gradient product reads half A/B and adds into an
// F32 D).
#include <algorithm>
#include <limits>
#include <utility>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/hopper_gemm.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

// Largest power of two (at most 256) dividing the address: what the heuristic must
// assume about the pointer's alignment.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
}

// Dimensions within a quarter of an octave of each other share a bucket (above 64): a
// product's timed algorithm choice serves every shape of its bucket.
int64_t shape_bucket(int64_t x) {
  if (x <= 64) return x;
  const int64_t step = (int64_t(1) << (63 - __builtin_clzll(uint64_t(x)))) / 4;
  return (x + step - 1) / step * step;
}

// lt_matmul times the heuristic's first kCandidates for the products times_candidates names;
// timed_row_counts names the sizes it times.
constexpr int kCandidates = 6;

// db[c] += sum over rows of dy[r, c], in the layout of cuda::column_sum_blocks. W is 1 or
// kVec<T> (one 16-byte load).
template <typename T, int W>
__global__ void __launch_bounds__(32 * cuda::kColumnSumWarps)
    column_sum_kernel(const T* __restrict__ dy, float* __restrict__ db, int64_t rows, int cols, int64_t band) {
  const int c = (blockIdx.x * 32 + threadIdx.x) * W;
  const int64_t r0 = int64_t(blockIdx.y) * band, r1 = std::min(rows, r0 + band);
  float acc[W] = {};
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += cuda::kColumnSumWarps) {
      float v[W];
      if constexpr (W == 1)
        v[0] = cuda::to_float(dy[r * cols + c]);
      else
        cuda::load_floats<T, W>(dy + r * cols + c, v);
#pragma unroll
      for (int t = 0; t < W; ++t) acc[t] += v[t];
    }
  }
  cuda::add_column_sums<W>(acc, db, c, cols);
}

template <typename T, int W>
void column_sum(const T* dy, float* db, int64_t rows, int64_t cols, int sms, cudaStream_t stream) {
  const cuda::ColumnSumBlocks l = cuda::column_sum_blocks(rows, cols, W, sms);
  column_sum_kernel<T, W><<<l.grid, l.block, 0, stream>>>(dy, db, rows, int(cols), l.band);
  HONE_CUDA_LAUNCH_CHECK();
}

// cuBLASLt's GELU epilogue computes the tanh form, so only GeluTanh runs in it (the erf
// GELU of BERT's "gelu" stays a separate pass); its aux matrix needs a leading dimension
// divisible by 8.
bool gelu_epilogue(Activation a, int64_t features, const void* aux) {
  return a == Activation::GeluTanh && features % 8 == 0 && cuda::aligned16(aux);
}

}  // namespace

CudaBackend::LtDescription::LtDescription(const LtGemm& g, bool tf32) {
  // F32 accumulation and F32 alpha/beta for every dtype.
  const cublasComputeType_t compute =
      tf32 && g.ab_type == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  HONE_CUBLAS_CHECK(cublasLtMatmulDescInit(desc, compute, CUDA_R_32F));
  HONE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.op_a, sizeof(g.op_a)));
  HONE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.op_b, sizeof(g.op_b)));
  HONE_CHECK(g.gelu != GeluEpilogue::Backward || !g.bias, "cuBLASLt product: a GELU-gradient epilogue takes no bias");
  HONE_CHECK(g.gelu != GeluEpilogue::None || !g.aux, "cuBLASLt product: an aux matrix without a GELU epilogue");
  HONE_CHECK(g.gelu != GeluEpilogue::Backward || g.aux, "cuBLASLt product: a GELU-gradient epilogue needs its aux");
  HONE_CHECK(g.gelu == GeluEpilogue::None || g.batch == 1, "cuBLASLt product: a GELU epilogue on a batched product");
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (g.gelu) {
    case GeluEpilogue::None: epilogue = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT; break;
    case GeluEpilogue::Forward:  // aux keeps the product before the GELU, for a backward
      epilogue = g.aux ? (g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                       : (g.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
      break;
    case GeluEpilogue::Backward: epilogue = CUBLASLT_EPILOGUE_DGELU; break;
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    HONE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (g.bias) {
    HONE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    const int32_t bias_type = g.d_type;  // cuBLASLt's default too, stated rather than relied on
    HONE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  if (g.aux) {
    HONE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
    HONE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.ldd, sizeof(g.ldd)));
    const int32_t aux_type = g.d_type;
    HONE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
  }

  const bool ta = g.op_a == CUBLAS_OP_T, tb = g.op_b == CUBLAS_OP_T;
  HONE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(a, g.ab_type, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
  HONE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(b, g.ab_type, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
  HONE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(d, g.d_type, g.m, g.n, g.ldd));
  if (g.batch > 1) {  // the attention's per-head products: one call for all heads
    const int32_t count = g.batch;
    for (auto [layout, stride] : {std::pair{a, g.stride_a}, std::pair{b, g.stride_b}, std::pair{d, g.stride_d}}) {
      HONE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      HONE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)));
    }
  }
}

int CudaBackend::lt_heuristics(cublasLtHandle_t lt, const LtGemm& g, const LtDescription& d, int count,
                               cublasLtMatmulHeuristicResult_t* results) {
  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(pref));
  const uint64_t ws_limit = kGemmWorkspaceBytes;
  HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit,
                                                         sizeof(ws_limit)));
  // Split-K partial sums only in F32: reducing them in a half-precision output (in place
  // or in the output type) rounds each product once more, which lt_matmul's timed choice
  // picked on a small bf16 product (GpuMixed measured 1.1 of bf16's rounding there).
  if (g.d_type != CUDA_R_32F || g.whole_k) {
    const uint32_t reductions = g.whole_k ? CUBLASLT_REDUCTION_SCHEME_NONE
                                          : CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                           &reductions, sizeof(reductions)));
  }
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(g.a)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(g.b)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(g.d)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(g.d)}};
  for (const auto& [attr, value] : aligns)
    HONE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  int found = 0;
  HONE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, d.desc, d.a, d.b, d.d, d.d, pref, count, results, &found));
  return found;
}

bool CudaBackend::lt_matmul(const LtGemm& g) {
  const LtDescription described(g, tf32_);
  cublasLtMatmulDesc_t desc = described.desc;
  cublasLtMatrixLayout_t la = described.a, lb = described.b, ld = described.d;
  // alignment(nullptr) is 256, hence the flag for the bias.
  const std::array<int64_t, kLtKey> key = {g.m, g.n, g.k, g.op_a, g.op_b, g.bias != nullptr, alignment(g.a),
                                           alignment(g.b), alignment(g.d), alignment(g.bias), g.lda, g.ldb, g.ldd,
                                           g.batch, g.stride_a, g.stride_b, g.stride_d, g.ab_type, g.d_type,
                                           int64_t(g.gelu), g.aux ? alignment(g.aux) : 0, g.whole_k};
  const cublasLtMatmulAlgo_t* algo = nullptr;
  if (auto it = lt_algos_.find(key); it != lt_algos_.end()) {
    if (!it->second) return false;  // an epilogue this cuBLASLt has no kernel for
    algo = &*it->second;
  }
  // Where the backend times products, half-precision ones that overwrite D try the
  // heuristic's first candidates on this call's own operands and keep the fastest; F32
  // products keep the first pick, so that the reference path stays the same from run to
  // run. So do products under a billion multiply-adds, which take microseconds whichever
  // algorithm runs them: timing noise would pick among algorithms that round differently,
  // run to run.
  const double macs = double(g.m) * double(g.n) * double(g.k) * double(g.batch);
  const bool tune = g.beta == 0.0f && times_candidates(g.ab_type != CUDA_R_32F, macs);
  std::array<int64_t, kLtKey> bucket = key;
  for (size_t i = 0; i < 3; ++i) bucket[i] = shape_bucket(key[i]);
  // A shape in a bucket already timed is not timed again: timing the candidates for each
  // packed step's number of rows cost more than the products (bert-large on 2048 texts of
  // 16..512 tokens: 113 TFLOP/s forward). Where another candidate won, the shape takes that
  // choice if cuBLASLt runs it for this shape too. Where the heuristic's first won, the
  // shape takes the heuristic's first for itself: the heuristic sees how the shape's tiles
  // fill the GPU's waves, which a choice timed at another row count does not (bert-large's
  // down projection, bf16, H200: at 17,654 rows the first pick at 20,480 took 0.209 ms, the
  // heuristic's own first for 17,654 0.168; the out projection's timed winner, the
  // heuristic's fifth, stayed ahead at every count of its bucket; docs/BENCHMARKS.md).
  bool time_here = tune;
  if (auto it = !algo && tune ? lt_timed_.find(bucket) : lt_timed_.end(); it != lt_timed_.end()) {
    const TimedChoice& timed = it->second;
    time_here = false;  // the heuristic's first for this shape, unless another candidate won
    if (!timed.heuristic_first) {
      cublasLtMatmulHeuristicResult_t check = {};
      if (cublasLtMatmulAlgoCheck(lt_, desc, la, lb, ld, ld, &timed.algo, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= kGemmWorkspaceBytes)
        algo = &*lt_algos_.emplace(key, timed.algo).first->second;
      else
        time_here = true;  // the winner does not run this shape: time the candidates for it
    }
  }
  if (!algo) {
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    const int found = lt_heuristics(lt_, g, described, time_here ? kCandidates : 1, results);
    if (found == 0 && g.gelu != GeluEpilogue::None) {
      lt_algos_.emplace(key, std::nullopt);
      return false;
    }
    if (found == 0)
      fail("cuBLASLt has no algorithm for the product m={} n={} k={} (ops {}{}{}{}, types {} -> {})", g.m, g.n, g.k,
           g.op_a == CUBLAS_OP_T ? 'T' : 'N', g.op_b == CUBLAS_OP_T ? 'T' : 'N', g.bias ? ", bias" : "",
           g.gelu == GeluEpilogue::None ? "" : g.gelu == GeluEpilogue::Forward ? ", GELU" : ", GELU gradient",
           int(g.ab_type), int(g.d_type));
    cublasLtMatmulHeuristicResult_t result = results[0];
    bool first_won = true;
    if (found > 1) {
      HONE_CHECK(!recording_, "a {}x{}x{} product first seen while recording a CUDA graph: its algorithm is chosen "
                 "by timing, which a recording cannot do (--cuda_graphs false runs without graphs)", g.m, g.n, g.k);
      cudaEvent_t start = nullptr, stop = nullptr;
      HONE_CUDA_CHECK(cudaEventCreate(&start));
      HONE_CUDA_CHECK(cudaEventCreate(&stop));
      float best = std::numeric_limits<float>::infinity();
      for (int i = 0; i < found; ++i) {
        auto run = [&] {
          HONE_CUBLAS_CHECK(cublasLtMatmul(lt_, desc, &g.alpha, g.a, la, g.b, lb, &g.beta, g.d, ld, g.d, ld,
                                           &results[i].algo, gemm_workspace_, kGemmWorkspaceBytes, stream_));
        };
        run();  // warm-up
        HONE_CUDA_CHECK(cudaEventRecord(start, stream_));
        for (int r = 0; r < 3; ++r) run();
        HONE_CUDA_CHECK(cudaEventRecord(stop, stream_));
        HONE_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        // A later candidate must win by 3%: near-ties keep the heuristic's order, so that
        // the choice, and with it the rounding, stays the same from run to run.
        if (ms < best * 0.97f) best = ms, result = results[i], first_won = i == 0;
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
    algo = &*lt_algos_.emplace(key, result.algo).first->second;
    if (time_here) lt_timed_.emplace(bucket, TimedChoice{result.algo, first_won});
  }
  HONE_CUBLAS_CHECK(cublasLtMatmul(lt_, desc, &g.alpha, g.a, la, g.b, lb, &g.beta, g.d, ld, g.d, ld, algo,
                                   gemm_workspace_, kGemmWorkspaceBytes, stream_));
  return true;
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, w.data, k, x.data, k, y.data, n, 0.0f, b ? b->data : nullptr};
  g.ab_type = g.d_type = cuda::cuda_dtype(x.dtype);
  lt_matmul(g);
}

// Few rows (small inference batches) and a long k: the product's 64 x 64 output tiles, the
// smallest cuBLASLt takes there, fill at most half the SMs, and cuBLASLt's own choice splits
// k and ends in a reduction pass (bert-large's down projection at batch 1 x 128: 7.0 us and
// 3.4 for the pass, H200). Split k here instead, into as many parts as keep the tiles within
// one wave; the residual LayerNorm after the product adds them (parts_add_layernorm_forward),
// one launch fewer. Where k is no longer than the output is wide (the out projection),
// cuBLASLt takes k whole in narrower tiles, and a split gains nothing. Rows of at most 2048
// columns, which the norm's kernel takes in any layout.
int CudaBackend::linear_splits(int64_t m, int64_t n, int64_t k, DType t) const {
  if (t == DType::F32 || k <= n || n > 2048) return 1;  // F32: the reference path stays whole
  const int64_t tiles = ((m + 63) / 64) * ((n + 63) / 64);
  int splits = 1;
  while (2 * splits <= kMaxProductParts && tiles * 2 * splits <= sms_ && k % (2 * splits * 64) == 0) splits *= 2;
  return splits;
}

// Where the backend times products (CudaOptions::time_products): half-precision ones of at
// least 2^30 multiply-adds.
bool CudaBackend::times_candidates(bool half_operands, double macs) const {
  return time_products_ && half_operands && macs >= double(1 << 30);
}

std::vector<int64_t> CudaBackend::timed_row_counts(int64_t max_rows, int64_t n, int64_t k, DType t) const {
  std::vector<int64_t> counts;
  // Each bucket's largest count, or max_rows in the last: timed if any count of it is.
  for (int64_t m = 1; m <= max_rows; m = shape_bucket(m) + 1) {
    const int64_t last = std::min(shape_bucket(m), max_rows);
    if (times_candidates(t != DType::F32, double(last) * double(n) * double(k))) counts.push_back(last);
  }
  return counts;
}

void CudaBackend::linear_split_forward(const Tensor& x, const Tensor& w, Tensor& parts) {
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0], splits = parts.shape[0], ks = k / splits;
  if (m == 0) return;
  LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, n, m, ks, w.data, k, x.data, k, parts.data, n, 0.0f};
  g.ab_type = cuda::cuda_dtype(x.dtype);
  g.d_type = CUDA_R_32F;
  g.batch = int(splits);
  g.stride_a = g.stride_b = ks;  // part s reads columns [s ks, (s + 1) ks) of both
  g.stride_d = m * n;
  g.whole_k = true;  // a split of a split would add cuBLASLt's reduction pass back
  lt_matmul(g);
}

void CudaBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                                  Tensor& dw, Tensor* db) {
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  const cudaDataType_t type = cuda::cuda_dtype(x.dtype);
  if (dx) {
    LtGemm gx{CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, w.data, k, dy.data, n, dx->data, k, accumulate_dx ? 1.0f : 0.0f};
    gx.ab_type = gx.d_type = type;
    lt_matmul(gx);
  }
  LtGemm gw{CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, x.data, k, dy.data, n, dw.f32(), k, 1.0f};
  gw.ab_type = type;
  gw.d_type = CUDA_R_32F;  // half inputs, F32 output: the gradient accumulates in F32
  lt_matmul(gw);
  if (db) bias_backward(dy, *db);
}

void CudaBackend::bias_backward(const Tensor& dy, Tensor& db) {
  const int64_t m = dy.shape[0], n = dy.shape[1];
  if (m == 0) return;
  const cudaDataType_t type = cuda::cuda_dtype(dy.dtype);
  // Half precision: db += dy^T 1 as a product with a vector of ones, which cuBLASLt runs at
  // memory speed (the column-sum kernel below reaches a fifth of it on these shapes).
  if (dy.dtype != DType::F32 && m <= kOnesLength) {
    LtGemm gb{CUBLAS_OP_N, CUBLAS_OP_N, n, 1, m, dy.data, n, dy.dtype == DType::BF16 ? ones_bf16_ : ones_f16_, m,
              db.f32(), n, 1.0f};
    gb.ab_type = type;
    gb.d_type = CUDA_R_32F;
    lt_matmul(gb);
    return;
  }
  cuda::with_dtype(dy.dtype, "linear_backward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::kVec<T>;
    const T* p = dy.ptr<T>();
    if (n % V == 0 && cuda::aligned16(p))
      column_sum<T, V>(p, db.f32(), m, n, sms_, stream_);
    else
      column_sum<T, 1>(p, db.f32(), m, n, sms_, stream_);
  });
}

void CudaBackend::linear_activation_forward(Activation a, const Tensor& x, const Tensor& w, const Tensor* b,
                                            Tensor& pre, Tensor& y) {
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  const void* bias = b ? b->data : nullptr;
  if (a == Activation::Gelu &&
      cuda::hopper_gelu_product_runs(x.dtype, m, n, k, sms_, {x.data, w.data, bias, y.data, pre.data}))
    return cuda::hopper_gelu_product(stream_, sms_, x.dtype, x.data, w.data, bias, y.data, pre.data, m, n, k);
  if (!pre.data) {  // not kept (inference)
    if (m > 0 && a == Activation::GeluTanh) {  // cuBLASLt's GELU_BIAS, no aux
      LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, w.data, k, x.data, k, y.data, n, 0.0f, bias};
      g.ab_type = g.d_type = cuda::cuda_dtype(x.dtype);
      g.gelu = GeluEpilogue::Forward;
      if (lt_matmul(g)) return;
    }
    linear_forward(x, w, b, y);
    return activation_forward(a, y, y);
  }
  if (m > 0 && gelu_epilogue(a, n, pre.data)) {
    LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, w.data, k, x.data, k, y.data, n, 0.0f, b ? b->data : nullptr};
    g.ab_type = g.d_type = cuda::cuda_dtype(x.dtype);
    g.gelu = GeluEpilogue::Forward;
    g.aux = pre.data;
    if (lt_matmul(g)) return;
  }
  linear_forward(x, w, b, pre);
  activation_forward(a, pre, y);
}

void CudaBackend::activation_linear_backward(Activation a, const Tensor& dy, const Tensor& pre, const Tensor& w,
                                             Tensor& y, Tensor& dpre, Tensor& dw, Tensor* db, Tensor* db_pre) {
  const int64_t m = pre.shape[0], k = pre.shape[1], n = w.shape[0];
  if (m == 0) return;  // nothing to add to dw and db
  // dpre^T = w^T dy^T, linear_backward's dx product, times GELU'(pre^T) in its epilogue.
  LtGemm g{CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, w.data, k, dy.data, n, dpre.data, k, 0.0f};
  g.ab_type = g.d_type = cuda::cuda_dtype(pre.dtype);
  bool fused = false;
  if (gelu_epilogue(a, k, pre.data)) {
    g.gelu = GeluEpilogue::Backward;
    g.aux = pre.data;
    fused = lt_matmul(g);
  }
  if (fused) {
    activation_forward(a, pre, y);
    if (db_pre) bias_backward(dpre, *db_pre);
  } else {
    // y, the gradient and its column sums from one pass over pre, which evaluates the
    // activation's costly part (erf for BERT's GELU) once for both.
    g.gelu = GeluEpilogue::None;
    g.aux = nullptr;
    lt_matmul(g);
    activation_and_gradient(a, pre, y, dpre, db_pre);
  }
  linear_backward(dy, y, w, nullptr, false, dw, db);
}

}  // namespace hone
