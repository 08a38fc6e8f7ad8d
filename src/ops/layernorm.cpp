// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance), alone and
// fused with the residual dropout before it.
#include <algorithm>
#include <cmath>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

namespace {

// Checks x (named x_name), gamma and the per-row statistics; returns the normalized width.
int64_t check_layernorm(Backend& be, const char* op, const char* x_name, const Tensor& x, const Tensor& gamma,
                        const Tensor& mean, const Tensor& rstd) {
  detail::expect_compute(be, op, x_name, x);
  if (x.shape.rank < 1) fail("{}: {} has shape {}, expected rank >= 1", op, x_name, x.shape.str());
  const int64_t cols = x.shape[x.shape.rank - 1];
  const int64_t rows = cols ? x.numel() / cols : 0;
  detail::expect(op, "gamma", gamma, x.dtype, {cols});
  detail::expect(op, "mean", mean, DType::F32, {rows});
  detail::expect(op, "rstd", rstd, DType::F32, {rows});
  return cols;
}

}  // namespace

void layernorm_forward(Backend& be, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd) {
  const int64_t cols = check_layernorm(be, "layernorm_forward", "x", x, gamma, mean, rstd);
  if (beta.data) detail::expect("layernorm_forward", "beta", beta, x.dtype, {cols});  // empty: no bias
  detail::expect("layernorm_forward", "y", y, x.dtype, x.shape);
  if (be.dry_run) return;
  detail::OpScope scope(be, "layernorm_forward", OpClass::Normalization,
                        {8.0 * double(x.numel()), detail::bytes(x, gamma, beta, y, mean, rstd)});
  be.layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
}

void layernorm_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t cols = check_layernorm(be, "layernorm_backward", "x", x, gamma, mean, rstd);
  detail::expect("layernorm_backward", "dy", dy, x.dtype, x.shape);
  detail::expect("layernorm_backward", "dx", dx, x.dtype, x.shape);
  detail::expect("layernorm_backward", "dgamma", dgamma, DType::F32, {cols});
  if (dbeta.data) detail::expect("layernorm_backward", "dbeta", dbeta, DType::F32, {cols});
  if (be.dry_run) return;
  detail::OpScope scope(be, "layernorm_backward", OpClass::Normalization,
                        {12.0 * double(x.numel()), detail::bytes(dy, x, gamma, mean, rstd, dx, dgamma, dgamma, dbeta, dbeta)});
  be.layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
}

void dropout_add_layernorm_forward(Backend& be, const Tensor& x, const Tensor& residual, const DropoutSpec& d,
                                   const Tensor& gamma, const Tensor& beta, float eps, Tensor& sum, Tensor& y,
                                   Tensor& mean, Tensor& rstd) {
  const char* op = "dropout_add_layernorm_forward";
  detail::expect_dropout(op, d);
  const int64_t cols = check_layernorm(be, op, "x", x, gamma, mean, rstd);
  detail::expect(op, "residual", residual, x.dtype, x.shape);
  if (beta.data) detail::expect(op, "beta", beta, x.dtype, {cols});  // empty: no bias
  if (sum.data) detail::expect(op, "sum", sum, x.dtype, x.shape);  // empty: not kept (inference)
  detail::expect(op, "y", y, x.dtype, x.shape);
  if (be.dry_run) return;
  detail::expect_disjoint(op, {{"sum", sum}, {"y", y}, {"mean", mean}, {"rstd", rstd}},
                          {{"x", x}, {"residual", residual}, {"gamma", gamma}, {"beta", beta}}, {"sum", "x"});
  detail::OpScope scope(be, op, OpClass::Normalization,
                        {10.0 * double(x.numel()), detail::bytes(x, residual, gamma, beta, sum, y, mean, rstd)});
  be.dropout_add_layernorm_forward(x, residual, d, gamma, beta, eps, sum, y, mean, rstd);
}

void parts_add_layernorm_forward(Backend& be, const Tensor& parts, const Tensor* b, const Tensor& residual,
                                 const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                                 Tensor& rstd) {
  const char* op = "parts_add_layernorm_forward";
  const int64_t cols = check_layernorm(be, op, "residual", residual, gamma, mean, rstd);
  detail::expect_rank(op, "residual", residual, 2);
  detail::expect_rank(op, "parts", parts, 3);
  detail::expect(op, "parts", parts, DType::F32, {parts.shape[0], residual.shape[0], cols});
  if (b) detail::expect(op, "b", *b, residual.dtype, {cols});
  if (beta.data) detail::expect(op, "beta", beta, residual.dtype, {cols});  // empty: no bias
  detail::expect(op, "y", y, residual.dtype, residual.shape);
  if (be.dry_run) return;
  const Tensor none;
  detail::expect_disjoint(op, {{"y", y}, {"mean", mean}, {"rstd", rstd}},
                          {{"parts", parts}, {"b", b ? *b : none}, {"residual", residual}, {"gamma", gamma},
                           {"beta", beta}},
                          {});
  detail::OpScope scope(be, op, OpClass::Normalization,
                        {(9.0 + double(parts.shape[0])) * double(residual.numel()),
                         detail::bytes(parts, residual, gamma, beta, y, mean, rstd) + detail::bytes_if(b)});
  be.parts_add_layernorm_forward(parts, b, residual, gamma, beta, eps, y, mean, rstd);
}

int64_t linear_add_layernorm_work(const Backend& be, int64_t rows, int64_t n, int64_t k, DType t) {
  const int64_t splits = be.linear_splits(rows, n, k, t);
  const int64_t parts = splits > 1 ? splits * rows * n * int64_t(dtype_size(DType::F32) / dtype_size(t)) : 0;
  return std::max(rows * n, parts);
}

void linear_add_layernorm_forward(Backend& be, const Tensor& x, const Tensor& w, const Tensor* b,
                                  const Tensor& residual, const Tensor& gamma, const Tensor& beta, float eps,
                                  Tensor& work, Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "linear_add_layernorm_forward";
  detail::expect_rank(op, "x", x, 2);
  detail::expect_rank(op, "w", w, 2);
  detail::expect_rank(op, "work", work, 1);
  detail::expect_dtype(op, "work", work, x.dtype);
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  // The plan's work holds the split parts of its own row count; fewer rows at run time
  // split only if theirs fit, and the plain product's output always does.
  const int64_t splits = be.linear_splits(m, n, k, x.dtype);
  if (work.numel() < m * n)
    fail("{}: work of {} elements is less than the product's {} x {}", op, work.numel(), m, n);
  if (splits > 1 && work.bytes() >= size_t(splits * m * n) * dtype_size(DType::F32)) {
    Tensor parts{work.data, DType::F32, {splits, m, n}, work.device};
    linear_split_forward(be, x, w, parts);
    parts_add_layernorm_forward(be, parts, b, residual, gamma, beta, eps, y, mean, rstd);
    return;
  }
  Tensor out{work.data, x.dtype, {m, n}, work.device}, no_sum;
  linear_forward(be, x, w, b, out);
  dropout_add_layernorm_forward(be, out, residual, DropoutSpec{}, gamma, beta, eps, no_sum, y, mean, rstd);
}

void layernorm_dropout_backward(Backend& be, const Tensor& dy, const Tensor& sum, const Tensor& gamma,
                                const Tensor& mean, const Tensor& rstd, const DropoutSpec& d, Tensor& dsum, Tensor& dx,
                                Tensor& dgamma, Tensor& dbeta) {
  const char* op = "layernorm_dropout_backward";
  detail::expect_dropout(op, d);
  const int64_t cols = check_layernorm(be, op, "sum", sum, gamma, mean, rstd);
  detail::expect(op, "dy", dy, sum.dtype, sum.shape);
  detail::expect(op, "dsum", dsum, sum.dtype, sum.shape);
  detail::expect(op, "dx", dx, sum.dtype, sum.shape);
  detail::expect(op, "dgamma", dgamma, DType::F32, {cols});
  if (dbeta.data) detail::expect(op, "dbeta", dbeta, DType::F32, {cols});
  if (be.dry_run) return;
  detail::expect_disjoint(op, {{"dsum", dsum}, {"dx", dx}, {"dgamma", dgamma}, {"dbeta", dbeta}},
                          {{"dy", dy}, {"sum", sum}, {"gamma", gamma}, {"mean", mean}, {"rstd", rstd}},
                          {"dx", "dy"});
  detail::OpScope scope(be, op, OpClass::Normalization,
                        {14.0 * double(sum.numel()),
                         detail::bytes(dy, sum, gamma, mean, rstd, dsum, dx, dgamma, dgamma, dbeta, dbeta)});
  be.layernorm_dropout_backward(dy, sum, gamma, mean, rstd, d, dsum, dx, dgamma, dbeta);
}

}  // namespace ops

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                   Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  const float *xp = x.f32(), *gp = gamma.f32(), *bp = beta.data ? beta.f32() : nullptr;
  float *yp = y.f32(), *mp = mean.f32(), *rp = rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += xr[c];
    const double mu = sum / double(cols);
    double sq = 0;
    for (int64_t c = 0; c < cols; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
    const float m = float(mu), rs = float(1.0 / std::sqrt(sq / double(cols) + double(eps)));
    float* yr = yp + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * rs * gp[c] + (bp ? bp[c] : 0.0f);
    mp[r] = m;
    rp[r] = rs;
  }
}

void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                    const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t cols = x.shape[x.shape.rank - 1], rows = mean.numel();
  const float *dyp = dy.f32(), *xp = x.f32(), *gp = gamma.f32(), *mp = mean.f32(), *rp = rstd.f32();
  float *dxp = dx.f32(), *dgp = dgamma.f32(), *dbp = dbeta.data ? dbeta.f32() : nullptr;

  // Parameter gradients first (so that dx may alias dy), one block of columns per
  // iteration: no two threads add into the same element.
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
    const int64_t c1 = std::min(cols, c0 + kBlock);
    double dg[kBlock] = {}, db[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float *dyr = dyp + r * cols, *xr = xp + r * cols;
      for (int64_t c = c0; c < c1; ++c) {
        dg[c - c0] += double(dyr[c]) * ((xr[c] - mp[r]) * rp[r]);
        db[c - c0] += dyr[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dgp[c] += float(dg[c - c0]);
      if (dbp) dbp[c] += float(db[c - c0]);
    }
  }

  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float *dyr = dyp + r * cols, *xr = xp + r * cols;
    const float m = mp[r], rs = rp[r];
    double sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = double(dyr[c]) * gp[c];
      sum_g += g;
      sum_gx += g * ((xr[c] - m) * rs);
    }
    const float mean_g = float(sum_g / double(cols)), mean_gx = float(sum_gx / double(cols));
    float* dxr = dxp + r * cols;
    for (int64_t c = 0; c < cols; ++c) dxr[c] = rs * (dyr[c] * gp[c] - mean_g - (xr[c] - m) * rs * mean_gx);
  }
}

// The composition of the unfused ops: the reference that the fused kernels are held to.
// Without sum, y holds it until the normalization overwrites it in place.
void CpuBackend::dropout_add_layernorm_forward(const Tensor& x, const Tensor& residual, const DropoutSpec& d,
                                               const Tensor& gamma, const Tensor& beta, float eps, Tensor& sum,
                                               Tensor& y, Tensor& mean, Tensor& rstd) {
  Tensor& kept = sum.data ? sum : y;
  dropout_add(x, residual, d, kept);
  layernorm_forward(kept, gamma, beta, eps, y, mean, rstd);
}

// out = sum of the parts + b into y, then y + residual normalized in place (F32: no
// rounding between).
void CpuBackend::parts_add_layernorm_forward(const Tensor& parts, const Tensor* b, const Tensor& residual,
                                             const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                             Tensor& mean, Tensor& rstd) {
  const int64_t splits = parts.shape[0], size = residual.numel(), cols = residual.shape[1];
  const float *pp = parts.f32(), *rp = residual.f32(), *bp = b ? b->f32() : nullptr;
  float* yp = y.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < size; ++i) {
    float out = pp[i];
    for (int64_t s = 1; s < splits; ++s) out += pp[s * size + i];
    if (bp) out += bp[i % cols];
    yp[i] = rp[i] + out;
  }
  layernorm_forward(y, gamma, beta, eps, y, mean, rstd);
}

void CpuBackend::layernorm_dropout_backward(const Tensor& dy, const Tensor& sum, const Tensor& gamma,
                                            const Tensor& mean, const Tensor& rstd, const DropoutSpec& d,
                                            Tensor& dsum, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  layernorm_backward(dy, sum, gamma, mean, rstd, dsum, dgamma, dbeta);
  dropout(dsum, d, dx);  // after dy is read: dx may alias it
}

}  // namespace hone
