// ModernBERT's pre-norm encoder layer (hone/family.h, NormPlacement::Pre):
//   a = LN_attn(x) (x itself in the first layer), qkv = rotary(a Wqkv^T),
//   y = x + dropout(attention(qkv) Wo^T), m = LN_mlp(y), u = m Wi^T [T, 2I],
//   out = y + Wo2 dropout(act(u[:, :I]) * u[:, I:]).
// The buffers and checkpointing policies are the post-norm layer's (hone/model.h, Saved).
#include "hone/model.h"
#include "hone/ops.h"

namespace hone {

void SequenceClassifier::rotate(Backend& be, const Pass& p, int l, Tensor& qkv, bool inverse) const {
  if (family_->positions != PositionIds::Rotary) return;
  // Packed rows turn by their column in the padded layout, as the padded batch would.
  const Tensor rows = p.batch.tokens > 0 ? p.batch.packed_rows : Tensor{};
  ops::rotary(be, qkv, rows, p.batch.seq, cfg_.num_attention_heads, cfg_.head_dim(), cfg_.rope_theta(l), inverse);
}

void SequenceClassifier::prenorm_layer_forward(Backend& be, BufferSource& mem, const Pass& p, int l,
                                               const Tensor& x, bool first_tokens_only) {
  int64_t T = p.tokens;
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const float eps = cfg_.layer_norm_eps;
  const Layer& P = layers_[l];
  Saved& s = saved_[l];
  const Tensor* a = &x;
  s.attn_norm_out = s.attn_norm_mean = s.attn_norm_rstd = Tensor{};
  if (P.attn_norm.g) {
    s.attn_norm_out = activation(mem, "attention_norm_out", l, {T, H});
    s.attn_norm_mean = row_stats(mem, "attention_norm_mean", l, {T});
    s.attn_norm_rstd = row_stats(mem, "attention_norm_rstd", l, {T});
    ops::layernorm_forward(be, x, w(P.attn_norm.g), opt(P.attn_norm.b), eps, s.attn_norm_out, s.attn_norm_mean,
                           s.attn_norm_rstd);
    a = &s.attn_norm_out;
  }
  const Tensor qkv_b = P.qkv.b ? compute_slice(P.qkv.b->offset, {3 * H}) : Tensor{};
  s.qkv = activation(mem, "qkv", l, {T, 3 * H});
  ops::linear_forward(be, *a, w3(P.qkv.w, 3 * H, H), ptr(qkv_b), s.qkv);
  rotate(be, p, l, s.qkv, false);
  saved_attention(be, mem, p, l, first_tokens_only);
  // Past attention the layer is row by row: with first_tokens_only it runs on each
  // sequence's first token (its context and residual) and nothing else.
  if (first_tokens_only) T = p.batch.batch;
  const FirstTokenRows first = first_tokens_only ? first_token_rows(be, mem, p, s.ctx, x) : FirstTokenRows{};
  const Tensor& ctx = first_tokens_only ? first.ctx : s.ctx;
  const Tensor& residual = first_tokens_only ? first.x : x;
  s.ln1_in = activation(mem, "attention_residual", l, {T, H});
  const Tensor ao_b = opt(P.attn_out.b), up_b = opt(P.ffn_up.b), down_b = opt(P.ffn_down.b);
  ops::linear_forward(be, ctx, w(P.attn_out.w), ptr(ao_b), s.ln1_in);
  s.ln1_mean = row_stats(mem, "ffn_norm_mean", l, {T});
  s.ln1_rstd = row_stats(mem, "ffn_norm_rstd", l, {T});
  s.ln1_out = activation(mem, "ffn_norm_out", l, {T, H});
  // ln1_in = x + dropout(ln1_in) in place, ln1_out = LN_mlp(ln1_in)
  ops::dropout_add_layernorm_forward(be, s.ln1_in, residual, layer_dropout(p.drop, l, 1), w(P.ln1.g), opt(P.ln1.b),
                                     eps, s.ln1_in, s.ln1_out, s.ln1_mean, s.ln1_rstd);
  s.ffn_pre = activation(mem, "ffn_preactivation", l, {T, 2 * I});
  ops::linear_forward(be, s.ln1_out, w(P.ffn_up.w), ptr(up_b), s.ffn_pre);
  Tensor ffn_act = scratch(mem, "ffn_activation", {T, I});  // recomputed in backward
  ops::gated_activation_forward(be, cfg_.activation(), s.ffn_pre, ffn_act);
  ops::dropout(be, ffn_act, layer_dropout(p.drop, l, 2), ffn_act);
  s.out = activation(mem, "layer_out", l, {T, H});
  ops::linear_forward(be, ffn_act, w(P.ffn_down.w), ptr(down_b), s.out);
  mem.release(ffn_act);
  ops::dropout_add(be, s.out, s.ln1_in, DropoutSpec{}, s.out);  // out = ln1_in + the FFN's output
  s.ln2_in = s.ln2_mean = s.ln2_rstd = Tensor{};
  if (first_tokens_only) release_first_token_rows(mem, first);
}

void SequenceClassifier::prenorm_layer_backward(Backend& be, BufferSource& mem, const Pass& p, int l, Tensor& x,
                                                Tensor& dh) {
  const int64_t T = p.tokens, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const bool selective = checkpointing_ == Checkpointing::Selective;
  const Layer& P = layers_[l];
  Saved& s = saved_[l];
  Tensor gg1 = g(P.ln1.g), gb1 = opt_g(P.ln1.b);
  Tensor gdown_w = g(P.ffn_down.w), gdown_b = opt_g(P.ffn_down.b), gup_w = g(P.ffn_up.w), gup_b = opt_g(P.ffn_up.b);
  Tensor gao_w = g(P.attn_out.w), gao_b = opt_g(P.attn_out.b);
  Tensor gqkv_w = g3(P.qkv.w, 3 * H, H), gqkv_b = P.qkv.b ? g3(P.qkv.b, 3 * H, 1).view({3 * H}) : Tensor{};

  // out = ln1_in + Wo2 dropout(act(u) v): dh is the gradient of out and of ln1_in's residual path.
  Tensor ffn_act = scratch(mem, "ffn_activation", {T, I});
  ops::gated_activation_forward(be, cfg_.activation(), s.ffn_pre, ffn_act);
  ops::dropout(be, ffn_act, layer_dropout(p.drop, l, 2), ffn_act);
  Tensor d_act = scratch(mem, "ffn_activation_grad", {T, I});
  ops::linear_backward(be, dh, ffn_act, w(P.ffn_down.w), &d_act, false, gdown_w, ptr(gdown_b));
  mem.release(ffn_act);
  ops::dropout(be, d_act, layer_dropout(p.drop, l, 2), d_act);
  Tensor d_pre = scratch(mem, "ffn_preactivation_grad", {T, 2 * I});
  ops::gated_activation_backward(be, cfg_.activation(), d_act, s.ffn_pre, d_pre);
  mem.release(d_act);
  mem.release(s.ffn_pre);
  if (selective) s.ln1_out = recompute_layernorm(be, mem, s.ln1_in, P.ln1, "ffn_norm_out", l);
  Tensor d_norm = scratch(mem, "residual_grad", {T, H});
  ops::linear_backward(be, d_pre, s.ln1_out, w(P.ffn_up.w), &d_norm, false, gup_w, ptr(gup_b));
  mem.release(d_pre);
  mem.release(s.ln1_out);
  // ln1_out = LN_mlp(ln1_in), ln1_in = x + dropout(attention output): dh += LN_mlp's
  // backward, then d_norm becomes the attention output's gradient.
  ops::layernorm_backward(be, d_norm, s.ln1_in, w(P.ln1.g), s.ln1_mean, s.ln1_rstd, d_norm, gg1, gb1);
  ops::dropout_add(be, d_norm, dh, DropoutSpec{}, dh);
  ops::dropout(be, dh, layer_dropout(p.drop, l, 1), d_norm);
  mem.release(s.ln1_in);
  mem.release(s.ln1_mean);
  mem.release(s.ln1_rstd);
  if (selective) recompute_context(be, mem, p, l);
  Tensor d_ctx = scratch(mem, "attention_context_grad", {T, H});
  ops::linear_backward(be, d_norm, s.ctx, w(P.attn_out.w), &d_ctx, false, gao_w, ptr(gao_b));
  mem.release(d_norm);
  Tensor d_qkv = scratch(mem, "qkv_grad", {T, 3 * H});
  context_backward(be, mem, p, l, d_ctx, d_qkv);
  rotate(be, p, l, d_qkv, true);  // the gradient of the projection's output, before rotation
  if (!P.attn_norm.g) {  // the first layer: dh += d_qkv Wqkv, the gradient of x itself
    ops::linear_backward(be, d_qkv, x, w3(P.qkv.w, 3 * H, H), &dh, true, gqkv_w, ptr(gqkv_b));
  } else {
    if (selective) s.attn_norm_out = recompute_layernorm(be, mem, x, P.attn_norm, "attention_norm_out", l);
    Tensor d_a = scratch(mem, "attention_norm_grad", {T, H});
    ops::linear_backward(be, d_qkv, s.attn_norm_out, w3(P.qkv.w, 3 * H, H), &d_a, false, gqkv_w, ptr(gqkv_b));
    mem.release(s.attn_norm_out);
    Tensor gg0 = g(P.attn_norm.g), gb0 = opt_g(P.attn_norm.b);
    ops::layernorm_backward(be, d_a, x, w(P.attn_norm.g), s.attn_norm_mean, s.attn_norm_rstd, d_a, gg0, gb0);
    ops::dropout_add(be, d_a, dh, DropoutSpec{}, dh);
    mem.release(d_a);
    mem.release(s.attn_norm_mean);
    mem.release(s.attn_norm_rstd);
  }
  mem.release(d_qkv);
  mem.release(s.qkv);
  mem.release(x);
}

}  // namespace hone
