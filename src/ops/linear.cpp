// Fully connected layer; w is [N, K] as in torch.nn.Linear.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/cpu_activation.h"
#include "ops/cpu_bf16_products.h"
#include "ops/cpu_pages.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

namespace {

struct LinearDims {
  int64_t m, k, n;
};

// Checks x [M, K] and w [N, K].
LinearDims linear_dims(Backend& be, const char* op, const Tensor& x, const Tensor& w) {
  detail::expect_compute(be, op, "x", x);
  detail::expect_dtype(op, "w", w, x.dtype);
  detail::expect_rank(op, "x", x, 2);
  detail::expect_rank(op, "w", w, 2);
  if (w.shape[1] != x.shape[1])
    fail("{}: w has shape {}, expected [N, {}] for x of shape {}", op, w.shape.str(), x.shape[1], x.shape.str());
  return {x.shape[0], x.shape[1], w.shape[0]};
}

}  // namespace

void linear_forward(Backend& be, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const auto [m, k, n] = linear_dims(be, "linear_forward", x, w);
  if (b) detail::expect("linear_forward", "b", *b, x.dtype, {n});
  detail::expect("linear_forward", "y", y, x.dtype, {m, n});
  if (be.dry_run) return;
  detail::OpScope scope(be, "linear_forward", OpClass::Contraction,
                        {2.0 * double(m) * double(k) * double(n), detail::bytes(x, w, y) + detail::bytes_if(b)});
  be.linear_forward(x, w, b, y);
}

void linear_split_forward(Backend& be, const Tensor& x, const Tensor& w, Tensor& parts) {
  const char* op = "linear_split_forward";
  const auto [m, k, n] = linear_dims(be, op, x, w);
  detail::expect_rank(op, "parts", parts, 3);
  const int64_t splits = parts.shape[0];
  if (splits < 1 || k % splits)
    fail("{}: {} parts do not divide x's {} columns", op, splits, k);
  detail::expect(op, "parts", parts, DType::F32, {splits, m, n});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Contraction,
                        {2.0 * double(m) * double(k) * double(n), detail::bytes(x, w, parts)});
  be.linear_split_forward(x, w, parts);
}

void linear_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                     Tensor& dw, Tensor* db) {
  const auto [m, k, n] = linear_dims(be, "linear_backward", x, w);
  detail::expect("linear_backward", "dy", dy, x.dtype, {m, n});
  if (dx) detail::expect("linear_backward", "dx", *dx, x.dtype, {m, k});
  detail::expect("linear_backward", "dw", dw, DType::F32, {n, k});
  if (db) detail::expect("linear_backward", "db", *db, DType::F32, {n});
  if (be.dry_run) return;
  // dw is read and written (it accumulates); dx too when accumulating.
  detail::OpScope scope(be, "linear_backward", OpClass::Contraction,
                        {(dx ? 4.0 : 2.0) * double(m) * double(k) * double(n),
                         detail::bytes(dy, x, w, dw, dw) + detail::bytes_if(dx) * (accumulate_dx ? 2 : 1) +
                             2 * detail::bytes_if(db)});
  be.linear_backward(dy, x, w, dx, accumulate_dx, dw, db);
}

void linear_activation_forward(Backend& be, Activation a, const Tensor& x, const Tensor& w, const Tensor* b,
                               Tensor& pre, Tensor& y) {
  const char* op = "linear_activation_forward";
  const auto [m, k, n] = linear_dims(be, op, x, w);
  if (b) detail::expect(op, "b", *b, x.dtype, {n});
  if (pre.data) detail::expect(op, "pre", pre, x.dtype, {m, n});  // empty: nothing keeps the product
  detail::expect(op, "y", y, x.dtype, {m, n});
  if (be.dry_run) return;
  const Tensor none;
  detail::expect_disjoint(op, {{"pre", pre}, {"y", y}}, {{"x", x}, {"w", w}, {"b", b ? *b : none}}, {});
  detail::OpScope scope(be, op, OpClass::Contraction,
                        {2.0 * double(m) * double(k) * double(n),
                         detail::bytes(x, w, pre, y) + detail::bytes_if(b)});  // an empty pre counts 0
  be.linear_activation_forward(a, x, w, b, pre, y);
}

void activation_linear_backward(Backend& be, Activation a, const Tensor& dy, const Tensor& pre, const Tensor& w,
                                Tensor& y, Tensor& dpre, Tensor& dw, Tensor* db, Tensor* db_pre) {
  const char* op = "activation_linear_backward";
  detail::expect_compute(be, op, "pre", pre);
  detail::expect_dtype(op, "w", w, pre.dtype);
  detail::expect_rank(op, "w", w, 2);
  detail::expect_rank(op, "dy", dy, 2);
  const int64_t m = dy.shape[0], n = w.shape[0], k = w.shape[1];
  detail::expect(op, "dy", dy, pre.dtype, {m, n});
  detail::expect_shape(op, "pre", pre, {m, k});
  detail::expect(op, "y", y, pre.dtype, {m, k});
  detail::expect(op, "dpre", dpre, pre.dtype, {m, k});
  detail::expect(op, "dw", dw, DType::F32, {n, k});
  if (db) detail::expect(op, "db", *db, DType::F32, {n});
  if (db_pre) detail::expect(op, "db_pre", *db_pre, DType::F32, {k});
  if (be.dry_run) return;
  const Tensor none;
  detail::expect_disjoint(op,
                          {{"y", y}, {"dpre", dpre}, {"dw", dw}, {"db", db ? *db : none},
                           {"db_pre", db_pre ? *db_pre : none}},
                          {{"dy", dy}, {"pre", pre}, {"w", w}}, {});
  detail::OpScope scope(be, op, OpClass::Contraction,
                        {4.0 * double(m) * double(k) * double(n),
                         detail::bytes(dy, pre, w, y, dpre, dw, dw) + 2 * detail::bytes_if(db) +
                             2 * detail::bytes_if(db_pre)});
  be.activation_linear_backward(a, dy, pre, w, y, dpre, dw, db, db_pre);
}

}  // namespace ops

namespace {

// OpenMP owns the cores and BLAS runs single-threaded (see CpuBackend's constructor): a
// product is split into one block of output rows per thread.
template <typename Fn>
void split_rows(int rows, Fn&& fn) {
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int lo = int(int64_t(rows) * t / nt), hi = int(int64_t(rows) * (t + 1) / nt);
    if (hi > lo) fn(lo, hi);
  }
}

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int m = int(x.shape[0]), k = int(x.shape[1]), n = int(w.shape[0]);
  float* yp = y.f32();
  const float* xp = x.f32();
  const float* bp = b ? b->f32() : nullptr;
  if (bf16_products_) {  // one product, which oneDNN spreads over the threads itself
    if (bp)
      for (int i = 0; i < m; ++i) std::copy(bp, bp + n, yp + int64_t(i) * n);
    return cpu_bf16::product(false, true, m, n, k, xp, k, w.f32(), k, bp != nullptr, yp, n);
  }
  split_rows(m, [&](int lo, int hi) {
    // Start from the bias in every row and let the product add to it.
    if (bp)
      for (int i = lo; i < hi; ++i) std::copy(bp, bp + n, yp + int64_t(i) * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, n, k, 1.0f, xp + int64_t(lo) * k, k, w.f32(), k,
                bp ? 1.0f : 0.0f, yp + int64_t(lo) * n, n);
  });
}

void CpuBackend::linear_split_forward(const Tensor& x, const Tensor& w, Tensor& parts) {
  const int m = int(x.shape[0]), k = int(x.shape[1]), n = int(w.shape[0]), splits = int(parts.shape[0]);
  const int ks = k / splits;
  for (int s = 0; s < splits; ++s) {
    const float* xp = x.f32() + int64_t(s) * ks;
    const float* wp = w.f32() + int64_t(s) * ks;
    float* part = parts.f32() + int64_t(s) * m * n;
    if (bf16_products_) {
      cpu_bf16::product(false, true, m, n, ks, xp, k, wp, k, false, part, n);
      continue;
    }
    split_rows(m, [&](int lo, int hi) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, n, ks, 1.0f, xp + int64_t(lo) * k, k, wp, k, 0.0f,
                  part + int64_t(lo) * n, n);
    });
  }
}

namespace {

// db += column sums of dy [m, n], one block of columns per iteration so that rows are
// read contiguously.
void add_column_sums(const Tensor& dy, Tensor& db) {
  const int m = int(dy.shape[0]), n = int(dy.shape[1]);
  const float* dyp = dy.f32();
  constexpr int kBlock = 64;
  float* dbp = db.f32();
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

// dx = dy w (plus dx when accumulating).
void input_grad(const Tensor& dy, const Tensor& w, Tensor& dx, bool accumulate, bool bf16) {
  const int m = int(dy.shape[0]), k = int(w.shape[1]), n = int(w.shape[0]);
  if (bf16) return cpu_bf16::product(false, false, m, k, n, dy.f32(), n, w.f32(), k, accumulate, dx.f32(), k);
  split_rows(m, [&](int lo, int hi) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, k, n, 1.0f, dy.f32() + int64_t(lo) * n, n,
                w.f32(), k, accumulate ? 1.0f : 0.0f, dx.f32() + int64_t(lo) * k, k);
  });
}

}  // namespace

void CpuBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, bool accumulate_dx,
                                 Tensor& dw, Tensor* db) {
  const int m = int(x.shape[0]), k = int(x.shape[1]), n = int(w.shape[0]);
  const float* dyp = dy.f32();
  if (dx) input_grad(dy, w, *dx, accumulate_dx, bf16_products_);
  cpu_pages::claim_for_write(dw.data, dw.bytes());  // the product adds to dw: it reads before writing
  if (bf16_products_) {
    cpu_bf16::product(true, false, n, k, m, dyp, n, x.f32(), k, true, dw.f32(), k);
  } else {
    // dw rows [lo, hi) take columns [lo, hi) of dy.
    split_rows(n, [&](int lo, int hi) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, k, m, 1.0f, dyp + lo, n, x.f32(), k, 1.0f,
                  dw.f32() + int64_t(lo) * k, k);
    });
  }
  if (db) add_column_sums(dy, *db);
}

// The unfused ops in sequence: the reference the CUDA epilogues are held to.
void CpuBackend::linear_activation_forward(Activation a, const Tensor& x, const Tensor& w, const Tensor* b,
                                           Tensor& pre, Tensor& y) {
  if (!pre.data) {  // not kept: the activation in place
    linear_forward(x, w, b, y);
    return activation_forward(a, y, y);
  }
  linear_forward(x, w, b, pre);
  activation_forward(a, pre, y);
}

// As the unfused ops, to the bit, with dy w first: then one pass over pre gives y, which dw
// needs, and act'(pre) from one erf per element rather than two.
void CpuBackend::activation_linear_backward(Activation a, const Tensor& dy, const Tensor& pre, const Tensor& w,
                                            Tensor& y, Tensor& dpre, Tensor& dw, Tensor* db, Tensor* db_pre) {
  input_grad(dy, w, dpre, false, bf16_products_);
  activation_with_grad(a, pre, y, dpre);
  if (db_pre) add_column_sums(dpre, *db_pre);
  linear_backward(dy, y, w, nullptr, false, dw, db);
}

}  // namespace hone
