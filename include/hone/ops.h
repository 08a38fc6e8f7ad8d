#pragma once
// What model and trainer code call. Each wrapper checks dtypes and shapes (so a wrong
// shape is caught during planning, before any memory exists), then dispatches to the
// backend unless it is in a dry run. Semantics are documented in backend.h.
#include "hone/backend.h"

namespace hone::ops {

void fill(Backend& be, Tensor& x, float value);
void fill_normal(Backend& be, Tensor& x, float std, uint64_t seed, uint64_t stream);
void copy(Backend& be, const Tensor& src, Tensor& dst);
void add_scaled(Backend& be, const Tensor& x, float alpha, Tensor& y);
void cast(Backend& be, const Tensor& src, Tensor& dst);

void linear_forward(Backend& be, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
void linear_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                     Tensor& dw, Tensor* db);
void linear_activation_forward(Backend& be, Activation a, const Tensor& x, const Tensor& w, const Tensor* b,
                               Tensor& pre, Tensor& y);
void activation_linear_backward(Backend& be, Activation a, const Tensor& dy, const Tensor& pre, const Tensor& w,
                                Tensor& y, Tensor& dpre, Tensor& dw, Tensor* db, Tensor* db_pre = nullptr);

// keep: the mask bits forward saves for backward, I32 [B, heads, S, words] with words =
// attention_keep_words(be, d, dtype, drop); not read when that is 0 (and may be empty).
int attention_keep_words(const Backend& be, const AttentionDims& d, DType t, const DropoutSpec& drop);
void attention_forward(Backend& be, const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                       const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace);
void attention_backward(Backend& be, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& mask,
                        const Tensor& stats, const Tensor& keep, const AttentionDims& d, const DropoutSpec& drop,
                        Tensor& dqkv, Tensor& workspace);

void layernorm_forward(Backend& be, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd);
void layernorm_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
void dropout_add_layernorm_forward(Backend& be, const Tensor& x, const Tensor& residual, const DropoutSpec& d,
                                   const Tensor& gamma, const Tensor& beta, float eps, Tensor& sum, Tensor& y,
                                   Tensor& mean, Tensor& rstd);
void linear_split_forward(Backend& be, const Tensor& x, const Tensor& w, Tensor& parts);
void parts_add_layernorm_forward(Backend& be, const Tensor& parts, const Tensor* b, const Tensor& residual,
                                 const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                                 Tensor& rstd);
// Inference's product, bias, residual and LayerNorm: y = LN(residual + (x w^T + b)), no
// dropout, the sum not kept. As linear_forward then dropout_add_layernorm_forward, or,
// where the backend splits the product (linear_splits), linear_split_forward into work
// and parts_add_layernorm_forward: the same up to the order of the product's sums.
// work: scratch in x's dtype of linear_add_layernorm_work(...) elements.
int64_t linear_add_layernorm_work(const Backend& be, int64_t rows, int64_t n, int64_t k, DType t);
void linear_add_layernorm_forward(Backend& be, const Tensor& x, const Tensor& w, const Tensor* b,
                                  const Tensor& residual, const Tensor& gamma, const Tensor& beta, float eps,
                                  Tensor& work, Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_dropout_backward(Backend& be, const Tensor& dy, const Tensor& sum, const Tensor& gamma,
                                const Tensor& mean, const Tensor& rstd, const DropoutSpec& d, Tensor& dsum, Tensor& dx,
                                Tensor& dgamma, Tensor& dbeta);

void activation_forward(Backend& be, Activation a, const Tensor& x, Tensor& y);
void activation_backward(Backend& be, Activation a, const Tensor& dy, const Tensor& x, Tensor& dx);
void gated_activation_forward(Backend& be, Activation a, const Tensor& x, Tensor& y);
void gated_activation_backward(Backend& be, Activation a, const Tensor& dy, const Tensor& x, Tensor& dx);
void tanh_forward(Backend& be, const Tensor& x, Tensor& y);
void tanh_backward(Backend& be, const Tensor& dy, const Tensor& y, Tensor& dx);
void dropout(Backend& be, const Tensor& x, const DropoutSpec& d, Tensor& y);
void dropout_add(Backend& be, const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out);

void embedding_forward(Backend& be, const Tensor& ids, const Tensor& types, const Tensor& positions,
                       const Tensor& word, const Tensor& pos, const Tensor& type, int seq, Tensor& out);
void embedding_backward(Backend& be, const Tensor& dout, const Tensor& ids, const Tensor& types,
                        const Tensor& positions, int seq, Tensor& dword, Tensor& dpos, Tensor& dtype);
void position_ids_after_padding(Backend& be, const Tensor& ids, int32_t pad, int seq, Tensor& out);
void rotary(Backend& be, Tensor& qkv, const Tensor& rows, int seq, int heads, int head_dim, float theta,
            bool inverse);
void mean_pool_forward(Backend& be, const Tensor& hidden, const Tensor& mask, Tensor& out);
void mean_pool_backward(Backend& be, const Tensor& dout, const Tensor& mask, Tensor& dhidden);
void mean_pool_packed(Backend& be, const Tensor& hidden, const Tensor& row_start, Tensor& out);
void gather_first_tokens(Backend& be, const Tensor& hidden, int seq, Tensor& out);
void scatter_first_tokens(Backend& be, const Tensor& dout, int seq, Tensor& dhidden);
void gather_rows(Backend& be, const Tensor& src, const Tensor& rows, Tensor& dst);
void scatter_rows(Backend& be, const Tensor& src, const Tensor& rows, Tensor& dst);
// Packed sequences (Backend::attention_forward_packed): training passes dropout, stats and
// keep as attention_forward's, in the padded layout of d; inference, the overload without them.
void attention_forward_packed(Backend& be, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                              const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace);
void attention_forward_packed(Backend& be, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                              Tensor& ctx, Tensor& workspace);
void attention_backward_packed(Backend& be, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                               const Tensor& row_start, const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                               const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace);

void cross_entropy(Backend& be, const Tensor& logits, const Tensor& labels, float grad_scale, const Tensor* loss_scale,
                   Tensor& loss, Tensor& dlogits);
void mse(Backend& be, const Tensor& pred, const Tensor& target, float grad_scale, const Tensor* loss_scale,
         Tensor& loss, Tensor& dpred);

void sum_squares(Backend& be, const Tensor& x, Tensor& out);
void sum_squares(Backend& be, const Tensor* xs, int count, Tensor& out);  // any count
void clip_coefficient(Backend& be, const Tensor& sumsq, float max_norm, Tensor& norm_coef, Tensor* scaler = nullptr,
                      const LossScaling& ls = {});
void adamw(Backend& be, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
           const Tensor& norm_coef);
void adamw(Backend& be, const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef);
void elementwise_optimizer(Backend& be, ElementwiseOptimizer kind, const ElementwiseSlice* slices, int count,
                           const Tensor& scalars, const Tensor& norm_coef);  // any count
void adafactor(Backend& be, const AdafactorTensor& t, const Tensor& scalars, const Tensor& norm_coef,
               Tensor& workspace);
void optim_8bit(Backend& be, Optim8bitAlgo algo, const Optim8bitSlice* slices, int count, const Tensor& scalars,
                const Tensor& qmaps, const Tensor& norm_coef);  // any count

}  // namespace hone::ops
