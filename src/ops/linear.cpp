// Fully connected layer; w is [N, K] as in torch.nn.Linear.
#include <cblas.h>

#include <algorithm>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

namespace {

struct LinearDims {
  int64_t m, k, n;
};

// Checks x [M, K] and w [N, K].
LinearDims linear_dims(const char* op, const Tensor& x, const Tensor& w) {
  detail::expect_dtype(op, "x", x, DType::F32);
  detail::expect_dtype(op, "w", w, DType::F32);
  detail::expect_rank(op, "x", x, 2);
  detail::expect_rank(op, "w", w, 2);
  if (w.shape[1] != x.shape[1])
    fail("{}: w has shape {}, expected [N, {}] for x of shape {}", op, w.shape.str(), x.shape[1], x.shape.str());
  return {x.shape[0], x.shape[1], w.shape[0]};
}

}  // namespace

void linear_forward(Backend& be, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const auto [m, k, n] = linear_dims("linear_forward", x, w);
  if (b) detail::expect("linear_forward", "b", *b, DType::F32, {n});
  detail::expect("linear_forward", "y", y, DType::F32, {m, n});
  if (be.dry_run) return;
  be.linear_forward(x, w, b, y);
}

void linear_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                     Tensor& dw, Tensor* db) {
  const auto [m, k, n] = linear_dims("linear_backward", x, w);
  detail::expect("linear_backward", "dy", dy, DType::F32, {m, n});
  if (dx) detail::expect("linear_backward", "dx", *dx, DType::F32, {m, k});
  detail::expect("linear_backward", "dw", dw, DType::F32, {n, k});
  if (db) detail::expect("linear_backward", "db", *db, DType::F32, {n});
  if (be.dry_run) return;
  be.linear_backward(dy, x, w, dx, accumulate_dx, dw, db);
}

}  // namespace ops

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int m = int(x.shape[0]), k = int(x.shape[1]), n = int(w.shape[0]);
  float* yp = y.f32();
  float beta = 0.0f;
  if (b) {
    // Start from the bias in every row and let the product add to it.
    const float* bp = b->f32();
#pragma omp parallel for schedule(static)
    for (int i = 0; i < m; ++i) std::copy(bp, bp + n, yp + int64_t(i) * n);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.f32(), k, w.f32(), k, beta, yp, n);
}

void CpuBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                                 Tensor& dw, Tensor* db) {
  const int m = int(x.shape[0]), k = int(x.shape[1]), n = int(w.shape[0]);
  const float* dyp = dy.f32();
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dyp, n, w.f32(), k,
                accumulate_dx ? 1.0f : 0.0f, dx->f32(), k);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dyp, n, x.f32(), k, 1.0f, dw.f32(), k);
  if (!db) return;
  // Column sums, one block of columns per iteration so that rows are read contiguously.
  constexpr int kBlock = 64;
  float* dbp = db->f32();
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < n; c0 += kBlock) {
    const int c1 = std::min(n, c0 + kBlock);
    double acc[kBlock] = {};
    for (int i = 0; i < m; ++i) {
      const float* row = dyp + int64_t(i) * n;
      for (int c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) dbp[c] += float(acc[c - c0]);
  }
}

}  // namespace hone
