#pragma once
// The fp32 reference backend: BLAS for matrix products, OpenMP for the rest.
#include <string>

#include "hone/backend.h"

namespace hone {

// OpenBLAS's kernels for this CPU where it fell back to generic ones (blas_kernels.cpp);
// every CpuBackend calls it before its first product. blas_kernels() names those in use.
void select_blas_kernels();
const char* blas_kernels();

// Whether this build can run the CPU's bf16 products (it has oneDNN); `why` says what is
// missing otherwise. cpu_has_amx: whether the CPU has AMX-BF16 tiles, where they beat F32.
bool cpu_bf16_products_available(std::string* why);
bool cpu_has_amx();

class CpuBackend final : public Backend {
 public:
  // Makes BLAS single-threaded: the ops split work across OpenMP threads themselves, and
  // two thread pools spinning on the same cores slow each other down several-fold.
  // bf16_products (`--bf16` on the CPU): the linear layers' products take bf16 operands
  // with F32 sums and results (cpu_bf16_products.h); everything else stays F32.
  explicit CpuBackend(bool bf16_products = false);
  bool bf16_products() const override { return bf16_products_; }
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  void* allocate(size_t bytes) override;
  void deallocate(void* p) noexcept override;

  void fill(Tensor& x, float value) override;
  void fill_normal(Tensor& x, float std, uint64_t seed, uint64_t stream) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void read(const Tensor& src, float* host, size_t n) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void add_scaled(const Tensor& x, float alpha, Tensor& y) override;
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  void linear_split_forward(const Tensor& x, const Tensor& w, Tensor& parts) override;
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
  int64_t attention_workspace_elems(const AttentionDims& d, DType t) const override;
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
  bool packs_attention(const AttentionDims&, DType t) const override { return t == DType::F32; }
  bool packs_training_attention(const AttentionDims&, DType t) const override { return t == DType::F32; }
  bool packs_training() const override { return pack_training; }
  bool pack_training = true;  // false: train on the padded batch (tests compare the two)
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

 private:
  bool bf16_products_;
};

}  // namespace hone
