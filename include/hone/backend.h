#pragma once
// The compute interface. Model code calls the checked wrappers in ops.h; they validate
// shapes and dispatch here. A backend implements every op; the CPU backend (fp32, BLAS
// + OpenMP) is the reference that every other backend is tested against.
//
// Conventions: row-major; parameter-gradient outputs (dw, db, dgamma, dbeta, dword, ...)
// are accumulated (+=) so that gradient accumulation needs no extra pass; other outputs
// are overwritten.
//
// Dtypes: activations, weights as the model reads them, and every tensor an op computes
// from them share the run's compute dtype: F32, or BF16 / F16 under mixed precision (the
// CUDA backend only; the CPU reference is F32). Whatever the compute dtype, these stay
// F32: row statistics (mean, rstd, attention stats), losses and targets, parameter
// gradients (dw, db, dgamma, dbeta, dword, dpos, dtype) and optimizer state. Element-wise
// math inside a kernel is F32 in every case; half precision is a storage format.
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hone/philox.h"
#include "hone/tensor.h"

namespace hone {

enum class Activation : uint8_t { Gelu, GeluTanh, Relu };

// Dropout of one call site: element i is kept iff dropout_keep(seed, dropout_stream(d), i,
// p) (attention's probabilities: attention_keep), and kept elements are scaled by
// 1 / (1 - p). p == 0 is the identity.
struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  // When set, a counter in the backend's memory (the micro-step): the stream is then
  // (*step << kDropoutSiteBits) | stream, read when the op runs, so that a replayed CUDA
  // graph draws the masks of the step it replays.
  const int64_t* step = nullptr;
};
constexpr int kDropoutSiteBits = 12;  // call sites per step

HONE_HD uint64_t dropout_stream(const DropoutSpec& d) {
  return d.step ? (uint64_t(*d.step) << kDropoutSiteBits) | d.stream : d.stream;
}

struct AttentionDims {
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 1.0f;  // applied to Q K^T; 1 / sqrt(head_dim) for BERT
  // Sliding-window (local) attention, as ModernBERT's local layers: query i weighs key j
  // only if |i - j| <= window; a key farther away gets no weight at all, like a key past
  // the sequence, whatever its mask. -1: no window.
  int window = -1;
  // Inference that reads only each sequence's first row of the context (the last layer
  // before a first-token head): a backend may leave the other rows unwritten.
  bool first_rows_only = false;
  // Packed attention: row_start's values on the host ([batch + 1]) where the caller has
  // them, for counting the work (hone profile); backends read row_start itself.
  const int32_t* host_row_start = nullptr;
  int hidden() const { return heads * head_dim; }
};

// Whether key j lies outside query i's window (never without one).
HONE_HD bool outside_window(int window, int i, int j) { return window >= 0 && (i - j > window || j - i > window); }

// Hyper-parameters in double, as torch takes them from Python floats (1 - beta2 in
// float would be off by 1e-5 relative).
struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // 1-based, for bias correction
  // When set: F32 [kAdamWScalarsSize] in the backend's memory holding adamw_scalars(*this),
  // read when the op runs, so that a replayed CUDA graph uses the current update's values.
  // Each slice then has weight decay 0 or weight_decay.
  const Tensor* scalars = nullptr;
};

// What an AdamW update computes from AdamWStep, as torch does from Python floats: in
// double, rounded to float once.
struct AdamWScalars {
  float step_size;   // lr / (1 - beta1^step)
  float bias2_sqrt;  // sqrt(1 - beta2^step)
  float w1, w2, b2, eps;  // 1 - beta1, 1 - beta2, beta2, eps
  float decay;       // 1 - lr * weight_decay
  float first;       // 1 at step 1, whose moments are zero (a backend may write them unread), else 0
};
constexpr int kAdamWScalarsSize = int(sizeof(AdamWScalars) / sizeof(float));
AdamWScalars adamw_scalars(const AdamWStep& s);

// The spans of a training step that backends time: each mark ends the span running and
// starts the one named.
enum class StepSpan : uint8_t { Forward, Backward, Optimizer, Other };
constexpr int kNumStepSpans = 4;
using SpanSeconds = std::array<double, kNumStepSpans>;

// One parameter range of a multi-tensor AdamW step, with its own weight decay. param, grad,
// m and v are F32. Under mixed precision `half` (BF16 or F16, the same shape) receives the
// updated parameter rounded to nearest even, in the same pass; data == nullptr: none.
struct AdamWSlice {
  Tensor param, grad, m, v;
  double weight_decay = 0;
  Tensor half;
};

// Optimizers whose update of an element reads only that element (and one state value),
// as torch.optim.SGD, torch.optim.Adagrad and bitsandbytes' 32-bit Lion compute them.
enum class ElementwiseOptimizer : uint8_t { Sgd, Adagrad, Lion };

// What an element-wise update reads from the backend's memory, set per update on the host
// (so that a replayed CUDA graph reads the current values).
struct ElementwiseScalars {
  float lr;            // SGD and Lion: the learning rate; Adagrad: lr / (1 + (step - 1) lr_decay)
  float weight_decay;  // of decayed slices: L2, added to the gradient (SGD, Adagrad), or
                       // decoupled, p *= 1 - lr weight_decay (Lion)
  float beta1, beta2;  // SGD: momentum and 1 - dampening; Lion: its betas
  float eps;           // Adagrad
  float first;         // SGD: 1 on the first update, whose momentum buffer is the gradient
  float nesterov;      // SGD: 1 for Nesterov momentum
};
constexpr int kElementwiseScalarsSize = int(sizeof(ElementwiseScalars) / sizeof(float));

// One parameter range of an element-wise update. state (F32, the parameter's shape) is
// SGD's momentum buffer, Adagrad's sum of squares or Lion's exp_avg; empty for SGD without
// momentum. half: as AdamWSlice's.
struct ElementwiseSlice {
  Tensor param, grad, state;
  bool decay = false;
  Tensor half;
};

// transformers' Adafactor as Trainer builds it (relative_step and scale_parameter off): what
// one update of one parameter tensor reads from the backend's memory.
struct AdafactorScalars {
  float lr;
  float beta2t;          // 1 - step^decay_rate
  float eps1;            // eps[0], added to the squared gradient
  float clip_threshold;  // of the update's RMS
  float beta1;           // of the first moment, when there is one
  float weight_decay;    // of decayed tensors: p -= p * weight_decay * lr
};
constexpr int kAdafactorScalarsSize = int(sizeof(AdafactorScalars) / sizeof(float));

// One parameter tensor of an Adafactor update. A matrix (rows > 1 in BERT's rank-2
// tensors) keeps the factored second moment row [rows] and col [cols]; a vector (rows
// == 1) keeps v [cols]. m is the first moment (empty without beta1); half as AdamWSlice's.
struct AdafactorTensor {
  Tensor param, grad;  // F32 [rows * cols]
  int64_t rows = 1, cols = 0;
  bool factored = false;
  Tensor row, col, v, m;
  bool decay = false;
  Tensor half;
};
// bitsandbytes' blockwise 8-bit optimizers (see optim_8bit): AdamW keeps two states, Lion one.
enum class Optim8bitAlgo : uint8_t { AdamW, Lion };

// One parameter tensor of an optim_8bit update (bitsandbytes quantizes each tensor on its
// own, so blocks start at its first element). param and grad are F32 [n]; half as in
// AdamWSlice. A quantized tensor keeps U8 codes [n] and F32 absmax [ceil(n / 256)] per
// state; a 32-bit one (fewer than 4096 elements) F32 states [n] and no absmax. state2 and
// absmax2: AdamW only.
struct Optim8bitSlice {
  Tensor param, grad, half;
  bool decay = false;  // takes the step's weight decay
  Tensor state1, state2, absmax1, absmax2;
};

// The per-update values bitsandbytes' kernels derive from their float arguments, computed
// on the host (optim_8bit_scalars) and read from the backend's memory when the op runs.
struct Optim8bitScalars {
  float lr;
  float step_size;  // AdamW: -lr * sqrt(1 - beta2^step) / (1 - beta1^step)
  float eps_c2;     // AdamW: eps * sqrt(1 - beta2^step)
  float b1, w1, b2, w2;  // beta1, 1 - beta1, beta2, 1 - beta2
  float decay;      // 1 - lr * weight_decay
};
constexpr int kOptim8bitScalarsSize = int(sizeof(Optim8bitScalars) / sizeof(float));
Optim8bitScalars optim_8bit_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                    int64_t step);

// Dynamic loss scaling for fp16, as torch.amp.GradScaler: the scale grows by
// growth_factor after growth_interval consecutive steps with finite gradients and is
// multiplied by backoff_factor after a step whose gradients hold an inf or NaN (that step
// is skipped). The state lives on the device (see clip_coefficient), so the step never
// waits on the host.
struct LossScaling {
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;
};
constexpr int kNormCoefSize = 3;  // F32 [3]: see clip_coefficient
constexpr int kScalerSize = 2;    // F32 [2]: scale, clean steps since the scale last changed

// Tensors per multi-tensor backend call; the ops wrappers split longer lists.
constexpr int kMaxTensorList = 48;

class OpProfiler;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Whether the tensors stay F32 under --bf16 and the products round their operands to
  // bf16 instead (the CPU's bf16, cpu_bf16_products.h).
  virtual bool bf16_products() const { return false; }

  // While set, the ops.h wrappers check shapes and return without computing: the
  // memory planner runs the real training code this way.
  bool dry_run = false;
  // While set, the ops.h wrappers report each op they dispatch to it (hone profile).
  OpProfiler* profiler = nullptr;

 protected:
  SpanSeconds span_seconds_{};  // accumulated since the last take_span_seconds
  StepSpan span_ = StepSpan::Other;

  // What mark() does besides telling the profiler.
  virtual void record_mark(StepSpan s);

 private:
  std::chrono::steady_clock::time_point span_start_{};
  bool span_started_ = false;
  std::vector<std::chrono::steady_clock::time_point> stamps_;

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
  // Blocks until every copy to host memory queued so far has landed (into page-locked
  // memory from allocate_host such copies are asynchronous on a GPU).
  virtual void wait_for_reads() {}

  // Inputs copied ahead of the step that reads them (on a second stream on a GPU). stage()
  // copies host memory (page-locked from allocate_host; other memory is copied before the
  // call returns) into a staging buffer without waiting for the work in flight, only for
  // the last take_staged() before it. take_staged() queues, on the compute stream, a copy
  // of a staging buffer into the buffer the step reads, once the staged copies have landed.
  virtual void stage(const Tensor& host, Tensor& staging) { copy(host, staging); }
  virtual void take_staged(const Tensor& staging, Tensor& dst) { copy(staging, dst); }

  // Transfers beside the compute stream, for an offloaded optimizer (a GPU's copy engines,
  // one stream each way; the CPU copies before returning). Each starts once the work queued
  // on the compute stream so far is done, copies between page-locked host memory
  // (allocate_host) and this backend's, and returns a ticket: wait_transfer() blocks the
  // host until that transfer has landed; compute_waits_for() makes the compute stream's
  // later work wait for it. A ticket stays valid for kTransferTickets later transfers.
  struct Transfer {
    int64_t id = -1;  // -1: already done
  };
  static constexpr int kTransferTickets = 256;
  virtual Transfer transfer_to_host(const Tensor& src, Tensor& host_dst);
  virtual Transfer transfer_to_device(const Tensor& host_src, Tensor& dst);
  virtual void wait_transfer(Transfer) {}
  virtual void compute_waits_for(Transfer) {}

  // Recorded steps (CUDA graphs). Between begin_recording() and end_recording() the ops
  // queued are recorded, not run, and each mark() starts a new segment, so that a replay
  // marks the same spans. replay() runs a recording: its ops read and write the addresses
  // they were given (the memory plan keeps them fixed) and whatever values those hold
  // then, so per-step values must live in memory (DropoutSpec::step, AdamWStep::scalars).
  // A recording lives as long as the backend. Host reads recorded are awaited by
  // wait_for_reads() after a replay as after eager ops.
  virtual bool can_record() const { return false; }
  virtual void begin_recording();
  virtual int end_recording();  // the recording's id
  virtual void abort_recording() noexcept {}  // after an error while recording: drops it
  virtual void replay(int recording);
  virtual void free_recording(int) noexcept {}  // a recording no longer wanted

  // Step timing, for the summary's time split: the wall clock between marks on the CPU;
  // events on the stream on a GPU, read without stalling it. No-ops in a dry run. A
  // profiler attached learns the phase too.
  void mark(StepSpan s);
  // Seconds in each span since the last call; waits for queued work first.
  virtual SpanSeconds take_span_seconds();
  // Waits for queued work (a no-op on the CPU); used before host reads and timing.
  virtual void synchronize() {}

  // Op timing (hone profile): stamp() notes the time at this point of the queued work (an
  // event on a GPU's stream, the clock on the CPU); take_stamps() waits for the work and
  // returns each stamp's seconds since the first, then forgets them.
  virtual void stamp();
  virtual std::vector<double> take_stamps();
  // Named ranges for an outside profiler (NVTX on a GPU, which Nsight Systems shows); none
  // on the CPU.
  virtual void push_range(const char*) {}
  virtual void pop_range() {}

  virtual void fill(Tensor& x, float value) = 0;  // F32, BF16 or F16 (value rounded to nearest even)
  // F32: elements 2k and 2k + 1 = normal_pair(seed, stream, k, std) (hone/normal.h), the
  // same bits on every backend.
  virtual void fill_normal(Tensor& x, float std, uint64_t seed, uint64_t stream) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // bytewise, src.bytes() == dst.bytes()
  // The first n values of an F32, BF16 or F16 tensor to host floats.
  virtual void read(const Tensor& src, float* host, size_t n) = 0;
  // dst = src rounded to dst's dtype (F32 -> F32, BF16 or F16; round to nearest even), same size.
  virtual void cast(const Tensor& src, Tensor& dst) = 0;
  virtual void add_scaled(const Tensor& x, float alpha, Tensor& y) = 0;  // y += alpha * x

  // y[M,N] = x[M,K] w[N,K]^T + b[N]   (b may be null)
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) = 0;
  // A product split over k, for few rows (CUDA: small inference batches), whose sum
  // parts_add_layernorm_forward takes in place of a split-k product's own reduction pass:
  // parts [S, M, N] F32, parts[s] = x[:, s*K/S, (s+1)*K/S) w[:, same]^T, S dividing K.
  virtual void linear_split_forward(const Tensor& x, const Tensor& w, Tensor& parts) = 0;
  // The slices of k that linear_split_forward should take for [M, N] = [M, K] [N, K]^T in
  // dtype t: 1 where the backend's plain product serves best (every product on the CPU).
  virtual int linear_splits(int64_t m, int64_t n, int64_t k, DType t) const { return 1; }
  // The row counts M up to max_rows at which the first [M, N] = [M, K] [N, K]^T product in
  // dtype t chooses its algorithm by timing candidates (CUDA: half precision, where the
  // backend times products), one for each group of counts that shares that choice: what a
  // run should see once before it answers requests (TrainingRun::warm_up_inference). None on
  // the CPU.
  virtual std::vector<int64_t> timed_row_counts(int64_t max_rows, int64_t n, int64_t k, DType t) const { return {}; }
  // dx[M,K] = dy[M,N] w (added to dx when accumulate_dx); dw += dy^T x; db += column sums of dy.
  // dx and db may be null.
  virtual void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                               Tensor& dw, Tensor* db) = 0;
  // A product and the activation after it, for a transformer's feed-forward block:
  //   forward:  pre = x w^T + b, y = act(pre); pre empty (no data) when nothing keeps it
  //             (inference): y alone;
  //   backward of out = linear(act(pre)) with weights w, recomputing the activation rather
  //             than keeping it: y = act(pre), dpre = (dy w) * act'(pre), dw += dy^T y,
  //             db += column sums of dy, and db_pre (the bias gradient of the product
  //             that made pre) += column sums of dpre, taken while the pass over pre
  //             holds dpre rather than read again.
  // The CUDA backend computes the activation in the product's epilogue where cuBLASLt has
  // it (GeluTanh: its GELU is the tanh form), and BERT's erf GELU in hone's Hopper product
  // when pre is not kept (hopper_gemm.h); otherwise it runs the products unfused, and in
  // backward y and dpre come from one pass over pre. On the CPU these are the unfused ops
  // in sequence. b, db and db_pre may be null.
  virtual void linear_activation_forward(Activation a, const Tensor& x, const Tensor& w, const Tensor* b,
                                         Tensor& pre, Tensor& y) = 0;
  virtual void activation_linear_backward(Activation a, const Tensor& dy, const Tensor& pre, const Tensor& w,
                                          Tensor& y, Tensor& dpre, Tensor& dw, Tensor* db, Tensor* db_pre) = 0;

  // qkv: [B*S, 3H], Q in columns [0,H), K in [H,2H), V in [2H,3H), head h in columns
  // h*head_dim.. of each. mask: I32 [B,S], 1 = attend, 0 = padding (adds the float
  // minimum to the score, as Hugging Face does). ctx: [B*S, H] = dropout(P) V with
  // P = softmax(scale Q K^T + mask), over the keys within d.window of the query when
  // d.window >= 0 (the others' probability is exactly 0; a padded key inside the window
  // adds the float minimum as above). No [S, S] matrix outlives the call: stats
  // [B, heads, S, 2] keeps, per query row, the maximum of its masked scores and the
  // reciprocal of its sum of exponentials, from which backward recomputes P bit for bit
  // (P = exp(score - max) * inv, the forward's own arithmetic).
  // keep: I32 [B, heads, S, attention_keep_words(d, dtype)] receives the dropout mask
  // as bits when the backend keeps it for backward (p > 0 and a nonzero word count; with a
  // window, only the bits of keys within it and the sequence are defined); otherwise it is
  // not read and may be empty.
  virtual void attention_forward(const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                                 const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx,
                                 Tensor& workspace) = 0;
  // dqkv: [B*S, 3H] (overwritten). ctx is the forward's output, which the fused backward
  // reads (rowsum(dctx * ctx)) rather than recomputing it; keep, the forward's mask bits.
  virtual void attention_backward(const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& mask,
                                  const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                                  const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) = 0;
  // 32-bit words of dropout keep bits per query row that attention_forward saves for
  // attention_backward in this compute dtype; 0 when backward draws the mask again.
  virtual int attention_keep_words(const AttentionDims&, DType) const { return 0; }
  // Scratch the attention ops need for this compute dtype, in F32 elements (planned as
  // workspace, shared by layers). Under BF16/F16 the CUDA backend runs a fused (flash)
  // attention whose stats hold, per query row, the maximum in base-2 units (scale q.k
  // log2 e) and the reciprocal of the sum of exp2(x - max); with HONE_ATTENTION=cudnn it
  // runs cuDNN's, which needs right-padded masks (ones, then zeros) and keeps, in the
  // first B*heads*S floats of stats, the log-sum-exp of each query row.
  virtual int64_t attention_workspace_elems(const AttentionDims& d, DType t) const = 0;
  // Whether attention in this compute dtype takes each row's length rather than its mask,
  // so that masks must be right-padded (cuDNN's, under HONE_ATTENTION=cudnn).
  virtual bool attention_needs_right_padding(DType t) const { return false; }

  // Over the last dimension: y = (x - mean) * rstd * gamma + beta; mean, rstd: [rows].
  // beta may be empty (a LayerNorm without bias, ModernBERT's), and then so is dbeta.
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                 Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) = 0;
  // A transformer's residual LayerNorm, fused so that the [rows, cols] sum is read and
  // written once and one launch replaces two. Bit for bit the unfused pair:
  //   forward:  dropout_add(x, residual, d, sum), then layernorm_forward on the stored sum;
  //   backward: layernorm_backward(dy, sum, ...) into dsum (the residual's gradient), then
  //             dropout(dsum, d, dx) (the gradient of x); dgamma and dbeta accumulate.
  // sum may alias x, and dx may alias dy (BERT writes in place so); no other overlap. An
  // empty sum (no data) is not written: inference, where no backward reads it.
  virtual void dropout_add_layernorm_forward(const Tensor& x, const Tensor& residual, const DropoutSpec& d,
                                             const Tensor& gamma, const Tensor& beta, float eps, Tensor& sum,
                                             Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  // Inference's residual LayerNorm after a split product: y = LN(residual + out), where
  // out = (sum over s of parts[s]) + b, rounded to y's dtype as linear_forward stores its
  // output; parts [S, rows, cols] F32 (linear_split_forward's), b [cols] (may be null).
  virtual void parts_add_layernorm_forward(const Tensor& parts, const Tensor* b, const Tensor& residual,
                                           const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                           Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_dropout_backward(const Tensor& dy, const Tensor& sum, const Tensor& gamma,
                                          const Tensor& mean, const Tensor& rstd, const DropoutSpec& d, Tensor& dsum,
                                          Tensor& dx, Tensor& dgamma, Tensor& dbeta) = 0;

  virtual void activation_forward(Activation a, const Tensor& x, Tensor& y) = 0;
  // dx = dy * act'(x); dx may alias dy.
  virtual void activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) = 0;
  // A gated linear unit (ModernBERT's GeGLU): x [rows, 2I] holds the input u in columns
  // [0, I) and the gate v in [I, 2I); y [rows, I] = act(u) * v. Backward: dx [rows, 2I]
  // = (dy * v * act'(u), dy * act(u)).
  virtual void gated_activation_forward(Activation a, const Tensor& x, Tensor& y) = 0;
  virtual void gated_activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) = 0;
  virtual void tanh_forward(const Tensor& x, Tensor& y) = 0;
  virtual void tanh_backward(const Tensor& dy, const Tensor& y, Tensor& dx) = 0;  // from the output y
  // y = dropout(x); also its own backward (same spec, applied to dy). y may alias x.
  virtual void dropout(const Tensor& x, const DropoutSpec& d, Tensor& y) = 0;
  // out = residual + dropout(x); out may alias either input.
  virtual void dropout_add(const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out) = 0;

  // ids, types, positions: I32 [B*S]; out[t] = word[ids[t]] + pos[positions[t]] + type[types[t]].
  // An empty positions tensor means t % S; empty types, type 0; an empty type table, no
  // type term (families without token types).
  virtual void embedding_forward(const Tensor& ids, const Tensor& types, const Tensor& positions, const Tensor& word,
                                 const Tensor& pos, const Tensor& type, int seq, Tensor& out) = 0;
  virtual void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& types, const Tensor& positions,
                                  int seq, Tensor& dword, Tensor& dpos, Tensor& dtype) = 0;
  // RoBERTa's position ids: for each row of S ids, pad + the count of ids other than pad up
  // to and including this one, and pad itself where the id is pad. ids, out: I32 [B*S].
  virtual void position_ids_after_padding(const Tensor& ids, int32_t pad, int seq, Tensor& out) = 0;
  // Rotary position embeddings (RoFormer's, as ModernBERT applies them) on the query and
  // key columns of qkv [T, 3H], in place, heads of head_dim d: in each head, elements i and
  // i + d/2 (i < d/2) turn by the angle pos * theta^(-2i/d):
  //   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin);
  // inverse turns by the negative angle, which is also the backward. Token t's position is
  // t % seq, or rows[t] % seq when rows (I32 [T], each token's row in the padded layout of
  // packed inference) is given. The angle is float arithmetic as transformers', cos and sin
  // F32 whatever the storage type.
  virtual void rotary(Tensor& qkv, const Tensor& rows, int seq, int heads, int head_dim, float theta,
                      bool inverse) = 0;
  // The mean of each sequence's attended tokens: out[b] = sum over s of mask[b, s] *
  // hidden[b*S + s], divided by the count of ones (a row without one gives 0). Backward:
  // dhidden[b*S + s] = mask[b, s] * dout[b] / count, 0 at padding. mask: I32 [B, S].
  virtual void mean_pool_forward(const Tensor& hidden, const Tensor& mask, Tensor& out) = 0;
  virtual void mean_pool_backward(const Tensor& dout, const Tensor& mask, Tensor& dhidden) = 0;
  // Packed inference's mean pooling: out[b] = the mean of rows row_start[b] ..
  // row_start[b + 1] - 1 of hidden [T, H] (row_start: I32 [B + 1] in this backend's memory).
  virtual void mean_pool_packed(const Tensor& hidden, const Tensor& row_start, Tensor& out) = 0;
  // out[b] = hidden[b*S]  (the [CLS] rows); scatter writes dhidden = 0 except those rows.
  virtual void gather_first_tokens(const Tensor& hidden, int seq, Tensor& out) = 0;
  virtual void scatter_first_tokens(const Tensor& dout, int seq, Tensor& dhidden) = 0;
  // dst[i] = src[rows[i]] for whole rows: src [N, W], rows I32 [n] (each in [0, N)), dst [n, W].
  virtual void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) = 0;
  // Its inverse: dst[rows[i]] = src[i] and every other row of dst zero (src [n, W], rows
  // distinct, dst [N, W]): packed rows back in the padded layout.
  virtual void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) = 0;

  // Packed sequences: qkv [T, 3H] holds sequence b in rows row_start[b] .. row_start[b + 1]
  // - 1 (row_start: I32 [B + 1] in this backend's memory, from 0 to T), each attending to
  // all of its own tokens and no other (with d.window >= 0, to those within the window,
  // positions counted from the sequence's start); ctx [T, H] as attention_forward's. d.batch
  // = B, d.seq = S, at least the longest sequence (the workspace is
  // attention_workspace_elems(d)). Training passes dropout, stats and keep as
  // attention_forward's, in the padded layout of d (sequence b's row i at position i): the
  // results, statistics and dropout masks are then those of attention_forward on the padded
  // batch whose sequence b attends to positions 0 .. len_b - 1, at the rows it attends;
  // the statistics of rows past a sequence are not written, nor need the keep bits of its
  // rows or keys past it be. Inference passes no dropout and
  // empty stats and keep: nothing is kept for a backward.
  virtual void attention_forward_packed(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                                        const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx,
                                        Tensor& workspace) = 0;
  // The backward of a training attention_forward_packed: dqkv [T, 3H] (overwritten).
  virtual void attention_backward_packed(const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                         const Tensor& row_start, const Tensor& stats, const Tensor& keep,
                                         const AttentionDims& d, const DropoutSpec& drop, Tensor& dqkv,
                                         Tensor& workspace) = 0;
  // Whether attention_forward_packed runs these dims in this compute dtype for inference.
  virtual bool packs_attention(const AttentionDims& d, DType t) const = 0;
  // Whether packed training runs attention on the packed rows in this compute dtype
  // (attention_forward_packed with stats, attention_backward_packed), rather than in the
  // padded layout through row copies.
  virtual bool packs_training_attention(const AttentionDims&, DType) const { return false; }
  // Whether training may run a batch's attended tokens alone (the model's packed training:
  // products, norms and element-wise ops on the packed rows; attention too where
  // packs_training_attention says so, else in the padded layout). A backend that records
  // steps packs only runs whose steps are too large for recording to pay
  // (TrainingRun::kPackedTrainingTokens).
  virtual bool packs_training() const { return false; }

  // Mean loss over the batch into loss[0] (F32) and its gradient times grad_scale into
  // dlogits, also times loss_scale[0] when loss_scale (the F32 scaler state) is given.
  // cross_entropy: labels I32 [B], -100 = ignored (as PyTorch); mse: target F32 [B].
  virtual void cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, const Tensor* loss_scale,
                             Tensor& loss, Tensor& dlogits) = 0;
  virtual void mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor* loss_scale,
                   Tensor& loss, Tensor& dpred) = 0;

  // out[0] += sum of x^2 over every tensor of the list (count <= kMaxTensorList): one
  // launch for all parameter groups.
  virtual void sum_squares(const Tensor* xs, int count, Tensor& out) = 0;
  // From sumsq[0] of sum_squares, with scale = scaler[0] when a scaler is given, else 1:
  //   norm_coef[0] = sqrt(sumsq) / scale, the norm of the unscaled gradients;
  //   norm_coef[1] = min(1, max_norm / (norm + 1e-6)) / scale, as torch.nn.utils.clip_grad_norm_
  //                  after GradScaler.unscale_ (min(1, ...) is 1 if max_norm <= 0): what AdamW
  //                  multiplies the gradients by;
  //   norm_coef[2] = 1 if a scaler is given and sumsq is not finite (the step is skipped), else 0.
  // Then, with a scaler, updates it as LossScaling says (after computing the above).
  virtual void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm_coef, Tensor* scaler,
                                const LossScaling& ls) = 0;
  // torch.optim.AdamW on grad * norm_coef[1], for every slice of the list (count <=
  // kMaxTensorList), each with its own weight decay (s.weight_decay is not used); nothing
  // changes when norm_coef[2] != 0. At step 1 the moments are zero, as torch's state
  // starts: a backend may write them without reading them (AdamWScalars::first).
  virtual void adamw(const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef) = 0;
  // The element-wise optimizer `kind` on grad * norm_coef[1], for every slice of the list
  // (count <= kMaxTensorList), with the ElementwiseScalars in `scalars` (F32
  // [kElementwiseScalarsSize]); nothing changes when norm_coef[2] != 0.
  virtual void elementwise_optimizer(ElementwiseOptimizer kind, const ElementwiseSlice* slices, int count,
                                     const Tensor& scalars, const Tensor& norm_coef) = 0;
  // Adafactor's update of one tensor on grad * norm_coef[1], with the AdafactorScalars in
  // `scalars` (F32 [kAdafactorScalarsSize]); nothing changes when norm_coef[2] != 0:
  //   u = g^2 + eps1; factored: row = beta2t row + (1 - beta2t) mean over columns of u,
  //   col likewise over rows, u = g / sqrt(row / mean(row)) / sqrt(col); else
  //   v = beta2t v + (1 - beta2t) u, u = g / sqrt(v); u *= lr / max(1, rms(u) / clip);
  //   with m: m = beta1 m + (1 - beta1) u, u = m; p -= p * weight_decay * lr; p -= u.
  // workspace: F32 [adafactor_workspace_elems(rows, cols)], scratch for the reductions.
  virtual void adafactor(const AdafactorTensor& t, const Tensor& scalars, const Tensor& norm_coef,
                         Tensor& workspace) = 0;
  virtual int64_t adafactor_workspace_elems(int64_t rows, int64_t cols) const = 0;
  // bitsandbytes' AdamW or Lion with optim_bits=8 (blockwise, 256 elements a block) on
  // grad * norm_coef[1], for every slice of the list (count <= kMaxTensorList); nothing
  // changes when norm_coef[2] != 0. scalars: F32 [kOptim8bitScalarsSize]
  // (Optim8bitScalars); qmaps: F32 [256] per state, the signed dynamic map then (AdamW)
  // the unsigned one.
  virtual void optim_8bit(Optim8bitAlgo algo, const Optim8bitSlice* slices, int count, const Tensor& scalars,
                          const Tensor& qmaps, const Tensor& norm_coef) = 0;
};

}  // namespace hone
