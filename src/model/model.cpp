// The sequence classifier (hone/model.h): the embeddings, the post-norm layer body, the
// head, and the forward and backward passes over them; ModernBERT's pre-norm body is
// src/model/prenorm_layer.cpp, the parameters' layout src/model/layout.cpp.
#include "hone/model.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "hone/ops.h"

namespace hone {

SequenceClassifier::SequenceClassifier(const ModelConfig& c)
    : cfg_(c),
      regression_(c.resolved_problem_type() == "regression"),
      layout_(c),
      family_(&c.family()),
      pre_norm_(c.family().norm == NormPlacement::Pre) {
  HONE_CHECK(3 * c.num_hidden_layers + 2 < (1 << kDropoutSiteBits), "too many layers for the dropout stream layout");
  const ModelFamily& f = *family_;
  auto e = [&](const std::string& n) { return &layout_.at(n); };
  // Biases and LayerNorm betas may be absent (ModernBERT's configs turn them off).
  auto linear = [&](const std::string& p) { return Linear{e(p + ".weight"), layout_.find(p + ".bias")}; };
  auto norm = [&](const std::string& p) { return Norm{e(p + ".weight"), layout_.find(p + ".bias")}; };
  word_ = e(f.embeddings + "." + f.word_table + ".weight");
  pos_ = f.positions == PositionIds::Rotary ? nullptr : e(f.embeddings + ".position_embeddings.weight");
  type_ = f.token_types ? e(f.embeddings + ".token_type_embeddings.weight") : nullptr;
  emb_ln_ = norm(f.embeddings + "." + f.embedding_norm);
  if (c.projects_embeddings()) projection_ = linear(f.projection);
  const int64_t H = c.hidden_size;
  const LayerNames& n = f.layer;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("{}.{}.", f.layer_prefix, l);
    Layer L;
    L.qkv = linear(p + n.query);  // fused, or key and value follow in memory
    if (!n.key.empty())
      HONE_CHECK(e(p + n.value + ".weight")->offset == L.qkv.w->offset + 2 * H * H &&
                     (!L.qkv.b || e(p + n.value + ".bias")->offset == L.qkv.b->offset + 2 * H),
                 "query, key and value are not adjacent");
    L.attn_out = linear(p + n.attention_output);
    L.ffn_up = linear(p + n.ffn_up);
    L.ffn_down = linear(p + n.ffn_down);
    if (pre_norm_) {
      L.attn_norm = l > 0 ? norm(p + n.attention_norm) : Norm{nullptr, nullptr};
      L.ln1 = norm(p + n.ffn_norm);
      L.ln2 = {nullptr, nullptr};
    } else {
      L.attn_norm = {nullptr, nullptr};
      L.ln1 = norm(p + n.attention_norm);
      L.ln2 = norm(p + n.ffn_norm);
    }
    layers_.push_back(L);
  }
  if (pre_norm_) final_norm_ = norm(f.final_norm);
  head_dense_ = linear(f.head.dense);
  if (!f.head.norm.empty()) head_norm_ = norm(f.head.norm);
  head_out_ = linear(f.head.out);
  saved_.resize(c.num_hidden_layers);
}

void SequenceClassifier::bind_parameters(BufferSource& mem, GroupRange persistent_grads, DType compute,
                                                   Category master, bool keep_master) {
  compute_ = compute;
  half_begin_ = 0;
  if (mixed()) {
    if (keep_master) weights_ = mem.take(master, "parameters", -1, DType::F32, {layout_.count()});
    // Offloaded master weights are page-locked host memory, which the lookup reads over the
    // bus: a few rows a token.
    if (keep_master) half_begin_ = layout_.tables_end();
    half_weights_ = mem.take(Category::Weights, compute == DType::BF16 ? "parameters_bf16" : "parameters_fp16", -1,
                             compute, {layout_.count() - half_begin_});
  } else {
    weights_ = mem.take(Category::Weights, "parameters", -1, DType::F32, {layout_.count()});
  }
  const std::vector<ParamGroup>& groups = layout_.groups();
  HONE_CHECK(persistent_grads.first >= 0 && persistent_grads.first <= persistent_grads.end &&
                 persistent_grads.end <= int(groups.size()),
             "persistent gradients of groups [{}, {}) of {}", persistent_grads.first, persistent_grads.end,
             groups.size());
  persistent_grads_ = persistent_grads;
  group_grads_.assign(groups.size(), Tensor{});
  if (persistent_grads.first == persistent_grads.end) return;
  const int64_t base = groups[size_t(persistent_grads.first)].begin;
  Tensor flat = mem.take(Category::Gradients, "parameter_grads", -1, DType::F32,
                         {groups[size_t(persistent_grads.end - 1)].end - base});
  for (int k = persistent_grads.first; k < persistent_grads.end; ++k) {
    const ParamGroup& g = groups[size_t(k)];
    group_grads_[size_t(k)] = slice(flat, g.begin - base, {g.size()});
  }
}

void SequenceClassifier::round_weights(Backend& be) {
  if (mixed()) ops::cast(be, weights_.rows(half_begin_, layout_.count()), half_weights_);
}

void SequenceClassifier::take_grads(Backend& be, BufferSource& mem, int k) {
  if (persistent_grads_.contains(k)) return;
  Tensor& t = group_grads_[size_t(k)];
  t = mem.take(Category::Gradients, "group_grads", k, DType::F32, {layout_.groups()[size_t(k)].size()});
  ops::fill(be, t, 0.0f);
}

void SequenceClassifier::release_grads(BufferSource& mem) {
  for (int k = 0; k < num_groups(); ++k)
    if (!persistent_grads_.contains(k) && group_grads_[size_t(k)].data) mem.release(group_grads_[size_t(k)]);
}

Tensor SequenceClassifier::slice(const Tensor& flat, int64_t offset, Shape s) {
  HONE_CHECK(offset >= 0 && offset + s.numel() <= flat.numel(), "slice {} at {} of {}", s.str(), offset,
             flat.shape.str());
  Tensor t = flat;
  t.data = static_cast<char*>(flat.data) + size_t(offset) * dtype_size(flat.dtype);
  t.shape = s;
  return t;
}

namespace {

// The (query, key) pairs of a sequence of S tokens that attention weighs: S^2, or with a
// window w each query's keys within w of it.
double attended_pairs(int S, int window) {
  if (window < 0 || window >= S - 1) return double(S) * S;
  const double w = window;
  // 2w + 1 keys per query, less the keys the sequence's ends cut off: w(w + 1) in all.
  return double(S) * (2 * w + 1) - w * (w + 1);
}

}  // namespace

double SequenceClassifier::training_flops(int batch, int seq) const {
  const double H = cfg_.hidden_size, I = cfg_.intermediate_size, L = cfg_.num_hidden_layers, S = seq;
  const double E = cfg_.embedding_width();
  const double tokens = double(batch) * seq;
  // Per token and layer: QKV and the attention output (4H^2), the FFN (2HI, or 3HI gated).
  const double ffn = family_->gated_ffn ? 3 * H * I : 2 * H * I;
  double per_token = L * 2 * (4 * H * H + ffn) + (projection_.w ? 2 * E * H : 0);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) per_token += 4 * H * attended_pairs(seq, cfg_.attention_window(l)) / S;
  const double per_sequence = 2 * (H * H + H * cfg_.num_labels);  // the head's dense and output layers
  return 3 * (tokens * per_token + batch * per_sequence);
}

double SequenceClassifier::training_flops(const int32_t* mask, int batch, int seq) const {
  double flops = 0;
  for (int r = 0; r < batch; ++r) {
    const int n = int(std::count_if(mask + int64_t(r) * seq, mask + int64_t(r + 1) * seq, [](int32_t m) { return m != 0; }));
    if (n > 0) flops += training_flops(1, n);
  }
  return flops;
}

DropoutSpec SequenceClassifier::dropout(const DropoutState& d, float p, int site) const {
  if (!d.training) return {0.0f, d.seed, 0, nullptr};
  HONE_CHECK(d.step_counter, "training dropout without a step counter would repeat its masks every step");
  return {p, d.seed, uint64_t(site), d.step_counter};
}

// Dropout call sites: 0 embeddings, 1 + 3l + k for layer l, 3L + 1 and 3L + 2 the head.
// ModernBERT's attention_dropout (attention_probs_dropout_prob here) also drops the
// attention's output; its mlp_dropout (hidden_dropout_prob) drops the GeGLU's output.
DropoutSpec SequenceClassifier::layer_dropout(const DropoutState& d, int l, int k) const {
  float p = k == 0 || (k == 1 && pre_norm_) ? cfg_.attention_probs_dropout_prob : cfg_.hidden_dropout_prob;
  if (k == 1 && !family_->attention_output_dropout) p = 0.0f;
  return dropout(d, p, 1 + 3 * l + k);
}

DropoutSpec SequenceClassifier::head_dropout(const DropoutState& d, int k) const {
  return dropout(d, cfg_.effective_classifier_dropout(), 3 * cfg_.num_hidden_layers + 1 + k);
}

SequenceClassifier::Pass SequenceClassifier::pass(const BatchTensors& batch, const DropoutState& drop,
                                                  bool training) const {
  return {batch,
          drop,
          batch.tokens > 0 ? batch.tokens : int64_t(batch.batch) * batch.seq,
          AttentionDims{.batch = batch.batch,
                        .seq = batch.seq,
                        .heads = cfg_.num_attention_heads,
                        .head_dim = cfg_.head_dim(),
                        .scale = 1.0f / std::sqrt(float(cfg_.head_dim())),
                        .host_row_start = batch.tokens > 0 ? batch.host_row_start : nullptr},
          training && batch.tokens > 0};
}

// Packed training runs attention on the packed rows where the backend packs training
// attention, unless every row is packed (a mask with holes keeps the padded attention's
// semantics; without padding the layouts are one); elsewhere through the padded layout.
SequenceClassifier::AttentionPath SequenceClassifier::attention_path(const Backend& be, const Pass& p,
                                                                     const AttentionDims& d) const {
  if (!p.packed()) return AttentionPath::Padded;
  if (!p.packed_training) return AttentionPath::PackedInference;
  if (!be.packs_training_attention(d, compute_)) return AttentionPath::PaddedCopies;
  return p.every_row() ? AttentionPath::Padded : AttentionPath::PackedRows;
}

void SequenceClassifier::attention(Backend& be, BufferSource& mem, const Pass& p, int l,
                                              const Tensor& qkv, Tensor& stats, Tensor& keep, Tensor& ctx,
                                              bool first_rows_only) {
  AttentionDims d = dims(p, l);
  d.first_rows_only = first_rows_only;
  Tensor ws = mem.take(Category::Workspace, "attention_workspace", -1, DType::F32,
                       {be.attention_workspace_elems(d, compute_)});
  const DropoutSpec drop = layer_dropout(p.drop, l, 0);
  switch (attention_path(be, p, d)) {
    case AttentionPath::Padded:
      ops::attention_forward(be, qkv, p.batch.attention_mask, d, drop, stats, keep, ctx, ws);
      break;
    case AttentionPath::PackedRows:
      ops::attention_forward_packed(be, qkv, p.batch.row_start, d, drop, stats, keep, ctx, ws);
      break;
    case AttentionPath::PackedInference:
      ops::attention_forward_packed(be, qkv, p.batch.row_start, d, ctx, ws);
      break;
    case AttentionPath::PaddedCopies: {
      const int64_t rows = int64_t(p.ad.batch) * p.ad.seq, H = cfg_.hidden_size;
      Tensor padded_qkv = scratch(mem, "padded_qkv", {rows, 3 * H}),
             padded_ctx = scratch(mem, "padded_context", {rows, H});
      const bool copy = !p.every_row();  // every row packed: the layouts are one (the buffers, planned, stay unused)
      if (copy) ops::scatter_rows(be, qkv, p.batch.packed_rows, padded_qkv);
      ops::attention_forward(be, copy ? padded_qkv : qkv, p.batch.attention_mask, d, drop, stats, keep,
                             copy ? padded_ctx : ctx, ws);
      if (copy) ops::gather_rows(be, padded_ctx, p.batch.packed_rows, ctx);
      mem.release(padded_ctx);
      mem.release(padded_qkv);
      break;
    }
  }
  mem.release(ws);
}

Tensor SequenceClassifier::attention_keep(const Backend& be, BufferSource& mem, const Pass& p, int l,
                                                     Category c, const char* name) const {
  const int words = ops::attention_keep_words(be, dims(p, l), compute_, layer_dropout(p.drop, l, 0));
  if (words == 0) return {};
  return mem.take(c, name, c == Category::Activations ? l : -1, DType::I32,
                  {p.ad.batch, p.ad.heads, p.ad.seq, words});
}

void SequenceClassifier::saved_attention(Backend& be, BufferSource& mem, const Pass& p, int l,
                                         bool first_rows_only) {
  Saved& s = saved_[l];
  if (!p.packed() || p.packed_training) {  // packed inference keeps nothing for a backward
    s.attn_stats = row_stats(mem, "attention_row_stats", l, {p.ad.batch, p.ad.heads, p.ad.seq, 2});  // not [S, S]
    s.attn_keep = attention_keep(be, mem, p, l, Category::Activations, "attention_dropout_mask");
  } else {
    s.attn_stats = s.attn_keep = Tensor{};
  }
  s.ctx = activation(mem, "attention_context", l, {p.tokens, cfg_.hidden_size});
  attention(be, mem, p, l, s.qkv, s.attn_stats, s.attn_keep, s.ctx, first_rows_only);
}

void SequenceClassifier::recompute_context(Backend& be, BufferSource& mem, const Pass& p, int l) {
  Saved& s = saved_[l];
  s.ctx = activation(mem, "attention_context", l, {p.tokens, cfg_.hidden_size});
  Tensor stats = mem.take(Category::Workspace, "recomputed_attention_row_stats", -1, DType::F32, s.attn_stats.shape);
  Tensor keep = attention_keep(be, mem, p, l, Category::Workspace, "recomputed_attention_dropout_mask");
  attention(be, mem, p, l, s.qkv, stats, keep, s.ctx);
  release_if_taken(mem, keep);
  mem.release(stats);
}

void SequenceClassifier::context_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& d_ctx,
                                          Tensor& d_qkv) {
  Saved& s = saved_[l];
  const AttentionDims d = dims(p, l);
  Tensor ws =
      mem.take(Category::Workspace, "attention_workspace", -1, DType::F32, {be.attention_workspace_elems(d, compute_)});
  const DropoutSpec drop = layer_dropout(p.drop, l, 0);
  const AttentionPath path = attention_path(be, p, d);
  HONE_CHECK(path != AttentionPath::PackedInference, "a backward through packed inference's attention");
  if (path == AttentionPath::PackedRows) {
    ops::attention_backward_packed(be, d_ctx, s.qkv, s.ctx, p.batch.row_start, s.attn_stats, s.attn_keep, d, drop,
                                   d_qkv, ws);
  } else if (path == AttentionPath::PaddedCopies) {  // in the padded layout, as the forward ran it
    const int64_t rows = int64_t(p.ad.batch) * p.ad.seq, H = cfg_.hidden_size;
    const Tensor& packed_rows = p.batch.packed_rows;
    Tensor qkv = scratch(mem, "padded_qkv", {rows, 3 * H}), ctx = scratch(mem, "padded_context", {rows, H});
    Tensor dctx = scratch(mem, "padded_context_grad", {rows, H}), dqkv = scratch(mem, "padded_qkv_grad", {rows, 3 * H});
    if (p.every_row()) {  // the layouts are one
      ops::attention_backward(be, d_ctx, s.qkv, s.ctx, p.batch.attention_mask, s.attn_stats, s.attn_keep, d, drop,
                              d_qkv, ws);
    } else {
      ops::scatter_rows(be, s.qkv, packed_rows, qkv);
      ops::scatter_rows(be, s.ctx, packed_rows, ctx);
      ops::scatter_rows(be, d_ctx, packed_rows, dctx);
      ops::attention_backward(be, dctx, qkv, ctx, p.batch.attention_mask, s.attn_stats, s.attn_keep, d, drop, dqkv,
                              ws);
      ops::gather_rows(be, dqkv, packed_rows, d_qkv);
    }
    for (const Tensor* t : {&dqkv, &dctx, &ctx, &qkv}) mem.release(*t);
  } else {
    ops::attention_backward(be, d_ctx, s.qkv, s.ctx, p.batch.attention_mask, s.attn_stats, s.attn_keep, d, drop,
                            d_qkv, ws);
  }
  mem.release(ws);
  mem.release(d_ctx);
  mem.release(s.ctx);
  mem.release(s.attn_stats);
  release_if_taken(mem, s.attn_keep);
}

void SequenceClassifier::first_tokens(Backend& be, const Pass& p, const Tensor& hidden, Tensor& out) const {
  if (p.packed())
    ops::gather_rows(be, hidden, p.batch.row_start.rows(0, p.batch.batch), out);
  else
    ops::gather_first_tokens(be, hidden, p.batch.seq, out);
}

SequenceClassifier::FirstTokenRows SequenceClassifier::first_token_rows(Backend& be, BufferSource& mem,
                                                                       const Pass& p, const Tensor& ctx,
                                                                       const Tensor& x) {
  const int64_t B = p.batch.batch, H = cfg_.hidden_size;
  FirstTokenRows rows{scratch(mem, "first_token_context", {B, H}), scratch(mem, "first_token_input", {B, H})};
  first_tokens(be, p, ctx, rows.ctx);
  first_tokens(be, p, x, rows.x);
  return rows;
}

void SequenceClassifier::release_first_token_rows(BufferSource& mem, const FirstTokenRows& rows) {
  mem.release(rows.x);
  mem.release(rows.ctx);
}

void SequenceClassifier::layer_forward(Backend& be, BufferSource& mem, const Pass& p, int l,
                                                  const Tensor& x, bool keep_for_backward, bool first_tokens_only) {
  if (pre_norm_) return prenorm_layer_forward(be, mem, p, l, x, first_tokens_only);
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const float eps = cfg_.layer_norm_eps;
  const Layer& P = layers_[l];
  Saved& s = saved_[l];
  const Tensor qkv_b = compute_slice(P.qkv.b->offset, {3 * H}), ao_b = w(P.attn_out.b), up_b = w(P.ffn_up.b),
               down_b = w(P.ffn_down.b);
  s.qkv = activation(mem, "qkv", l, {p.tokens, 3 * H});
  ops::linear_forward(be, x, w3(P.qkv.w, 3 * H, H), &qkv_b, s.qkv);
  saved_attention(be, mem, p, l, first_tokens_only);
  // Past attention the layer is row by row: with first_tokens_only it runs on each
  // sequence's first token (its context and residual) and nothing else.
  const int64_t T = first_tokens_only ? p.batch.batch : p.tokens;
  const FirstTokenRows first = first_tokens_only ? first_token_rows(be, mem, p, s.ctx, x) : FirstTokenRows{};
  const Tensor& ctx = first_tokens_only ? first.ctx : s.ctx;
  const Tensor& residual = first_tokens_only ? first.x : x;
  // out = LN(res + dropout(in w^T + b)) and its statistics. Training keeps the sum, which
  // backward reads; inference (nothing kept, no dropout) runs the product and the norm as
  // one op, which may split the product (ops::linear_add_layernorm_forward). A scratch
  // input (release_in) is released once the product has read it.
  const ResidualNormNames attention_names{"attention_residual", "attention_ln_mean", "attention_ln_rstd",
                                          "attention_out"};
  const ResidualNormNames ffn_names{"ffn_residual", "ffn_ln_mean", "ffn_ln_rstd", "layer_out"};
  auto product_norm = [&](const Tensor& in, const Tensor& wt, const Tensor& bias, const Tensor& res, int site,
                          const Norm& norm, const ResidualNormNames& names, bool release_in, Tensor& sum,
                          Tensor& mean, Tensor& rstd, Tensor& out) {
    const DropoutSpec drop = layer_dropout(p.drop, l, site);
    if (!keep_for_backward && !(drop.p > 0.0f)) {
      sum = Tensor{};
      Tensor work = scratch(mem, "residual_product", {ops::linear_add_layernorm_work(be, T, H, in.shape[1], compute_)});
      mean = row_stats(mem, names.mean, l, {T});
      rstd = row_stats(mem, names.rstd, l, {T});
      out = activation(mem, names.out, l, {T, H});
      ops::linear_add_layernorm_forward(be, in, wt, &bias, res, w(norm.g), w(norm.b), eps, work, out, mean, rstd);
      mem.release(work);
      if (release_in) mem.release(in);
      return;
    }
    sum = activation(mem, names.sum, l, {T, H});
    ops::linear_forward(be, in, wt, &bias, sum);
    if (release_in) mem.release(in);
    mean = row_stats(mem, names.mean, l, {T});
    rstd = row_stats(mem, names.rstd, l, {T});
    out = activation(mem, names.out, l, {T, H});
    // sum = res + dropout(sum) in place, out = LN(sum)
    ops::dropout_add_layernorm_forward(be, sum, res, drop, w(norm.g), w(norm.b), eps, sum, out, mean, rstd);
  };
  product_norm(ctx, w(P.attn_out.w), ao_b, residual, 1, P.ln1, attention_names, false, s.ln1_in, s.ln1_mean,
               s.ln1_rstd, s.ln1_out);
  // Recomputed in backward from ffn_pre rather than saved. (A half-precision epilogue
  // computes it from the unrounded product, so the recomputation may differ by an ulp.)
  // Inference keeps no ffn_pre: the activation then runs in the product's epilogue where
  // the backend has one for it (BERT's erf GELU on Hopper), or in place.
  s.ffn_pre = keep_for_backward ? activation(mem, "ffn_preactivation", l, {T, I}) : Tensor{};
  Tensor ffn_act = scratch(mem, "ffn_activation", {T, I});
  ops::linear_activation_forward(be, cfg_.activation(), s.ln1_out, w(P.ffn_up.w), &up_b, s.ffn_pre, ffn_act);
  product_norm(ffn_act, w(P.ffn_down.w), down_b, s.ln1_out, 2, P.ln2, ffn_names, true, s.ln2_in, s.ln2_mean,
               s.ln2_rstd, s.out);
  if (first_tokens_only) release_first_token_rows(mem, first);
}

void SequenceClassifier::release_unkept(BufferSource& mem, int l, const Tensor& x, bool keep_for_backward) {
  Saved& s = saved_[l];
  if (!keep_for_backward) {
    mem.release(x);
    for (const Tensor* t : s.for_backward()) release_if_taken(mem, *t);
  } else if (checkpointing_ == Checkpointing::Full) {  // x stays: the layer's checkpoint
    for (const Tensor* t : s.for_backward()) release_if_taken(mem, *t);
  } else if (checkpointing_ == Checkpointing::Selective) {
    mem.release(s.ctx);
    mem.release(s.ln1_out);
    if (pre_norm_) release_if_taken(mem, s.attn_norm_out);  // x, the residual stream, stays
    else if (l > 0) mem.release(x);  // recomputed from the previous layer's ln2_in
  }
}

Tensor SequenceClassifier::recompute_layernorm(Backend& be, BufferSource& mem, const Tensor& sum,
                                                          const Norm& n, const char* name, int l) {
  const int64_t T = sum.shape[0];
  Tensor y = activation(mem, name, l, sum.shape);
  Tensor mean = mem.take(Category::Workspace, "recomputed_ln_mean", -1, DType::F32, {T});
  Tensor rstd = mem.take(Category::Workspace, "recomputed_ln_rstd", -1, DType::F32, {T});
  ops::layernorm_forward(be, sum, w(n.g), opt(n.b), cfg_.layer_norm_eps, y, mean, rstd);
  mem.release(mean);
  mem.release(rstd);
  return y;
}

SequenceClassifier::SavedHead SequenceClassifier::run_forward(Backend& be, BufferSource& mem, const Pass& p,
                                                               bool keep_for_backward, float* hidden_out) {
  const int B = p.batch.batch, S = p.batch.seq, L = cfg_.num_hidden_layers;
  const int64_t T = p.tokens, H = cfg_.hidden_size, C = cfg_.num_labels, E = cfg_.embedding_width();
  SavedHead h;
  if (family_->positions == PositionIds::AfterPadding) {  // in the padded layout, as the ids
    h.positions = mem.take(Category::Activations, "position_ids", -1, DType::I32, {int64_t(B) * S});
    ops::position_ids_after_padding(be, p.batch.input_ids, cfg_.pad_token_id, S, h.positions);
  }
  const Tensor types = token_types(p.batch), type_table = opt(type_), pos_table = opt(pos_);
  h.emb_sum = activation(mem, "embeddings_sum", -1, {T, E});
  h.emb_mean = row_stats(mem, "embeddings_ln_mean", -1, {T});
  h.emb_rstd = row_stats(mem, "embeddings_ln_rstd", -1, {T});
  const bool packed = p.batch.tokens > 0;
  if (packed) {  // embedded in the padded layout (positions are columns there), then packed
    Tensor padded = scratch(mem, "embeddings_padded", {int64_t(B) * S, E});
    ops::embedding_forward(be, p.batch.input_ids, types, h.positions, w(word_), pos_table, type_table, S, padded);
    ops::gather_rows(be, padded, p.batch.packed_rows, h.emb_sum);
    mem.release(padded);
  } else {
    ops::embedding_forward(be, p.batch.input_ids, types, h.positions, w(word_), pos_table, type_table, S, h.emb_sum);
  }
  Tensor& normed = projection_.w ? h.emb_norm : h.emb_out;
  normed = activation(mem, projection_.w ? "embeddings_norm" : "embeddings_out", -1, {T, E});
  ops::layernorm_forward(be, h.emb_sum, w(emb_ln_.g), opt(emb_ln_.b), cfg_.layer_norm_eps, normed, h.emb_mean,
                         h.emb_rstd);
  ops::dropout(be, normed, dropout(p.drop, cfg_.effective_embedding_dropout(), 0), normed);
  if (projection_.w) {  // ELECTRA: embedding_size -> hidden_size
    h.emb_out = activation(mem, "embeddings_out", -1, {T, H});
    const Tensor proj_b = w(projection_.b);
    ops::linear_forward(be, h.emb_norm, w(projection_.w), &proj_b, h.emb_out);
  }
  if (!keep_for_backward)
    for (const Tensor* t : {&h.positions, &h.emb_sum, &h.emb_mean, &h.emb_rstd, &h.emb_norm}) release_if_taken(mem, *t);

  // Classification on the first token reads nothing else of the last layer's output, so
  // inference runs that layer past attention on those rows alone: the same logits, about
  // three quarters of a layer's products fewer.
  const bool first_tokens_only = !keep_for_backward && !hidden_out && cfg_.classifier_pooling != "mean" && L > 0;
  for (int l = 0; l < L; ++l) {
    const Tensor& x = l == 0 ? h.emb_out : saved_[l - 1].out;
    layer_forward(be, mem, p, l, x, keep_for_backward, first_tokens_only && l == L - 1);
    release_unkept(mem, l, x, keep_for_backward);
  }

  const Tensor* last = L > 0 ? &saved_[L - 1].out : &h.emb_out;
  if (final_norm_.g) {  // pre-norm: backward reads the last layer's output, the norm's input
    const int64_t rows = last->shape[0];  // B when the last layer ran on the first tokens
    h.final_out = activation(mem, "final_norm_out", -1, {rows, H});
    h.final_mean = row_stats(mem, "final_norm_mean", -1, {rows});
    h.final_rstd = row_stats(mem, "final_norm_rstd", -1, {rows});
    ops::layernorm_forward(be, *last, w(final_norm_.g), opt(final_norm_.b), cfg_.layer_norm_eps, h.final_out,
                           h.final_mean, h.final_rstd);
    if (!keep_for_backward) {
      mem.release(*last);
      mem.release(h.final_mean);
      mem.release(h.final_rstd);
    }
    last = &h.final_out;
  }
  HONE_CHECK(!packed || !hidden_out, "the last hidden state of a packed batch is not in the padded layout");
  if (hidden_out && !be.dry_run) be.read(*last, hidden_out, size_t(T * H));
  h.cls_tok = activation(mem, "cls_token", -1, {B, H});
  // A batch packed with every row is in the padded layout, whose mask may have holes.
  if (cfg_.classifier_pooling == "mean" && packed && !p.every_row()) {
    ops::mean_pool_packed(be, *last, p.batch.row_start, h.cls_tok);  // a packed sequence is its attended tokens
  } else if (cfg_.classifier_pooling == "mean") {
    ops::mean_pool_forward(be, *last, p.batch.attention_mask, h.cls_tok);
  } else if (first_tokens_only) {
    ops::copy(be, *last, h.cls_tok);  // the last layer ran on the first tokens alone
  } else {
    first_tokens(be, p, *last, h.cls_tok);
  }
  // Nothing in backward reads the encoder's output (in training the embeddings' output
  // stays for the first layer's backward, and a pre-norm encoder's last layer output
  // for its final norm's).
  if (final_norm_.g) mem.release(h.final_out);
  else if (L > 0 || !keep_for_backward) mem.release(*last);
  head_forward(be, mem, p, h);
  h.cls_in = activation(mem, "classifier_in", -1, {B, H});
  ops::dropout(be, h.pooled, head_dropout(p.drop, 0), h.cls_in);
  h.logits = scratch(mem, "logits", {B, C});
  const Tensor out_b = w(head_out_.b);
  ops::linear_forward(be, h.cls_in, w(head_out_.w), &out_b, h.logits);
  return h;
}

Activation SequenceClassifier::head_activation() const {
  switch (family_->head.activation) {
    case HeadActivation::Gelu: return Activation::Gelu;
    case HeadActivation::Relu: return Activation::Relu;
    case HeadActivation::Config: return cfg_.head_activation();
    case HeadActivation::Tanh: break;
  }
  HONE_CHECK(false, "tanh is not an Activation");
  return Activation::Gelu;
}

void SequenceClassifier::head_forward(Backend& be, BufferSource& mem, const Pass& p, SavedHead& h) {
  const int64_t B = p.batch.batch, H = cfg_.hidden_size;
  const HeadSpec& spec = family_->head;
  h.head_in = h.cls_tok;
  if (spec.dropout_first) {
    h.head_in = activation(mem, "head_in", -1, {B, H});
    ops::dropout(be, h.cls_tok, head_dropout(p.drop, 1), h.head_in);
  }
  const Tensor dense_b = opt(head_dense_.b);
  h.pooled = activation(mem, "pooled", -1, {B, H});
  if (spec.activation == HeadActivation::Tanh) {
    ops::linear_forward(be, h.head_in, w(head_dense_.w), ptr(dense_b), h.pooled);
    ops::tanh_forward(be, h.pooled, h.pooled);
    return;
  }
  h.head_pre = activation(mem, "head_preactivation", -1, {B, H});
  ops::linear_forward(be, h.head_in, w(head_dense_.w), ptr(dense_b), h.head_pre);
  if (!head_norm_.g) {
    ops::activation_forward(be, head_activation(), h.head_pre, h.pooled);
    return;
  }
  h.head_act = activation(mem, "head_activation", -1, {B, H});  // ModernBERT: dense, act, LayerNorm
  ops::activation_forward(be, head_activation(), h.head_pre, h.head_act);
  h.head_mean = row_stats(mem, "head_norm_mean", -1, {B});
  h.head_rstd = row_stats(mem, "head_norm_rstd", -1, {B});
  ops::layernorm_forward(be, h.head_act, w(head_norm_.g), opt(head_norm_.b), cfg_.layer_norm_eps, h.pooled,
                         h.head_mean, h.head_rstd);
}

void SequenceClassifier::head_backward(Backend& be, BufferSource& mem, const Pass& p, SavedHead& h,
                                       Tensor& d_pooled, Tensor& d_tok) {
  const HeadSpec& spec = family_->head;
  if (spec.activation == HeadActivation::Tanh) {
    ops::tanh_backward(be, d_pooled, h.pooled, d_pooled);
  } else {
    if (head_norm_.g) {
      Tensor gg = g(head_norm_.g), gb = opt_g(head_norm_.b);
      ops::layernorm_backward(be, d_pooled, h.head_act, w(head_norm_.g), h.head_mean, h.head_rstd, d_pooled, gg, gb);
      for (const Tensor* t : {&h.head_act, &h.head_mean, &h.head_rstd}) mem.release(*t);
    }
    ops::activation_backward(be, head_activation(), d_pooled, h.head_pre, d_pooled);
    mem.release(h.head_pre);
  }
  mem.release(h.pooled);
  Tensor gdense_w = g(head_dense_.w), gdense_b = opt_g(head_dense_.b);
  ops::linear_backward(be, d_pooled, h.head_in, w(head_dense_.w), &d_tok, false, gdense_w, ptr(gdense_b));
  if (spec.dropout_first) {
    mem.release(h.head_in);
    ops::dropout(be, d_tok, head_dropout(p.drop, 1), d_tok);
  }
  mem.release(h.cls_tok);
}

void SequenceClassifier::forward(Backend& be, BufferSource& mem, const BatchTensors& batch,
                                 const ForwardOutputs& out) {
  const DropoutState off{0, false};
  SavedHead h = run_forward(be, mem, pass(batch, off), false, out.last_hidden_state);
  if (!be.dry_run) {
    if (out.pooled) be.read(h.pooled, out.pooled, size_t(h.pooled.numel()));
    if (out.logits) be.read(h.logits, out.logits, size_t(h.logits.numel()));
  }
  if (out.logits_copy) {
    Tensor to = out.logits_copy->rows(0, h.logits.shape[0]);
    ops::copy(be, h.logits, to);
  }
  for (const Tensor* t : {&h.cls_tok, &h.head_pre, &h.head_act, &h.head_mean, &h.head_rstd, &h.pooled, &h.cls_in,
                          &h.logits})
    release_if_taken(mem, *t);
  if (family_->head.dropout_first) mem.release(h.head_in);
}

void SequenceClassifier::forward_backward(Backend& be, BufferSource& mem, const BatchTensors& batch,
                                          const DropoutState& drop, float grad_scale, const Tensor* loss_scale,
                                          Tensor& loss, float* logits_out) {
  const int B = batch.batch, S = batch.seq, L = cfg_.num_hidden_layers;
  const int64_t H = cfg_.hidden_size, C = cfg_.num_labels, E = cfg_.embedding_width();
  const Pass p = pass(batch, drop, true);

  SavedHead h = run_forward(be, mem, p, true, nullptr);
  if (logits_out && !be.dry_run) be.read(h.logits, logits_out, size_t(B * C));
  Tensor dlogits = scratch(mem, "logits_grad", {B, C});
  if (regression_)
    ops::mse(be, h.logits, batch.labels, grad_scale, loss_scale, loss, dlogits);
  else
    ops::cross_entropy(be, h.logits, batch.labels, grad_scale, loss_scale, loss, dlogits);
  mem.release(h.logits);
  be.mark(StepSpan::Backward);

  // ---------------- backward
  take_grads(be, mem, L + 1);
  Tensor gout_w = g(head_out_.w), gout_b = g(head_out_.b);
  Tensor d_pooled = scratch(mem, "classifier_in_grad", {B, H});
  ops::linear_backward(be, dlogits, h.cls_in, w(head_out_.w), &d_pooled, false, gout_w, &gout_b);
  mem.release(dlogits);
  mem.release(h.cls_in);
  ops::dropout(be, d_pooled, head_dropout(drop, 0), d_pooled);
  Tensor d_tok = scratch(mem, "cls_token_grad", {B, H});
  head_backward(be, mem, p, h, d_pooled, d_tok);
  mem.release(d_pooled);
  Tensor dh = scratch(mem, "hidden_grad", {p.tokens, H});  // gradient flowing down the layers
  if (cfg_.classifier_pooling == "mean") {  // a packed batch's through the padded layout
    Tensor padded = p.packed() ? scratch(mem, "padded_hidden_grad", {int64_t(B) * S, H}) : Tensor{};
    const bool copy = p.packed() && !p.every_row();
    ops::mean_pool_backward(be, d_tok, batch.attention_mask, copy ? padded : dh);
    if (copy) ops::gather_rows(be, padded, batch.packed_rows, dh);
    release_if_taken(mem, padded);
  } else if (p.packed()) {
    ops::scatter_rows(be, d_tok, batch.row_start.rows(0, B), dh);  // each sequence's first row
  } else {
    ops::scatter_first_tokens(be, d_tok, S, dh);
  }
  mem.release(d_tok);
  if (final_norm_.g) {  // in place: dh becomes the gradient of the last layer's output
    Tensor gg = g(final_norm_.g), gb = opt_g(final_norm_.b);
    const Tensor& last = L > 0 ? saved_[L - 1].out : h.emb_out;
    ops::layernorm_backward(be, dh, last, w(final_norm_.g), h.final_mean, h.final_rstd, dh, gg, gb);
    mem.release(h.final_mean);
    mem.release(h.final_rstd);
    if (L > 0) mem.release(last);
  }

  group_grads_done(be, mem, L + 1);

  for (int l = L - 1; l >= 0; --l) {
    layer_backward(be, mem, p, l, l == 0 ? h.emb_out : saved_[l - 1].out, dh);
    group_grads_done(be, mem, 1 + l);
  }

  // emb_out = dropout(LN(emb_sum)), projected by ELECTRA
  take_grads(be, mem, 0);
  Tensor gemb_g = g(emb_ln_.g), gemb_b = opt_g(emb_ln_.b), gword = g(word_), gpos = opt_g(pos_);
  Tensor gtype = type_ ? g(type_) : Tensor{};
  if (projection_.w) {
    Tensor d_norm = scratch(mem, "embeddings_norm_grad", {p.tokens, E});
    Tensor gproj_w = g(projection_.w), gproj_b = g(projection_.b);
    ops::linear_backward(be, dh, h.emb_norm, w(projection_.w), &d_norm, false, gproj_w, &gproj_b);
    mem.release(dh);
    mem.release(h.emb_norm);
    dh = d_norm;
  }
  ops::dropout(be, dh, dropout(drop, cfg_.effective_embedding_dropout(), 0), dh);
  Tensor d_emb = scratch(mem, "embeddings_grad", {p.tokens, E});
  ops::layernorm_backward(be, dh, h.emb_sum, w(emb_ln_.g), h.emb_mean, h.emb_rstd, d_emb, gemb_g, gemb_b);
  mem.release(dh);
  mem.release(h.emb_sum);
  mem.release(h.emb_mean);
  mem.release(h.emb_rstd);
  // The embeddings ran in the padded layout: a packed batch's gradient goes back there.
  Tensor padded = p.packed() ? scratch(mem, "padded_embeddings_grad", {int64_t(B) * S, E}) : Tensor{};
  const bool copy = p.packed() && !p.every_row();
  if (copy) ops::scatter_rows(be, d_emb, batch.packed_rows, padded);
  ops::embedding_backward(be, copy ? padded : d_emb, batch.input_ids, token_types(batch), h.positions, S, gword, gpos,
                          gtype);
  release_if_taken(mem, padded);
  mem.release(d_emb);
  release_if_taken(mem, h.positions);
  group_grads_done(be, mem, 0);
}

void SequenceClassifier::layer_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& x,
                                                   Tensor& dh) {
  if (checkpointing_ == Checkpointing::Full) {
    layer_forward(be, mem, p, l, x, true);
    mem.release(saved_[l].out);  // the next layer's input, whose backward is done
  }
  take_grads(be, mem, 1 + l);
  if (pre_norm_) return prenorm_layer_backward(be, mem, p, l, x, dh);
  const int64_t T = p.tokens, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const bool selective = checkpointing_ == Checkpointing::Selective;
  const Layer& P = layers_[l];
  Saved& s = saved_[l];
  Tensor gg2 = g(P.ln2.g), gb2 = g(P.ln2.b), gg1 = g(P.ln1.g), gb1 = g(P.ln1.b);
  Tensor gdown_w = g(P.ffn_down.w), gdown_b = g(P.ffn_down.b), gup_w = g(P.ffn_up.w), gup_b = g(P.ffn_up.b);
  Tensor gao_w = g(P.attn_out.w), gao_b = g(P.attn_out.b);
  Tensor gqkv_w = g3(P.qkv.w, 3 * H, H), gqkv_b = g3(P.qkv.b, 3 * H, 1).view({3 * H});

  // out = LN2(ln2_in), ln2_in = ln1_out + dropout(down(act(ffn_pre))): d_res becomes
  // d ln2_in, and dh, whose gradient of out is not read again, that of the FFN output.
  Tensor d_res = scratch(mem, "residual_grad", {T, H});
  ops::layernorm_dropout_backward(be, dh, s.ln2_in, w(P.ln2.g), s.ln2_mean, s.ln2_rstd, layer_dropout(p.drop, l, 2),
                                  d_res, dh, gg2, gb2);
  mem.release(s.ln2_in);
  mem.release(s.ln2_mean);
  mem.release(s.ln2_rstd);
  Tensor ffn_act = scratch(mem, "ffn_activation", {T, I});  // recomputed from ffn_pre
  Tensor d_pre = scratch(mem, "ffn_preactivation_grad", {T, I});
  // The up-projection's bias gradient comes from the pass that makes d_pre.
  ops::activation_linear_backward(be, cfg_.activation(), dh, s.ffn_pre, w(P.ffn_down.w), ffn_act, d_pre, gdown_w,
                                  &gdown_b, &gup_b);
  mem.release(ffn_act);
  mem.release(s.ffn_pre);
  // d_res becomes the gradient of ln1_out: the residual path plus the FFN input path.
  if (selective) s.ln1_out = recompute_layernorm(be, mem, s.ln1_in, P.ln1, "attention_out", l);
  ops::linear_backward(be, d_pre, s.ln1_out, w(P.ffn_up.w), &d_res, true, gup_w, nullptr);
  mem.release(d_pre);
  mem.release(s.ln1_out);

  // ln1_out = LN1(ln1_in), ln1_in = x + dropout(attn_out(ctx)): dh becomes d ln1_in (the
  // residual path) and d_res the gradient of the attention output.
  ops::layernorm_dropout_backward(be, d_res, s.ln1_in, w(P.ln1.g), s.ln1_mean, s.ln1_rstd,
                                  layer_dropout(p.drop, l, 1), dh, d_res, gg1, gb1);
  mem.release(s.ln1_in);
  mem.release(s.ln1_mean);
  mem.release(s.ln1_rstd);
  if (selective) recompute_context(be, mem, p, l);
  Tensor d_ctx = scratch(mem, "attention_context_grad", {T, H});
  ops::linear_backward(be, d_res, s.ctx, w(P.attn_out.w), &d_ctx, false, gao_w, &gao_b);
  mem.release(d_res);
  Tensor d_qkv = scratch(mem, "qkv_grad", {T, 3 * H});
  context_backward(be, mem, p, l, d_ctx, d_qkv);
  if (selective && l > 0)
    x = recompute_layernorm(be, mem, saved_[l - 1].ln2_in, layers_[l - 1].ln2, "layer_out", l - 1);
  // dh (the residual path) += d_qkv W_qkv: the gradient of the layer input x.
  ops::linear_backward(be, d_qkv, x, w3(P.qkv.w, 3 * H, H), &dh, true, gqkv_w, &gqkv_b);
  mem.release(d_qkv);
  mem.release(s.qkv);
  mem.release(x);
}

}  // namespace hone
