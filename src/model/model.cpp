#include "hone/model.h"

#include <cmath>
#include <fmt/format.h>

#include "hone/ops.h"

namespace hone {

// ---------------------------------------------------------------- layout

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  int group = 0;
  auto add = [&](std::string name, Shape s, bool decay) { entries_.push_back({std::move(name), s, 0, decay, group}); };
  auto linear = [&](const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", {out, in}, true);
    add(p + ".bias", {out}, false);
  };
  auto norm = [&](const std::string& p) {
    add(p + ".weight", {H}, false);
    add(p + ".bias", {H}, false);
  };
  add("bert.embeddings.word_embeddings.weight", {c.vocab_size, H}, true);
  add("bert.embeddings.position_embeddings.weight", {c.max_position_embeddings, H}, true);
  add("bert.embeddings.token_type_embeddings.weight", {c.type_vocab_size, H}, true);
  norm("bert.embeddings.LayerNorm");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    group = 1 + l;
    std::string p = fmt::format("bert.encoder.layer.{}.", l);
    linear(p + "attention.self.query", H, H);
    linear(p + "attention.self.key", H, H);
    linear(p + "attention.self.value", H, H);
    linear(p + "attention.output.dense", H, H);
    norm(p + "attention.output.LayerNorm");
    linear(p + "intermediate.dense", I, H);
    linear(p + "output.dense", H, I);
    norm(p + "output.LayerNorm");
  }
  group = 1 + c.num_hidden_layers;
  linear("bert.pooler.dense", H, H);
  linear("classifier", c.num_labels, H);
  // Group by group; within a group the decayed parameters first, each in transformers' order.
  groups_.resize(size_t(group + 1));
  for (int k = 0; k <= group; ++k) {
    ParamGroup& g = groups_[size_t(k)];
    g.begin = count_;
    for (bool decay : {true, false}) {
      for (auto& e : entries_)
        if (e.group == k && e.decay == decay) {
          e.offset = count_;
          count_ += e.shape.numel();
        }
      if (decay) g.decayed_end = count_;
    }
    g.end = count_;
  }
}

const ParamEntry* ParamLayout::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ParamEntry& ParamLayout::at(const std::string& name) const {
  const ParamEntry* e = find(name);
  HONE_CHECK(e, "no parameter {}", name);
  return *e;
}

// ---------------------------------------------------------------- model

SequenceClassifier::SequenceClassifier(const ModelConfig& c)
    : cfg_(c), regression_(c.resolved_problem_type() == "regression"), layout_(c) {
  HONE_CHECK(3 * c.num_hidden_layers + 2 < (1 << kDropoutSiteBits), "too many layers for the dropout stream layout");
  auto e = [&](const std::string& n) { return &layout_.at(n); };
  auto linear = [&](const std::string& p) { return Linear{e(p + ".weight"), e(p + ".bias")}; };
  auto norm = [&](const std::string& p) { return Norm{e(p + ".weight"), e(p + ".bias")}; };
  word_ = e("bert.embeddings.word_embeddings.weight");
  pos_ = e("bert.embeddings.position_embeddings.weight");
  type_ = e("bert.embeddings.token_type_embeddings.weight");
  emb_ln_ = norm("bert.embeddings.LayerNorm");
  const int64_t H = c.hidden_size;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = fmt::format("bert.encoder.layer.{}.", l);
    Layer L;
    L.qkv = linear(p + "attention.self.query");  // key and value follow in memory
    HONE_CHECK(e(p + "attention.self.value.weight")->offset == L.qkv.w->offset + 2 * H * H &&
                   e(p + "attention.self.value.bias")->offset == L.qkv.b->offset + 2 * H,
               "query, key and value are not adjacent");
    L.attn_out = linear(p + "attention.output.dense");
    L.ln1 = norm(p + "attention.output.LayerNorm");
    L.ffn_up = linear(p + "intermediate.dense");
    L.ffn_down = linear(p + "output.dense");
    L.ln2 = norm(p + "output.LayerNorm");
    layers_.push_back(L);
  }
  pooler_ = linear("bert.pooler.dense");
  classifier_ = linear("classifier");
  saved_.resize(c.num_hidden_layers);
}

void SequenceClassifier::bind_parameters(BufferSource& mem, GroupRange persistent_grads, DType compute,
                                                   Category master, bool keep_master) {
  compute_ = compute;
  if (mixed()) {
    if (keep_master) weights_ = mem.take(master, "parameters", -1, DType::F32, {layout_.count()});
    half_weights_ = mem.take(Category::Weights, compute == DType::BF16 ? "parameters_bf16" : "parameters_fp16", -1,
                             compute, {layout_.count()});
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

void SequenceClassifier::take_grads(Backend& be, BufferSource& mem, int k) {
  if (persistent_grads_.contains(k)) return;
  Tensor& t = group_grads_[size_t(k)];
  t = mem.take(Category::Gradients, "group_grads", k, DType::F32, {layout_.groups()[size_t(k)].size()});
  ops::fill(be, t, 0.0f);
}

ParamLayout ParamLayout::shard(int first, int end) const {
  HONE_CHECK(0 <= first && first < end && end <= int(groups_.size()), "shard of groups [{}, {}) of {}", first, end,
             groups_.size());
  ParamLayout s;
  const int64_t base = groups_[size_t(first)].begin;
  for (const ParamEntry& e : entries_)
    if (e.group >= first && e.group < end) {
      ParamEntry r = e;
      r.offset -= base;
      r.group -= first;
      s.entries_.push_back(std::move(r));
    }
  for (int k = first; k < end; ++k) {
    const ParamGroup& g = groups_[size_t(k)];
    s.groups_.push_back({g.begin - base, g.decayed_end - base, g.end - base});
  }
  s.count_ = groups_[size_t(end - 1)].end - base;
  return s;
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

double SequenceClassifier::training_flops(int batch, int seq) const {
  const double H = cfg_.hidden_size, I = cfg_.intermediate_size, L = cfg_.num_hidden_layers, S = seq;
  const double tokens = double(batch) * seq;
  const double per_token = L * (2 * (4 * H * H + 2 * H * I) + 4 * S * H);
  const double per_sequence = 2 * (H * H + H * cfg_.num_labels);  // pooler and classifier
  return 3 * (tokens * per_token + batch * per_sequence);
}

DropoutSpec SequenceClassifier::dropout(const DropoutState& d, float p, int site) const {
  if (!d.training) return {0.0f, d.seed, 0, nullptr};
  HONE_CHECK(d.step_counter, "training dropout without a step counter would repeat its masks every step");
  return {p, d.seed, uint64_t(site), d.step_counter};
}

// Dropout call sites: 0 embeddings, 1 + 3l + k for layer l, 3L + 1 classifier.
DropoutSpec SequenceClassifier::layer_dropout(const DropoutState& d, int l, int k) const {
  return dropout(d, k == 0 ? cfg_.attention_probs_dropout_prob : cfg_.hidden_dropout_prob, 1 + 3 * l + k);
}

SequenceClassifier::Pass SequenceClassifier::pass(const BatchTensors& batch,
                                                                         const DropoutState& drop) const {
  return {batch, drop, batch.tokens > 0 ? batch.tokens : int64_t(batch.batch) * batch.seq,
          AttentionDims{batch.batch, batch.seq, cfg_.num_attention_heads, cfg_.head_dim(),
                        1.0f / std::sqrt(float(cfg_.head_dim()))}};
}

namespace {

// Releases t unless it was never taken (an empty tensor: attention keep bits that the
// backend does not keep).
void release_if_taken(BufferSource& mem, const Tensor& t) {
  if (t.data) mem.release(t);
}

}  // namespace

void SequenceClassifier::attention(Backend& be, BufferSource& mem, const Pass& p, int l,
                                              const Tensor& qkv, Tensor& stats, Tensor& keep, Tensor& ctx) {
  Tensor ws = mem.take(Category::Workspace, "attention_workspace", -1, DType::F32,
                       {be.attention_workspace_elems(p.ad, compute_)});
  if (p.batch.tokens > 0)
    ops::attention_forward_packed(be, qkv, p.batch.row_start, p.ad, ctx, ws);
  else
    ops::attention_forward(be, qkv, p.batch.attention_mask, p.ad, layer_dropout(p.drop, l, 0), stats, keep, ctx, ws);
  mem.release(ws);
}

Tensor SequenceClassifier::attention_keep(const Backend& be, BufferSource& mem, const Pass& p, int l,
                                                     Category c, const char* name) const {
  const int words = ops::attention_keep_words(be, p.ad, compute_, layer_dropout(p.drop, l, 0));
  if (words == 0) return {};
  return mem.take(c, name, c == Category::Activations ? l : -1, DType::I32,
                  {p.ad.batch, p.ad.heads, p.ad.seq, words});
}

void SequenceClassifier::layer_forward(Backend& be, BufferSource& mem, const Pass& p, int l,
                                                  const Tensor& x) {
  const int64_t T = p.tokens, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const float eps = cfg_.layer_norm_eps;
  const Layer& P = layers_[l];
  Saved& s = saved_[l];
  const Tensor qkv_b = slice(compute_weights(), P.qkv.b->offset, {3 * H}), ao_b = w(P.attn_out.b), up_b = w(P.ffn_up.b),
               down_b = w(P.ffn_down.b);
  s.qkv = activation(mem, "qkv", l, {T, 3 * H});
  ops::linear_forward(be, x, w3(P.qkv.w, 3 * H, H), &qkv_b, s.qkv);
  if (p.batch.tokens == 0) {  // packed inference keeps nothing for a backward
    s.attn_stats = row_stats(mem, "attention_row_stats", l, {p.ad.batch, p.ad.heads, p.ad.seq, 2});  // not [S, S]
    s.attn_keep = attention_keep(be, mem, p, l, Category::Activations, "attention_dropout_mask");
  } else {
    s.attn_stats = s.attn_keep = Tensor{};
  }
  s.ctx = activation(mem, "attention_context", l, {T, H});
  attention(be, mem, p, l, s.qkv, s.attn_stats, s.attn_keep, s.ctx);
  s.ln1_in = activation(mem, "attention_residual", l, {T, H});
  ops::linear_forward(be, s.ctx, w(P.attn_out.w), &ao_b, s.ln1_in);
  s.ln1_mean = row_stats(mem, "attention_ln_mean", l, {T});
  s.ln1_rstd = row_stats(mem, "attention_ln_rstd", l, {T});
  s.ln1_out = activation(mem, "attention_out", l, {T, H});
  // ln1_in = x + dropout(ln1_in) in place, ln1_out = LN1(ln1_in)
  ops::dropout_add_layernorm_forward(be, s.ln1_in, x, layer_dropout(p.drop, l, 1), w(P.ln1.g), w(P.ln1.b), eps,
                                     s.ln1_in, s.ln1_out, s.ln1_mean, s.ln1_rstd);
  s.ffn_pre = activation(mem, "ffn_preactivation", l, {T, I});
  // Recomputed in backward from ffn_pre rather than saved. (A half-precision epilogue
  // computes it from the unrounded product, so the recomputation may differ by an ulp.)
  Tensor ffn_act = scratch(mem, "ffn_activation", {T, I});
  ops::linear_activation_forward(be, cfg_.activation(), s.ln1_out, w(P.ffn_up.w), &up_b, s.ffn_pre, ffn_act);
  s.ln2_in = activation(mem, "ffn_residual", l, {T, H});
  ops::linear_forward(be, ffn_act, w(P.ffn_down.w), &down_b, s.ln2_in);
  mem.release(ffn_act);
  s.ln2_mean = row_stats(mem, "ffn_ln_mean", l, {T});
  s.ln2_rstd = row_stats(mem, "ffn_ln_rstd", l, {T});
  s.out = activation(mem, "layer_out", l, {T, H});
  // ln2_in = ln1_out + dropout(ln2_in) in place, out = LN2(ln2_in)
  ops::dropout_add_layernorm_forward(be, s.ln2_in, s.ln1_out, layer_dropout(p.drop, l, 2), w(P.ln2.g), w(P.ln2.b),
                                     eps, s.ln2_in, s.out, s.ln2_mean, s.ln2_rstd);
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
    if (l > 0) mem.release(x);  // recomputed from the previous layer's ln2_in
  }
}

Tensor SequenceClassifier::recompute_layernorm(Backend& be, BufferSource& mem, const Tensor& sum,
                                                          const Norm& n, const char* name, int l) {
  const int64_t T = sum.shape[0];
  Tensor y = activation(mem, name, l, sum.shape);
  Tensor mean = mem.take(Category::Workspace, "recomputed_ln_mean", -1, DType::F32, {T});
  Tensor rstd = mem.take(Category::Workspace, "recomputed_ln_rstd", -1, DType::F32, {T});
  ops::layernorm_forward(be, sum, w(n.g), w(n.b), cfg_.layer_norm_eps, y, mean, rstd);
  mem.release(mean);
  mem.release(rstd);
  return y;
}

SequenceClassifier::SavedHead SequenceClassifier::run_forward(Backend& be, BufferSource& mem,
                                                                                     const Pass& p,
                                                                                     bool keep_for_backward,
                                                                                     float* hidden_out) {
  const int B = p.batch.batch, S = p.batch.seq, L = cfg_.num_hidden_layers;
  const int64_t T = p.tokens, H = cfg_.hidden_size, C = cfg_.num_labels;
  SavedHead h;
  h.emb_sum = activation(mem, "embeddings_sum", -1, {T, H});
  h.emb_mean = row_stats(mem, "embeddings_ln_mean", -1, {T});
  h.emb_rstd = row_stats(mem, "embeddings_ln_rstd", -1, {T});
  h.emb_out = activation(mem, "embeddings_out", -1, {T, H});
  const bool packed = p.batch.tokens > 0;
  if (packed) {  // embedded in the padded layout (positions are columns there), then packed
    Tensor padded = scratch(mem, "embeddings_padded", {int64_t(B) * S, H});
    ops::embedding_forward(be, p.batch.input_ids, p.batch.token_type_ids, w(word_), w(pos_), w(type_), S, padded);
    ops::gather_rows(be, padded, p.batch.packed_rows, h.emb_sum);
    mem.release(padded);
  } else {
    ops::embedding_forward(be, p.batch.input_ids, p.batch.token_type_ids, w(word_), w(pos_), w(type_), S, h.emb_sum);
  }
  ops::layernorm_forward(be, h.emb_sum, w(emb_ln_.g), w(emb_ln_.b), cfg_.layer_norm_eps, h.emb_out, h.emb_mean,
                         h.emb_rstd);
  ops::dropout(be, h.emb_out, dropout(p.drop, cfg_.hidden_dropout_prob, 0), h.emb_out);
  if (!keep_for_backward)
    for (const Tensor& t : {h.emb_sum, h.emb_mean, h.emb_rstd}) mem.release(t);

  for (int l = 0; l < L; ++l) {
    const Tensor& x = l == 0 ? h.emb_out : saved_[l - 1].out;
    layer_forward(be, mem, p, l, x);
    release_unkept(mem, l, x, keep_for_backward);
  }

  const Tensor& last = L > 0 ? saved_[L - 1].out : h.emb_out;
  HONE_CHECK(!packed || !hidden_out, "the last hidden state of a packed batch is not in the padded layout");
  if (hidden_out && !be.dry_run) be.read(last, hidden_out, size_t(T * H));
  h.cls_tok = activation(mem, "cls_token", -1, {B, H});
  if (packed)
    ops::gather_rows(be, last, p.batch.row_start.rows(0, B), h.cls_tok);  // each sequence's first token
  else
    ops::gather_first_tokens(be, last, S, h.cls_tok);
  // Nothing in backward reads the last layer's output (in training the embeddings' output
  // stays for the first layer's backward).
  if (L > 0 || !keep_for_backward) mem.release(last);
  h.pooled = activation(mem, "pooled", -1, {B, H});
  const Tensor pool_b = w(pooler_.b), cls_b = w(classifier_.b);
  ops::linear_forward(be, h.cls_tok, w(pooler_.w), &pool_b, h.pooled);
  ops::tanh_forward(be, h.pooled, h.pooled);
  h.cls_in = activation(mem, "classifier_in", -1, {B, H});
  ops::dropout(be, h.pooled, dropout(p.drop, cfg_.effective_classifier_dropout(), 3 * L + 1), h.cls_in);
  h.logits = scratch(mem, "logits", {B, C});
  ops::linear_forward(be, h.cls_in, w(classifier_.w), &cls_b, h.logits);
  return h;
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
  for (const Tensor& t : {h.cls_tok, h.pooled, h.cls_in, h.logits}) mem.release(t);
}

void SequenceClassifier::forward_backward(Backend& be, BufferSource& mem, const BatchTensors& batch,
                                                     const DropoutState& drop, float grad_scale,
                                                     const Tensor* loss_scale, Tensor& loss, float* logits_out) {
  const int B = batch.batch, S = batch.seq, L = cfg_.num_hidden_layers;
  const int64_t H = cfg_.hidden_size, C = cfg_.num_labels;
  const Pass p = pass(batch, drop);
  const DropoutSpec emb_drop = dropout(drop, cfg_.hidden_dropout_prob, 0);
  const DropoutSpec cls_drop = dropout(drop, cfg_.effective_classifier_dropout(), 3 * L + 1);

  SavedHead h = run_forward(be, mem, p, true, nullptr);
  Tensor &emb_sum = h.emb_sum, &emb_mean = h.emb_mean, &emb_rstd = h.emb_rstd, &emb_out = h.emb_out,
         &cls_tok = h.cls_tok, &pooled = h.pooled, &cls_in = h.cls_in, &logits = h.logits;
  if (logits_out && !be.dry_run) be.read(logits, logits_out, size_t(B * C));
  Tensor dlogits = scratch(mem, "logits_grad", {B, C});
  if (regression_)
    ops::mse(be, logits, batch.labels, grad_scale, loss_scale, loss, dlogits);
  else
    ops::cross_entropy(be, logits, batch.labels, grad_scale, loss_scale, loss, dlogits);
  mem.release(logits);
  be.mark(StepSpan::Backward);

  // ---------------- backward
  take_grads(be, mem, L + 1);
  Tensor gcls_w = g(classifier_.w), gcls_b = g(classifier_.b), gpool_b = g(pooler_.b);
  Tensor d_cls = scratch(mem, "classifier_in_grad", {B, H});
  ops::linear_backward(be, dlogits, cls_in, w(classifier_.w), &d_cls, false, gcls_w, &gcls_b);
  mem.release(dlogits);
  mem.release(cls_in);
  ops::dropout(be, d_cls, cls_drop, d_cls);
  ops::tanh_backward(be, d_cls, pooled, d_cls);
  mem.release(pooled);
  Tensor d_tok = scratch(mem, "cls_token_grad", {B, H});
  Tensor gpool_w = g(pooler_.w);
  ops::linear_backward(be, d_cls, cls_tok, w(pooler_.w), &d_tok, false, gpool_w, &gpool_b);
  mem.release(d_cls);
  mem.release(cls_tok);
  Tensor dh = scratch(mem, "hidden_grad", {p.tokens, H});  // gradient flowing down the layers
  ops::scatter_first_tokens(be, d_tok, S, dh);
  mem.release(d_tok);

  group_grads_done(be, mem, L + 1);

  for (int l = L - 1; l >= 0; --l) {
    layer_backward(be, mem, p, l, l == 0 ? emb_out : saved_[l - 1].out, dh);
    group_grads_done(be, mem, 1 + l);
  }

  // emb_out = dropout(LN(emb_sum))
  take_grads(be, mem, 0);
  Tensor gemb_g = g(emb_ln_.g), gemb_b = g(emb_ln_.b), gword = g(word_), gpos = g(pos_), gtype = g(type_);
  ops::dropout(be, dh, emb_drop, dh);
  Tensor d_emb = scratch(mem, "embeddings_grad", {p.tokens, H});
  ops::layernorm_backward(be, dh, emb_sum, w(emb_ln_.g), emb_mean, emb_rstd, d_emb, gemb_g, gemb_b);
  mem.release(dh);
  mem.release(emb_sum);
  mem.release(emb_mean);
  mem.release(emb_rstd);
  ops::embedding_backward(be, d_emb, batch.input_ids, batch.token_type_ids, S, gword, gpos, gtype);
  mem.release(d_emb);
  group_grads_done(be, mem, 0);
}

void SequenceClassifier::layer_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& x,
                                                   Tensor& dh) {
  const int64_t T = p.tokens, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const bool selective = checkpointing_ == Checkpointing::Selective;
  const Layer& P = layers_[l];
  Saved& s = saved_[l];
  if (checkpointing_ == Checkpointing::Full) {
    layer_forward(be, mem, p, l, x);
    mem.release(s.out);  // the next layer's input, whose backward is done
  }
  take_grads(be, mem, 1 + l);
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
  ops::activation_linear_backward(be, cfg_.activation(), dh, s.ffn_pre, w(P.ffn_down.w), ffn_act, d_pre, gdown_w,
                                  &gdown_b);
  mem.release(ffn_act);
  mem.release(s.ffn_pre);
  // d_res becomes the gradient of ln1_out: the residual path plus the FFN input path.
  if (selective) s.ln1_out = recompute_layernorm(be, mem, s.ln1_in, P.ln1, "attention_out", l);
  ops::linear_backward(be, d_pre, s.ln1_out, w(P.ffn_up.w), &d_res, true, gup_w, &gup_b);
  mem.release(d_pre);
  mem.release(s.ln1_out);

  // ln1_out = LN1(ln1_in), ln1_in = x + dropout(attn_out(ctx)): dh becomes d ln1_in (the
  // residual path) and d_res the gradient of the attention output.
  ops::layernorm_dropout_backward(be, d_res, s.ln1_in, w(P.ln1.g), s.ln1_mean, s.ln1_rstd,
                                  layer_dropout(p.drop, l, 1), dh, d_res, gg1, gb1);
  mem.release(s.ln1_in);
  mem.release(s.ln1_mean);
  mem.release(s.ln1_rstd);
  if (selective) {
    // The context again, from the kept qkv with the same dropout; the statistics and mask
    // bits it recomputes go to scratch, so that backward reads the forward's own.
    s.ctx = activation(mem, "attention_context", l, {T, H});
    Tensor stats =
        mem.take(Category::Workspace, "recomputed_attention_row_stats", -1, DType::F32, s.attn_stats.shape);
    Tensor keep = attention_keep(be, mem, p, l, Category::Workspace, "recomputed_attention_dropout_mask");
    attention(be, mem, p, l, s.qkv, stats, keep, s.ctx);
    release_if_taken(mem, keep);
    mem.release(stats);
  }
  Tensor d_ctx = scratch(mem, "attention_context_grad", {T, H});
  ops::linear_backward(be, d_res, s.ctx, w(P.attn_out.w), &d_ctx, false, gao_w, &gao_b);
  mem.release(d_res);
  Tensor d_qkv = scratch(mem, "qkv_grad", {T, 3 * H});
  Tensor ws = mem.take(Category::Workspace, "attention_workspace", -1, DType::F32,
                       {be.attention_workspace_elems(p.ad, compute_)});
  ops::attention_backward(be, d_ctx, s.qkv, s.ctx, p.batch.attention_mask, s.attn_stats, s.attn_keep, p.ad,
                          layer_dropout(p.drop, l, 0), d_qkv, ws);
  mem.release(ws);
  mem.release(d_ctx);
  mem.release(s.ctx);
  mem.release(s.attn_stats);
  release_if_taken(mem, s.attn_keep);
  if (selective && l > 0)
    x = recompute_layernorm(be, mem, saved_[l - 1].ln2_in, layers_[l - 1].ln2, "layer_out", l - 1);
  // dh (the residual path) += d_qkv W_qkv: the gradient of the layer input x.
  ops::linear_backward(be, d_qkv, x, w3(P.qkv.w, 3 * H, H), &dh, true, gqkv_w, &gqkv_b);
  mem.release(d_qkv);
  mem.release(s.qkv);
  mem.release(x);
}

}  // namespace hone
