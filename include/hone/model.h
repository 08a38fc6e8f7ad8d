#pragma once
// An encoder for sequence classification as transformers defines it for BERT and the
// families that share its blocks (hone/family.h: RoBERTa, XLM-RoBERTa, DistilBERT,
// ELECTRA), written as calls to ops. The family names the parameters and chooses the
// embeddings' inputs and the head; the layers are the same code for all. ModernBERT's
// pre-norm layers (rotary, GeGLU, local attention) are a second layer body over the same
// buffers and policies (src/model/prenorm_layer.cpp).
// All parameters live in one flat buffer (and so do the optimizer moments), in groups:
// the embeddings, each encoder layer, the classification head. Within a group the
// weight-decayed parameters come first, so AdamW runs as two calls per group over
// contiguous memory. A group's gradients are one buffer, which lets a run place them in
// activation memory that backward has just freed. Query, key and value weights are
// adjacent, so the three projections run as one [3H, H] matrix product.
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hone/backend.h"
#include "hone/config.h"
#include "hone/family.h"
#include "hone/memory.h"

namespace hone {

// What a parameter is, which sets its initialisation and weight decay.
enum class ParamKind : uint8_t { Embedding, Weight, Bias, NormWeight, NormBias };

// One parameter under its Hugging Face name, as a slice of the flat buffers.
struct ParamEntry {
  std::string name;  // e.g. "bert.encoder.layer.0.attention.self.query.weight"
  Shape shape;
  int64_t offset = 0;  // in elements
  bool decay = false;  // weight decay applies (not a bias, not a LayerNorm parameter)
  int group = 0;       // 0 embeddings, 1 + l encoder layer l, L + 1 the classification head
  ParamKind kind = ParamKind::Weight;
  int64_t zero_row = -1;  // an embedding's padding row, zero at initialisation; -1: none
  float init_std = 0.0f;  // a weight's initial standard deviation; 0: initializer_range
};

// A contiguous range of the flat buffers: [begin, decayed_end) takes weight decay.
struct ParamGroup {
  int64_t begin = 0, decayed_end = 0, end = 0;
  int64_t size() const { return end - begin; }
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& c);
  const std::vector<ParamEntry>& entries() const { return entries_; }  // transformers' order
  const ParamEntry* find(const std::string& name) const;
  const ParamEntry& at(const std::string& name) const;
  int64_t count() const { return count_; }  // all parameters
  // The embedding tables come first in the flat buffers: [0, tables_end). Mixed precision
  // reads them from the master weights, so they have no half-precision copy.
  int64_t tables_end() const { return tables_end_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Groups [first, end) alone, as a layout of their own: offsets from the first group's
  // begin, groups numbered from 0 (a ZeRO rank's shard, whose optimizer sees only it).
  ParamLayout shard(int first, int end) const;

 private:
  ParamLayout() = default;
  std::vector<ParamEntry> entries_;
  std::vector<ParamGroup> groups_;
  int64_t count_ = 0;
  int64_t tables_end_ = 0;
};

// The batch as the model reads it; I32 ids [B*S]; labels I32 [B] or, for regression, F32 [B].
struct BatchTensors {
  int batch = 0, seq = 0;
  Tensor input_ids, attention_mask, token_type_ids, labels;
  // Packed (tokens > 0): the encoder runs on the batch's `tokens` attended tokens alone,
  // packed row after row: packed_rows (I32 [tokens]) holds each one's row in the padded
  // [batch * seq] layout, row_start (I32 [batch + 1]) where each sequence starts. Training
  // may pack every row of a batch (tokens = batch * seq) whose mask it cannot pack.
  int64_t tokens = 0;
  Tensor packed_rows, row_start;
  const int32_t* host_row_start = nullptr;  // row_start's values on the host, for counting work
};

// Counter-based dropout state of one micro-step: every call site derives its stream
// from (step, site), so masks never repeat across steps and the backward pass
// regenerates the forward masks instead of storing them. The step is read from a counter
// in the backend's memory (DropoutSpec::step), so that a recorded step can be replayed.
struct DropoutState {
  uint64_t seed = 0;
  bool training = true;                  // false: dropout is off (inference, golden tests)
  const int64_t* step_counter = nullptr;  // needed when training
};

// Gradient checkpointing: what each encoder layer keeps from its forward pass for its
// backward pass. Backward recomputes the rest with the same ops and dropout streams (the
// masks come from (step, site)), so the gradients are those of a run that keeps it all.
// Per token and layer, in values of the compute dtype (BERT: I = 4H), besides the row
// statistics:
enum class Checkpointing : uint8_t {
  // Everything backward reads: qkv (3H), the attention context, ln1_in, ln1_out, ln2_in
  // and the layer's output (H each), ffn_pre (I). 8H + I. (Pre-norm layers: qkv, context,
  // attention norm, ln1_in, ln1_out and output, ffn_pre 2I: 8H + 2I.)
  None,
  // The layer's input alone (H): backward reruns the layer just before its own backward.
  // What Trainer's --gradient_checkpointing does.
  Full,
  // The products' outputs, costly to recompute: qkv, ln1_in (the attention projection's
  // residual sum), ffn_pre, ln2_in, and the row statistics. 5H + I. Backward recomputes the
  // attention context from qkv (attention alone, no product) and the LayerNorm outputs
  // ln1_out and the layer's input (the previous layer's output, from its ln2_in) just
  // before it reads them. The first layer's input, the embeddings' output, is kept.
  // Pre-norm layers keep their output (the residual stream) and recompute the attention
  // context and both LayerNorm outputs.
  Selective,
};

// Host destinations of an inference pass; each may be null.
struct ForwardOutputs {
  float* logits = nullptr;             // [B, num_labels]
  float* last_hidden_state = nullptr;  // [B, S, hidden]
  float* pooled = nullptr;             // [B, hidden], the pooler's output
  // A host tensor (page-locked, of the logits' dtype, [B, num_labels] or more rows) that
  // receives the logits by an asynchronous copy, which a CUDA graph can record.
  const Tensor* logits_copy = nullptr;
};

class SequenceClassifier {
 public:
  explicit SequenceClassifier(const ModelConfig& c);
  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  bool regression() const { return regression_; }

  // Takes the flat F32 parameter buffer (setup phase) and one flat F32 gradient buffer for
  // the groups whose gradients persist between micro-steps (persistent_grads, a contiguous
  // run of groups), whose grad(k) are slices of it; the other groups' gradients are
  // step-scoped, taken in backward (take_grads) and released after the update. With a
  // half-precision compute dtype the parameters are the master weights and forward and
  // backward read a copy in that dtype (Category::Weights), which the optimizer rewrites.
  // master: where those master weights live (Category::HostMasterWeights when the
  // optimizer is offloaded to the host). Without keep_master (a run that only infers), a
  // mixed-precision model keeps its weights in the compute dtype alone.
  struct GroupRange {
    int first = 0, end = 0;  // [first, end)
    bool contains(int k) const { return k >= first && k < end; }
  };
  void bind_parameters(BufferSource& mem, GroupRange persistent_grads, DType compute = DType::F32,
                       Category master = Category::MasterWeights, bool keep_master = true);
  Tensor& weights() { return weights_; }  // the F32 parameters (empty: none kept)
  // What forward and backward read: the parameters, or their half-precision copy. The copy
  // holds parameters [half_begin(), count): where the master weights are kept (on this
  // device, or offloaded to the host), the embedding lookup reads its tables from them (as
  // autocast does), which spares a copy of the largest tables (XLM-RoBERTa's: 46% of its
  // parameters). Sharded master weights and runs that only infer keep the whole copy.
  const Tensor& compute_weights() const { return mixed() ? half_weights_ : weights_; }
  Tensor& compute_weights() { return mixed() ? half_weights_ : weights_; }
  int64_t half_begin() const { return half_begin_; }
  // Rounds the master weights into the half copy, after they were written.
  void round_weights(Backend& be);
  DType compute_dtype() const { return compute_; }
  bool mixed() const { return compute_ != DType::F32; }
  // What training keeps for backward; set before the run is planned (the plan records it).
  void set_checkpointing(Checkpointing c) { checkpointing_ = c; }
  Checkpointing checkpointing() const { return checkpointing_; }
  // The gradients of parameter group k (valid from its backward to the optimizer step
  // when step-scoped).
  Tensor& grad(int k) { return group_grads_[size_t(k)]; }
  int num_groups() const { return int(layout_.groups().size()); }
  // Step-scoped gradients: hands every group's buffer back (after the optimizer step).
  void release_grads(BufferSource& mem);
  // Called as each group's gradients are final in backward (the head's first, the
  // embeddings' last): an offloaded optimizer sends them to the host there and, when they
  // are step-scoped, releases them (release_grads then skips a released group).
  using GroupGradsDone = std::function<void(Backend&, BufferSource&, int group)>;
  void on_group_grads_done(GroupGradsDone f) { group_done_ = std::move(f); }
  Tensor param(const Tensor& flat, const ParamEntry& e) const { return slice(flat, e.offset, e.shape); }

  // Forward and backward of one micro-batch. Parameter gradients accumulate (+=);
  // loss[0] receives the mean loss; dlogits are scaled by grad_scale (1 / accumulation
  // steps) and by loss_scale[0] when given (fp16 loss scaling). If logits_out is not
  // null, the logits are copied there (host, B x labels).
  void forward_backward(Backend& be, BufferSource& mem, const BatchTensors& batch, const DropoutState& drop,
                        float grad_scale, const Tensor* loss_scale, Tensor& loss, float* logits_out = nullptr);
  // Model FLOPs of one training step on batch x seq tokens: 3x the forward pass (backward
  // costs two), counting 2 per multiply-add of every product. Per token and layer:
  // 2(4H^2 + 2HI) for the projections and the FFN, 4SH for attention scores and context;
  // per token the embeddings' projection (ELECTRA); per sequence the head. Recomputation is not model work and is not
  // counted, which is what makes the utilisation "model" FLOPs utilisation (MFU).
  double training_flops(int batch, int seq) const;
  // The same over a batch's attended tokens (mask [batch, seq], nonzero = attended), each
  // row a sequence of its own length: the work a packed step does; a padded step's padding
  // is not model work either.
  double training_flops(const int32_t* mask, int batch, int seq) const;
  // Inference: the same forward pass without dropout, keeping nothing for a backward
  // pass (each layer's buffers are released once the next layer has read them).
  void forward(Backend& be, BufferSource& mem, const BatchTensors& batch, const ForwardOutputs& out);

 private:
  struct Linear { const ParamEntry *w, *b; };  // b null: no bias
  struct Norm { const ParamEntry *g, *b; };
  // The buffers of a residual LayerNorm after a product: its sum (training), statistics
  // and output.
  struct ResidualNormNames { const char *sum, *mean, *rstd, *out; };
  // Post-norm: ln1 after attention, ln2 after the FFN. Pre-norm: attn_norm on the input
  // (g null in the first layer), ln1 on the FFN's input; ln2 unused.
  struct Layer { Linear qkv, attn_out, ffn_up, ffn_down; Norm ln1, ln2, attn_norm; };
  // What one layer's forward produces; backward reads all but `out` (the next layer's
  // input), unless checkpointing recomputes it. Dropout masks are regenerated by backward
  // from the same Philox streams, except attention's where the backend keeps its bits
  // (attn_keep, 1 bit per probability; empty otherwise).
  // Pre-norm layers: attn_norm_* the input's LayerNorm (none in the first layer), ln1_in
  // the sum after attention and ln1_out its LayerNorm (the FFN's input), ffn_pre the
  // GeGLU's input [T, 2I], out the sum after the FFN; ln2_* unused.
  struct Saved {
    Tensor qkv, attn_stats, attn_keep, ctx, ln1_in, ln1_mean, ln1_rstd, ln1_out, ffn_pre, ln2_in, ln2_mean, ln2_rstd,
        attn_norm_out, attn_norm_mean, attn_norm_rstd, out;
    std::array<Tensor*, 15> for_backward() {
      return {&qkv,    &attn_stats, &attn_keep, &ctx,     &ln1_in,        &ln1_mean,       &ln1_rstd,      &ln1_out,
              &ffn_pre, &ln2_in,    &ln2_mean,  &ln2_rstd, &attn_norm_out, &attn_norm_mean, &attn_norm_rstd};
    }
  };
  // What a layer's forward, backward and recomputation share within one pass over a batch.
  struct Pass {
    const BatchTensors& batch;
    const DropoutState& drop;
    int64_t tokens;  // batch x seq, or the packed batch's tokens
    AttentionDims ad;
    // Packed training: the layers run on the packed rows; attention too where the backend
    // packs training attention (its statistics and dropout masks in the padded layout),
    // else in the padded layout, scattered there and gathered back; mean pooling in the
    // padded layout.
    bool packed_training = false;
    bool packed() const { return batch.tokens > 0; }
    // Packed with every row (a batch without padding, or a mask that cannot be packed):
    // the packed and padded layouts are one.
    bool every_row() const { return tokens == int64_t(ad.batch) * ad.seq; }
  };

  // What backward reads besides the per-layer Saved buffers.
  // emb_norm: the embeddings' LayerNorm output (after dropout) when it is projected into
  // emb_out (ELECTRA), else empty. head_in: the dense layer's input (cls_tok after the
  // head's first dropout; cls_tok itself when the head has none); head_pre: the dense
  // layer's output before a GELU or ReLU (tanh's backward reads its output, pooled).
  // final_*: the pre-norm encoder's last LayerNorm. head_act, head_mean, head_rstd: the
  // activation's output and statistics of a head with a LayerNorm after its activation.
  // cls_tok: the pooled hidden state (the first token's or the mean).
  struct SavedHead {
    Tensor positions, emb_sum, emb_mean, emb_rstd, emb_norm, emb_out, final_out, final_mean, final_rstd, cls_tok,
        head_in, head_pre, head_act, head_mean, head_rstd, pooled, cls_in, logits;
  };
  Activation head_activation() const;  // the head's activation other than tanh
  // The first token's hidden state through the head's dense layer and activation into h.pooled.
  void head_forward(Backend& be, BufferSource& mem, const Pass& p, SavedHead& h);
  // From the gradient of h.pooled (consumed) to that of h.cls_tok.
  void head_backward(Backend& be, BufferSource& mem, const Pass& p, SavedHead& h, Tensor& d_pooled, Tensor& d_tok);
  // The forward pass up to the logits (taken, not released). With keep_for_backward
  // false, layer buffers are released as soon as nothing later reads them.
  SavedHead run_forward(Backend& be, BufferSource& mem, const Pass& p, bool keep_for_backward, float* hidden_out);
  Pass pass(const BatchTensors& batch, const DropoutState& drop, bool training = false) const;
  // Encoder layer l from its input x into saved_[l], taking every buffer: the forward
  // pass and the full recomputation run this one code. Without keep_for_backward nothing
  // keeps the feed-forward product before its activation (ffn_pre stays empty). With
  // first_tokens_only (inference) everything past attention runs on each sequence's first
  // token alone: saved_[l].out is [batch, hidden].
  void layer_forward(Backend& be, BufferSource& mem, const Pass& p, int l, const Tensor& x, bool keep_for_backward,
                     bool first_tokens_only = false);
  // Each sequence's first token of hidden ([tokens, hidden], packed or padded) into out.
  void first_tokens(Backend& be, const Pass& p, const Tensor& hidden, Tensor& out) const;
  // A layer that runs on the first tokens past attention reads their context and residual
  // ([batch, hidden] each, taken here; released by release_first_token_rows).
  struct FirstTokenRows {
    Tensor ctx, x;
  };
  FirstTokenRows first_token_rows(Backend& be, BufferSource& mem, const Pass& p, const Tensor& ctx, const Tensor& x);
  void release_first_token_rows(BufferSource& mem, const FirstTokenRows& rows);
  // After layer l's forward: hands back what nothing reads again (inference) or what
  // backward recomputes (checkpointing).
  void release_unkept(BufferSource& mem, int l, const Tensor& x, bool keep_for_backward);
  // Layer l's backward: dh holds the gradient of its output and receives that of its
  // input x. Recomputes first what the policy did not keep (selective: x itself too).
  void layer_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& x, Tensor& dh);
  // The pre-norm layer body of layer_forward and layer_backward (prenorm_layer.cpp); the
  // backward's runs after layer_backward's full recomputation and take_grads.
  void prenorm_layer_forward(Backend& be, BufferSource& mem, const Pass& p, int l, const Tensor& x,
                             bool first_tokens_only = false);
  void prenorm_layer_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& x, Tensor& dh);
  // Rotary embeddings on layer l's qkv (inverse: on its gradient); nothing without them.
  void rotate(Backend& be, const Pass& p, int l, Tensor& qkv, bool inverse) const;
  // Layer l's attention dims: the pass's, with the layer's window.
  AttentionDims dims(const Pass& p, int l) const {
    AttentionDims d = p.ad;
    d.window = cfg_.attention_window(l);
    return d;
  }
  // Where a layer's attention runs in a pass; its forward and backward both ask this.
  enum class AttentionPath {
    Padded,           // the padded layout (or a batch packed with every row: the layouts are one)
    PackedRows,       // training on the packed rows
    PaddedCopies,     // packed training through the padded layout, scattered and gathered
    PackedInference,  // the packed rows, nothing kept for a backward
  };
  AttentionPath attention_path(const Backend& be, const Pass& p, const AttentionDims& d) const;
  // Attention of layer l from qkv into stats, keep (its dropout bits, when the backend
  // keeps them) and ctx, with its workspace.
  // With first_rows_only, only each sequence's first row of ctx is read afterwards
  // (AttentionDims::first_rows_only).
  void attention(Backend& be, BufferSource& mem, const Pass& p, int l, const Tensor& qkv, Tensor& stats,
                 Tensor& keep, Tensor& ctx, bool first_rows_only = false);
  // Layer l's attention from its saved qkv into saved_[l]'s stats, keep bits and context.
  void saved_attention(Backend& be, BufferSource& mem, const Pass& p, int l, bool first_rows_only = false);
  // Selective checkpointing: layer l's context again, from the kept qkv with the same
  // dropout; the statistics and mask bits it recomputes go to scratch, so that backward
  // reads the forward's own.
  void recompute_context(Backend& be, BufferSource& mem, const Pass& p, int l);
  // Attention's backward from d_ctx (released, with the layer's context, stats and keep
  // bits) into d_qkv.
  void context_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& d_ctx, Tensor& d_qkv);
  // Layer l's attention keep bits (attention_keep_words), or an empty tensor.
  Tensor attention_keep(const Backend& be, BufferSource& mem, const Pass& p, int l, Category c,
                        const char* name) const;
  // Selective checkpointing: LN(sum) as the forward's fused residual LayerNorm wrote it
  // (bit for bit, backend.h), into a new buffer; its statistics are recomputed into
  // scratch, so that backward reads the forward's own.
  Tensor recompute_layernorm(Backend& be, BufferSource& mem, const Tensor& sum, const Norm& n, const char* name,
                             int l);
  // Buffers in the compute dtype (activations and workspace) and row statistics (F32).
  Tensor activation(BufferSource& mem, const char* name, int l, Shape s) const {
    return mem.take(Category::Activations, name, l, compute_, s);
  }
  Tensor row_stats(BufferSource& mem, const char* name, int l, Shape s) const {
    return mem.take(Category::Activations, name, l, DType::F32, s);
  }
  Tensor scratch(BufferSource& mem, const char* name, Shape s) const {
    return mem.take(Category::Workspace, name, -1, compute_, s);
  }
  static Tensor slice(const Tensor& flat, int64_t offset, Shape s);
  // Releases t unless it was never taken (an empty tensor: attention keep bits that the
  // backend does not keep, a first pre-norm layer's attention norm).
  static void release_if_taken(BufferSource& mem, const Tensor& t) {
    if (t.data) mem.release(t);
  }
  Tensor w(const ParamEntry* e) const { return compute_slice(e->offset, e->shape); }
  // What forward reads at offset of the flat layout: an embedding table from the master
  // weights when the half copy starts after it.
  Tensor compute_slice(int64_t offset, Shape s) const {
    return offset < half_begin_ ? slice(weights_, offset, s) : slice(compute_weights(), offset - half_begin_, s);
  }
  // An optional parameter (a bias, or a LayerNorm's beta): empty when absent.
  Tensor opt(const ParamEntry* e) const { return e ? w(e) : Tensor{}; }
  Tensor opt_g(const ParamEntry* e) const { return e ? g(e) : Tensor{}; }
  static const Tensor* ptr(const Tensor& t) { return t.data ? &t : nullptr; }
  static Tensor* ptr(Tensor& t) { return t.data ? &t : nullptr; }
  Tensor g(const ParamEntry* e) const {
    return slice(group_grads_[size_t(e->group)], e->offset - layout_.groups()[size_t(e->group)].begin, e->shape);
  }
  // Query, key and value as one [3H, H] weight and [3H] bias (they are adjacent).
  Tensor w3(const ParamEntry* e, int64_t rows, int64_t cols) const {
    return compute_slice(e->offset, {rows, cols});
  }
  Tensor g3(const ParamEntry* e, int64_t rows, int64_t cols) const {
    return slice(group_grads_[size_t(e->group)], e->offset - layout_.groups()[size_t(e->group)].begin, {rows, cols});
  }
  // A step-scoped group: takes its gradient buffer, zeroed, just before its backward.
  void take_grads(Backend& be, BufferSource& mem, int k);
  void group_grads_done(Backend& be, BufferSource& mem, int k) {
    if (group_done_) group_done_(be, mem, k);
  }
  GroupGradsDone group_done_;
  DropoutSpec dropout(const DropoutState& d, float p, int site) const;
  // Layer l's dropout sites: k = 0 attention probabilities, 1 attention output, 2 FFN output.
  DropoutSpec layer_dropout(const DropoutState& d, int l, int k) const;
  // The head's dropouts: after the activation (k = 0) and on its input (k = 1).
  DropoutSpec head_dropout(const DropoutState& d, int k) const;
  // The batch's token types as the embeddings read them: empty when the family has none.
  Tensor token_types(const BatchTensors& b) const { return type_ ? b.token_type_ids : Tensor{}; }

  ModelConfig cfg_;
  bool regression_;  // cached: resolved_problem_type() builds a string
  ParamLayout layout_;
  const ModelFamily* family_;
  bool pre_norm_;  // the family's layers normalize before their blocks (ModernBERT)
  const ParamEntry *word_, *pos_, *type_;  // type_ null: no token types
  Norm emb_ln_;
  Linear projection_{nullptr, nullptr};  // w null: the embeddings are hidden_size wide
  std::vector<Layer> layers_;
  Linear head_dense_, head_out_;
  Norm head_norm_{nullptr, nullptr}, final_norm_{nullptr, nullptr};  // g null: none
  Tensor weights_;       // F32 parameters (the master weights under mixed precision)
  Tensor half_weights_;  // their compute-dtype copy under mixed precision
  int64_t half_begin_ = 0;  // the flat offset of half_weights_[0]
  DType compute_ = DType::F32;
  GroupRange persistent_grads_;
  Checkpointing checkpointing_ = Checkpointing::None;
  std::vector<Tensor> group_grads_;
  std::vector<Saved> saved_;  // one per layer, refilled by each forward pass
};

}  // namespace hone
