#pragma once
// The CUDA backend: one stream, cuBLASLt for matrix products (with a reused workspace),
// CUDA kernels for everything else, one file per op family (src/cuda/*.cu). Nothing is
// allocated after construction except the arenas, which allocate once each. Kernels
// trust their indices: the trainer validates token ids and labels on the host before
// a batch reaches any backend.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "hone/backend.h"
#include "hone/cuda.h"

namespace hone {

namespace cuda {
struct SdpaCache;  // sdpa.h
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }
  void* allocate(size_t bytes) override;
  void deallocate(void* p) noexcept override;
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* p) noexcept override;
  void wait_for_copies() override;
  void wait_for_reads() override;
  void stage(const Tensor& host, Tensor& staging) override;
  void take_staged(const Tensor& staging, Tensor& dst) override;
  Transfer transfer_to_host(const Tensor& src, Tensor& host_dst) override;
  Transfer transfer_to_device(const Tensor& host_src, Tensor& dst) override;
  void wait_transfer(Transfer t) override;
  void compute_waits_for(Transfer t) override;
  bool can_record() const override { return true; }
  void begin_recording() override;
  int end_recording() override;
  void abort_recording() noexcept override;
  void replay(int recording) override;
  void free_recording(int recording) noexcept override;
  bool recording() const { return recording_; }
  void record_mark(StepSpan s) override;
  SpanSeconds take_span_seconds() override;
  void synchronize() override;
  void stamp() override;
  std::vector<double> take_stamps() override;
  void push_range(const char* name) override;
  void pop_range() override;

  void fill(Tensor& x, float value) override;
  void fill_normal(Tensor& x, float std, uint64_t seed, uint64_t stream) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void read(const Tensor& src, float* host, size_t n) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void add_scaled(const Tensor& x, float alpha, Tensor& y) override;
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  void linear_split_forward(const Tensor& x, const Tensor& w, Tensor& parts) override;
  int linear_splits(int64_t m, int64_t n, int64_t k, DType t) const override;
  std::vector<int64_t> timed_row_counts(int64_t max_rows, int64_t n, int64_t k, DType t) const override;
  // The groups of product shapes whose algorithm was chosen by timing so far.
  size_t timed_product_groups() const { return lt_timed_.size(); }
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx, Tensor& dw,
                       Tensor* db) override;
  void linear_activation_forward(Activation a, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& pre,
                                 Tensor& y) override;
  void activation_linear_backward(Activation a, const Tensor& dy, const Tensor& pre, const Tensor& w, Tensor& y,
                                  Tensor& dpre, Tensor& dw, Tensor* db, Tensor* db_pre) override;
  void attention_forward(const Tensor& qkv, const Tensor& mask, const AttentionDims& d, const DropoutSpec& drop,
                         Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace) override;
  void attention_backward(const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& mask,
                          const Tensor& stats, const Tensor& keep, const AttentionDims& d, const DropoutSpec& drop,
                          Tensor& dqkv, Tensor& workspace) override;
  int attention_keep_words(const AttentionDims& d, DType t) const override;
  int64_t attention_workspace_elems(const AttentionDims& d, DType t) const override;
  bool attention_needs_right_padding(DType t) const override { return cudnn_attention_ && t != DType::F32; }
  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;
  void dropout_add_layernorm_forward(const Tensor& x, const Tensor& residual, const DropoutSpec& d,
                                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& sum, Tensor& y,
                                     Tensor& mean, Tensor& rstd) override;
  void parts_add_layernorm_forward(const Tensor& parts, const Tensor* b, const Tensor& residual, const Tensor& gamma,
                                   const Tensor& beta, float eps, Tensor& y, Tensor& mean, Tensor& rstd) override;
  void layernorm_dropout_backward(const Tensor& dy, const Tensor& sum, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, const DropoutSpec& d, Tensor& dsum, Tensor& dx, Tensor& dgamma,
                                  Tensor& dbeta) override;
  void activation_forward(Activation a, const Tensor& x, Tensor& y) override;
  void activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) override;
  void tanh_forward(const Tensor& x, Tensor& y) override;
  void tanh_backward(const Tensor& dy, const Tensor& y, Tensor& dx) override;
  void dropout(const Tensor& x, const DropoutSpec& d, Tensor& y) override;
  void dropout_add(const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out) override;
  void embedding_forward(const Tensor& ids, const Tensor& types, const Tensor& positions, const Tensor& word,
                         const Tensor& pos, const Tensor& type, int seq, Tensor& out) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& types, const Tensor& positions,
                          int seq, Tensor& dword, Tensor& dpos, Tensor& dtype) override;
  void position_ids_after_padding(const Tensor& ids, int32_t pad, int seq, Tensor& out) override;
  void gated_activation_forward(Activation a, const Tensor& x, Tensor& y) override;
  void gated_activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) override;
  void rotary(Tensor& qkv, const Tensor& rows, int seq, int heads, int head_dim, float theta, bool inverse) override;
  void mean_pool_forward(const Tensor& hidden, const Tensor& mask, Tensor& out) override;
  void mean_pool_backward(const Tensor& dout, const Tensor& mask, Tensor& dhidden) override;
  void mean_pool_packed(const Tensor& hidden, const Tensor& row_start, Tensor& out) override;
  void gather_first_tokens(const Tensor& hidden, int seq, Tensor& out) override;
  void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override;
  void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override;
  void attention_forward_packed(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                                const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx,
                                Tensor& workspace) override;
  void attention_backward_packed(const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& row_start,
                                 const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                                 const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) override;
  bool packs_attention(const AttentionDims& d, DType t) const override;
  bool packs_training_attention(const AttentionDims& d, DType t) const override;
  bool packs_training() const override { return true; }
  void scatter_first_tokens(const Tensor& dout, int seq, Tensor& dhidden) override;
  void cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, const Tensor* loss_scale,
                     Tensor& loss, Tensor& dlogits) override;
  void mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor* loss_scale, Tensor& loss,
           Tensor& dpred) override;
  void sum_squares(const Tensor* xs, int count, Tensor& out) override;
  void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm_coef, Tensor* scaler,
                        const LossScaling& ls) override;
  void adamw(const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef) override;
  void elementwise_optimizer(ElementwiseOptimizer kind, const ElementwiseSlice* slices, int count,
                             const Tensor& scalars, const Tensor& norm_coef) override;
  void adafactor(const AdafactorTensor& t, const Tensor& scalars, const Tensor& norm_coef, Tensor& workspace) override;
  int64_t adafactor_workspace_elems(int64_t rows, int64_t cols) const override;
  void optim_8bit(Optim8bitAlgo algo, const Optim8bitSlice* slices, int count, const Tensor& scalars,
                  const Tensor& qmaps, const Tensor& norm_coef) override;

  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* gemm_workspace() const { return gemm_workspace_; }
  size_t gemm_workspace_bytes() const { return kGemmWorkspaceBytes; }
  bool tf32() const { return tf32_; }

  static constexpr size_t kGemmWorkspaceBytes = 32u << 20;
  // Vectors of ones in BF16 and F16, for bias gradients as products (linear.cu): rows of a
  // micro-batch up to this many (batch x sequence) take that path.
  static constexpr int64_t kOnesLength = 1 << 16;
  // The most parts linear_split_forward makes, which parts_add_layernorm_forward adds.
  static constexpr int kMaxProductParts = 8;
  // Double partials of block reductions (sum_squares) and their arrival count after them.
  static constexpr int kReduceSlots = 1024;

  // Every matrix product of the backend: column-major D[m, n] = alpha op(A) op(B) +
  // beta D (+ bias per row when set), `batch` times at the given element strides. A and B
  // share ab_type; D (and the bias) have d_type; products accumulate in F32.
  // With `gelu`, cuBLASLt's (tanh) GELU runs in the epilogue on aux [m, n] (leading
  // dimension ldd, type d_type): Forward writes the product (plus bias) to aux, when given,
  // and its GELU to D; Backward reads the GELU's input from aux and writes the product times
  // GELU' to D.
  enum class GeluEpilogue : uint8_t { None, Forward, Backward };
  struct LtGemm {
    cublasOperation_t op_a, op_b;
    int64_t m, n, k;
    const void* a;
    int64_t lda;
    const void* b;
    int64_t ldb;
    void* d;
    int64_t ldd;
    float beta;
    const void* bias = nullptr;
    float alpha = 1.0f;
    int batch = 1;
    int64_t stride_a = 0, stride_b = 0, stride_d = 0;
    cudaDataType_t ab_type = CUDA_R_32F, d_type = CUDA_R_32F;
    GeluEpilogue gelu = GeluEpilogue::None;
    void* aux = nullptr;
    bool whole_k = false;  // only algorithms that take k in one pass (no split-k reduction)
  };
  // cuBLASLt's description of a product (linear.cu), in opaque descriptors held in place:
  // nothing to allocate or destroy. Not copyable: the handles point into it. TF32, when
  // allowed, applies to F32 operands only.
  struct LtDescription {
    LtDescription(const LtGemm& g, bool tf32);
    LtDescription(const LtDescription&) = delete;
    LtDescription& operator=(const LtDescription&) = delete;
    cublasLtMatmulDescOpaque_t desc_storage;
    cublasLtMatrixLayoutOpaque_t a_storage, b_storage, d_storage;
    cublasLtMatmulDesc_t desc = &desc_storage;
    cublasLtMatrixLayout_t a = &a_storage, b = &b_storage, d = &d_storage;
  };
  // The heuristic's first `count` algorithms for g, under lt_matmul's preferences (its
  // workspace, g's pointers' alignments, split-k sums only where they add no rounding):
  // how many it found. Shared with prepare_cuda (warm_start.cpp), which asks before a
  // backend exists.
  static int lt_heuristics(cublasLtHandle_t lt, const LtGemm& g, const LtDescription& d, int count,
                           cublasLtMatmulHeuristicResult_t* results);
  // False, having run nothing, only for a GELU epilogue that cuBLASLt has no kernel for
  // here; any other product without an algorithm fails.
  bool lt_matmul(const LtGemm& g);
  // y = act(x) and dx = dx * act'(x) in one pass over x (elementwise.cu); dx holds dy on entry.
  // dsum, when set, += the column sums of the new dx (of its values as stored).
  void activation_and_gradient(Activation a, const Tensor& x, Tensor& y, Tensor& dx, Tensor* dsum);
  // db += column sums of dy (F32 db), for a product's bias gradient (linear.cu).
  void bias_backward(const Tensor& dy, Tensor& db);

 private:
  int device_;
  int sms_ = 0;  // streaming multiprocessors, for the grids of kernels that fill the GPU once
  bool tf32_;
  bool time_products_;  // CudaOptions::time_products
  std::string name_;
  cudaStream_t stream_ = nullptr;
  // Host buffers of kRegisteredHostBytes or more: allocated, touched and registered with
  // cudaHostRegister (allocate_host says why), freed by deallocate_host accordingly.
  static constexpr size_t kRegisteredHostBytes = size_t(64) << 20;
  std::mutex registered_mutex_;
  std::unordered_set<void*> registered_;
  cudaEvent_t copied_ = nullptr;     // recorded after each copy from the host
  cudaEvent_t read_back_ = nullptr;  // recorded after each copy to the host
  // Staged inputs: copies from the host on their own stream, ordered against the compute
  // stream by two events.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;  // on copy_stream_, after each stage()
  cudaEvent_t taken_ = nullptr;   // on stream_, after each take_staged()
  // Transfers: one stream each way, so that gradients going down and weights going up
  // share no queue; a ring of events, one per ticket.
  cudaStream_t to_host_stream_ = nullptr, to_device_stream_ = nullptr;
  cudaEvent_t transfer_events_[kTransferTickets] = {};
  int64_t transfers_ = 0;
  Transfer transfer(cudaStream_t s, const Tensor& src, Tensor& dst);
  cudaEvent_t transfer_event(Transfer t) const;

  // Recordings: each a list of graph segments, split at marks.
  struct Segment {
    bool marks = false;  // replay marks `span` before launching (false: the span running goes on)
    StepSpan span = StepSpan::Other;
    cudaGraphExec_t exec = nullptr;  // null: an empty segment, only marked
  };
  struct Recording {
    std::vector<Segment> segments;
    bool reads_host = false;  // holds copies to host memory, which wait_for_reads() awaits
  };
  std::vector<Recording> recordings_;  // freed ones are empty
  Recording building_;
  Segment next_segment_;
  bool recording_ = false;
  void destroy(Recording& r) noexcept;
  void start_segment();
  void finish_segment();
  // Step marks: a ring of timing events, each span read once the next mark has passed,
  // so reading never waits for recent work.
  static constexpr int kMarkRing = 256;
  cudaEvent_t mark_events_[kMarkRing] = {};
  StepSpan mark_spans_[kMarkRing] = {};
  int64_t marks_recorded_ = 0, marks_read_ = 0;
  // Op timing (hone profile): events created as first needed, reused by later profiles.
  std::vector<cudaEvent_t> stamp_events_;
  size_t stamps_used_ = 0;
  void read_marks(int64_t upto);  // accumulates the spans of marks [marks_read_, upto)
  cublasLtHandle_t lt_ = nullptr;
  void* gemm_workspace_ = nullptr;
  void* ones_bf16_ = nullptr;
  void* ones_f16_ = nullptr;
  void* reduce_scratch_ = nullptr;

  // linear.cu state: the cuBLASLt algorithm chosen for each problem seen (the query costs
  // far more than the product for small shapes). Never evicted: a recorded step may only
  // meet products already chosen, since choosing times candidates.
  static constexpr int kLtKey = 22;
  // nullopt: a GELU epilogue product without a kernel, run unfused instead.
  std::map<std::array<int64_t, kLtKey>, std::optional<cublasLtMatmulAlgo_t>> lt_algos_;
  // The timed choices, by shape bucket (linear.cu's shape_bucket): packed batches change
  // their number of rows every step, and a shape near one already timed reuses its choice,
  // or, where timing kept the heuristic's first candidate, the heuristic's first for its own
  // shape (lt_matmul says why).
  struct TimedChoice {
    cublasLtMatmulAlgo_t algo;
    bool heuristic_first;
  };
  std::map<std::array<int64_t, kLtKey>, TimedChoice> lt_timed_;
  // Whether lt_matmul times the candidates of a product of `macs` multiply-adds (linear.cu).
  bool times_candidates(bool half_operands, double macs) const;

  // attention.cu: BF16/F16 attention runs hone's flash kernels unless HONE_ATTENTION=cudnn
  // (read once, at construction); then cuDNN's handle and fused-attention plans, made on
  // the first BF16/F16 attention call, freed by the destructor (cuda::destroy_sdpa_cache).
  // Windowed calls run the flash kernels even then (cudnn_runs).
  bool cudnn_attention_ = false;
  bool cudnn_runs(const AttentionDims& d) const;
  cuda::SdpaCache* sdpa_ = nullptr;
};

}  // namespace hone
