#pragma once
// The compute interface. Model code calls the checked wrappers in ops.h; they validate
// shapes and dispatch here. A backend implements every op; the CPU backend (fp32, BLAS
// + OpenMP) is the reference that every other backend is tested against.
//
// Conventions: row-major; tensors are F32 unless stated; parameter-gradient outputs
// (dw, db, dgamma, dbeta, dword, ...) are accumulated (+=) so that gradient accumulation
// needs no extra pass; other outputs are overwritten.
#include <array>
#include <chrono>
#include <cstdint>
#include <string>

#include "hone/tensor.h"

namespace hone {

enum class Activation : uint8_t { Gelu, GeluTanh, Relu };

// Dropout of one call site: element i is kept iff dropout_keep(seed, stream, i, p),
// and kept elements are scaled by 1 / (1 - p). p == 0 is the identity.
struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
};

struct AttentionDims {
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 1.0f;  // applied to Q K^T; 1 / sqrt(head_dim) for BERT
  int hidden() const { return heads * head_dim; }
};

// Hyper-parameters in double, as torch takes them from Python floats (1 - beta2 in
// float would be off by 1e-5 relative).
struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // 1-based, for bias correction
};

// The spans of a training step that backends time: each mark ends the span running and
// starts the one named.
enum class StepSpan : uint8_t { Forward, Backward, Optimizer, Other };
constexpr int kNumStepSpans = 4;
using SpanSeconds = std::array<double, kNumStepSpans>;

// One parameter range of a multi-tensor AdamW step, with its own weight decay.
struct AdamWSlice {
  Tensor param, grad, m, v;
  double weight_decay = 0;
};

// Tensors per multi-tensor backend call; the ops wrappers split longer lists.
constexpr int kMaxTensorList = 48;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // While set, the ops.h wrappers check shapes and return without computing: the
  // memory planner runs the real training code this way.
  bool dry_run = false;

 protected:
  SpanSeconds span_seconds_{};  // accumulated since the last take_span_seconds
  StepSpan span_ = StepSpan::Other;

 private:
  std::chrono::steady_clock::time_point span_start_{};
  bool span_started_ = false;

 public:

  // Memory of this backend's device, for the arenas (the only allocations of a run).
  // allocate throws hone::Error naming the size when the device is out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  // Host memory for staging batches: page-locked on a GPU, so that copies from it are
  // asynchronous DMA; plain aligned memory on the CPU. Throws hone::Error when out of memory.
  virtual void* allocate_host(size_t bytes);
  virtual void deallocate_host(void* p) noexcept;
  // Blocks until every copy queued so far has finished reading its host source, so that
  // a staging buffer can be refilled.
  virtual void wait_for_copies() {}

  // Step timing, for the summary's time split: the wall clock between marks on the CPU;
  // events on the stream on a GPU, read without stalling it. No-ops in a dry run.
  virtual void mark(StepSpan s);
  // Seconds in each span since the last call; waits for queued work first.
  virtual SpanSeconds take_span_seconds();
  // Waits for queued work (a no-op on the CPU); used before host reads and timing.
  virtual void synchronize() {}

  virtual void fill(Tensor& x, float value) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // bytewise, src.bytes() == dst.bytes()
  virtual void read(const Tensor& src, float* host, size_t n) = 0;  // first n F32 values to host
  virtual void add_scaled(const Tensor& x, float alpha, Tensor& y) = 0;  // y += alpha * x

  // y[M,N] = x[M,K] w[N,K]^T + b[N]   (b may be null)
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) = 0;
  // dx[M,K] = dy[M,N] w (added to dx when accumulate_dx); dw += dy^T x; db += column sums of dy.
  // dx and db may be null.
  virtual void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                               Tensor& dw, Tensor* db) = 0;

  // qkv: [B*S, 3H], Q in columns [0,H), K in [H,2H), V in [2H,3H), head h in columns
  // h*head_dim.. of each. mask: I32 [B,S], 1 = attend, 0 = padding (adds the float
  // minimum to the score, as Hugging Face does). ctx: [B*S, H] = dropout(P) V with
  // P = softmax(scale Q K^T + mask). No [S, S] matrix outlives the call: stats
  // [B, heads, S, 2] keeps, per query row, the maximum of its masked scores and the
  // reciprocal of its sum of exponentials, from which backward recomputes P bit for bit
  // (P = exp(score - max) * inv, the forward's own arithmetic).
  virtual void attention_forward(const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                                 const DropoutSpec& drop, Tensor& stats, Tensor& ctx, Tensor& workspace) = 0;
  // dqkv: [B*S, 3H] (overwritten).
  virtual void attention_backward(const Tensor& dctx, const Tensor& qkv, const Tensor& mask, const Tensor& stats,
                                  const AttentionDims& d, const DropoutSpec& drop, Tensor& dqkv,
                                  Tensor& workspace) = 0;
  // Scratch the attention ops need, in F32 elements (planned as workspace, shared by layers).
  virtual int64_t attention_workspace_elems(const AttentionDims& d) const = 0;

  // Over the last dimension: y = (x - mean) * rstd * gamma + beta; mean, rstd: [rows].
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                 Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) = 0;

  virtual void activation_forward(Activation a, const Tensor& x, Tensor& y) = 0;
  // dx = dy * act'(x); dx may alias dy.
  virtual void activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) = 0;
  virtual void tanh_forward(const Tensor& x, Tensor& y) = 0;
  virtual void tanh_backward(const Tensor& dy, const Tensor& y, Tensor& dx) = 0;  // from the output y
  // y = dropout(x); also its own backward (same spec, applied to dy). y may alias x.
  virtual void dropout(const Tensor& x, const DropoutSpec& d, Tensor& y) = 0;
  // out = residual + dropout(x); out may alias either input.
  virtual void dropout_add(const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out) = 0;

  // ids, types: I32 [B*S]; out[t] = word[ids[t]] + pos[t % S] + type[types[t]], S = pos rows used
  virtual void embedding_forward(const Tensor& ids, const Tensor& types, const Tensor& word, const Tensor& pos,
                                 const Tensor& type, int seq, Tensor& out) = 0;
  virtual void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& types, int seq, Tensor& dword,
                                  Tensor& dpos, Tensor& dtype) = 0;
  // out[b] = hidden[b*S]  (the [CLS] rows); scatter writes dhidden = 0 except those rows.
  virtual void gather_first_tokens(const Tensor& hidden, int seq, Tensor& out) = 0;
  virtual void scatter_first_tokens(const Tensor& dout, int seq, Tensor& dhidden) = 0;

  // Mean loss over the batch into loss[0] and its gradient times grad_scale into dlogits.
  // cross_entropy: labels I32 [B], -100 = ignored (as PyTorch); mse: target F32 [B].
  virtual void cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, Tensor& loss,
                             Tensor& dlogits) = 0;
  virtual void mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& loss, Tensor& dpred) = 0;

  // out[0] += sum of x^2 over every tensor of the list (count <= kMaxTensorList): one
  // launch for all parameter groups.
  virtual void sum_squares(const Tensor* xs, int count, Tensor& out) = 0;
  // From out[0] of sum_squares: norm_coef[0] = sqrt(sumsq), norm_coef[1] =
  // min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_; 1 if max_norm <= 0.
  virtual void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm_coef) = 0;
  // torch.optim.AdamW on grad * norm_coef[1], for every slice of the list (count <=
  // kMaxTensorList), each with its own weight decay (s.weight_decay is not used).
  virtual void adamw(const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef) = 0;
};

}  // namespace hone
