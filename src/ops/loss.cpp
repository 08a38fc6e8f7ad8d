// Losses of the classification heads: cross entropy (single-label classification) and
// mean squared error (regression), as SequenceClassifier computes them.
#include <algorithm>
#include <cmath>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

namespace {
void check_loss_scale(const char* op, const Tensor* loss_scale) {
  if (loss_scale && (loss_scale->dtype != DType::F32 || loss_scale->numel() < 1))
    fail("{}: loss_scale has dtype {} and {} elements, expected F32 with at least 1", op,
         dtype_name(loss_scale->dtype), loss_scale->numel());
}
}  // namespace

void cross_entropy(Backend& be, const Tensor& logits, const Tensor& labels, float grad_scale, const Tensor* loss_scale,
                   Tensor& loss, Tensor& dlogits) {
  detail::expect_compute(be, "cross_entropy", "logits", logits);
  check_loss_scale("cross_entropy", loss_scale);
  detail::expect_rank("cross_entropy", "logits", logits, 2);
  detail::expect("cross_entropy", "labels", labels, DType::I32, {logits.shape[0]});
  detail::expect("cross_entropy", "loss", loss, DType::F32, {1});
  detail::expect("cross_entropy", "dlogits", dlogits, logits.dtype, logits.shape);
  if (be.dry_run) return;
  detail::OpScope scope(be, "cross_entropy", OpClass::Normalization, {0, detail::bytes(logits, labels, loss, dlogits)});
  be.cross_entropy(logits, labels, grad_scale, loss_scale, loss, dlogits);
}

void mse(Backend& be, const Tensor& pred, const Tensor& target, float grad_scale, const Tensor* loss_scale,
         Tensor& loss, Tensor& dpred) {
  detail::expect_compute(be, "mse", "pred", pred);
  check_loss_scale("mse", loss_scale);
  const int64_t batch = pred.shape.rank >= 1 ? pred.shape[0] : 0;
  if (!(pred.shape == Shape{batch} || pred.shape == Shape{batch, 1}))
    fail("mse: pred has shape {}, expected [B] or [B, 1]", pred.shape.str());
  detail::expect("mse", "target", target, DType::F32, {batch});
  detail::expect("mse", "loss", loss, DType::F32, {1});
  detail::expect("mse", "dpred", dpred, pred.dtype, pred.shape);
  if (be.dry_run) return;
  detail::OpScope scope(be, "mse", OpClass::Normalization, {0, detail::bytes(pred, target, loss, dpred)});
  be.mse(pred, target, grad_scale, loss_scale, loss, dpred);
}

}  // namespace ops

namespace {
constexpr int32_t kIgnoreIndex = -100;  // torch.nn.CrossEntropyLoss's default
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, const Tensor* loss_scale,
                               Tensor& loss, Tensor& dlogits) {
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  const int32_t* lp = labels.ptr<int32_t>();
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (lp[r] == kIgnoreIndex) continue;
    if (lp[r] < 0 || lp[r] >= classes)
      fail("cross_entropy: label {} of row {} is out of range for {} classes", lp[r], r, classes);
    ++valid;
  }
  const float* xp = logits.f32();
  float* dp = dlogits.f32();
  // With no valid row the loss is 0 and so is every gradient (torch gives NaN; a batch of
  // only ignored rows should not poison training).
  const double scale = double(grad_scale) * (loss_scale ? double(loss_scale->f32()[0]) : 1.0);
  const double coef = valid ? scale / double(valid) : 0.0;
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = xp + r * classes;
    float* dx = dp + r * classes;
    const int32_t label = lp[r];
    if (label == kIgnoreIndex) {
      std::fill(dx, dx + classes, 0.0f);
      continue;
    }
    double mx = x[0];
    for (int64_t c = 1; c < classes; ++c) mx = std::max(mx, double(x[c]));
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[c] - mx);
    const double lse = mx + std::log(sum);
    total += lse - x[label];  // before dx is written: dlogits may alias logits
    for (int64_t c = 0; c < classes; ++c)
      dx[c] = float((std::exp(x[c] - lse) - (c == label ? 1.0 : 0.0)) * coef);
  }
  loss.f32()[0] = valid ? float(total / double(valid)) : 0.0f;
}

void CpuBackend::mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor* loss_scale,
                     Tensor& loss, Tensor& dpred) {
  const int64_t n = target.numel();
  const float *pp = pred.f32(), *tp = target.f32();
  float* dp = dpred.f32();
  const double scale = double(grad_scale) * (loss_scale ? double(loss_scale->f32()[0]) : 1.0);
  const double coef = n ? 2.0 * scale / double(n) : 0.0;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = double(pp[i]) - tp[i];
    total += diff * diff;
    dp[i] = float(diff * coef);
  }
  loss.f32()[0] = n ? float(total / double(n)) : 0.0f;
}

}  // namespace hone
