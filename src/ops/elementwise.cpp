// Activations, tanh and dropout: one independent element at a time, so outputs may
// alias inputs.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/cpu_activation.h"
#include "ops/cpu_dropout.h"
#include "ops/cpu_gelu.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

namespace {

void check_same(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  detail::expect_dtype(op, name, t, ref.dtype);
  if (!(t.shape == ref.shape))
    fail("{}: {} has shape {}, expected {} (the shape of {})", op, name, t.shape.str(), ref.shape.str(), ref_name);
}

}  // namespace

void activation_forward(Backend& be, Activation a, const Tensor& x, Tensor& y) {
  detail::expect_compute(be, "activation_forward", "x", x);
  check_same("activation_forward", "y", y, "x", x);
  if (be.dry_run) return;
  detail::OpScope scope(be, "activation_forward", OpClass::Elementwise, {0, detail::bytes(x, y)});
  be.activation_forward(a, x, y);
}

void activation_backward(Backend& be, Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  detail::expect_compute(be, "activation_backward", "x", x);
  check_same("activation_backward", "dy", dy, "x", x);
  check_same("activation_backward", "dx", dx, "x", x);
  if (be.dry_run) return;
  detail::OpScope scope(be, "activation_backward", OpClass::Elementwise, {0, detail::bytes(dy, x, dx)});
  be.activation_backward(a, dy, x, dx);
}

namespace {

// x [rows, 2I] against y [rows, I]; returns I.
int64_t check_gated(Backend& be, const char* op, const Tensor& x, const Tensor& y, const char* y_name) {
  detail::expect_compute(be, op, "x", x);
  detail::expect_rank(op, "x", x, 2);
  if (x.shape[1] % 2 != 0) fail("{}: x has shape {}, whose columns are not input and gate halves", op, x.shape.str());
  detail::expect(op, y_name, y, x.dtype, {x.shape[0], x.shape[1] / 2});
  return x.shape[1] / 2;
}

}  // namespace

void gated_activation_forward(Backend& be, Activation a, const Tensor& x, Tensor& y) {
  const char* op = "gated_activation_forward";
  check_gated(be, op, x, y, "y");
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Elementwise, {0, detail::bytes(x, y)});
  be.gated_activation_forward(a, x, y);
}

void gated_activation_backward(Backend& be, Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gated_activation_backward";
  check_gated(be, op, x, dy, "dy");
  detail::expect(op, "dx", dx, x.dtype, x.shape);
  if (be.dry_run) return;
  detail::expect_disjoint(op, {{"dx", dx}}, {{"dy", dy}, {"x", x}}, {"", ""});
  detail::OpScope scope(be, op, OpClass::Elementwise, {0, detail::bytes(dy, x, dx)});
  be.gated_activation_backward(a, dy, x, dx);
}

void tanh_forward(Backend& be, const Tensor& x, Tensor& y) {
  detail::expect_compute(be, "tanh_forward", "x", x);
  check_same("tanh_forward", "y", y, "x", x);
  if (be.dry_run) return;
  detail::OpScope scope(be, "tanh_forward", OpClass::Elementwise, {0, detail::bytes(x, y)});
  be.tanh_forward(x, y);
}

void tanh_backward(Backend& be, const Tensor& dy, const Tensor& y, Tensor& dx) {
  detail::expect_compute(be, "tanh_backward", "y", y);
  check_same("tanh_backward", "dy", dy, "y", y);
  check_same("tanh_backward", "dx", dx, "y", y);
  if (be.dry_run) return;
  detail::OpScope scope(be, "tanh_backward", OpClass::Elementwise, {0, detail::bytes(dy, y, dx)});
  be.tanh_backward(dy, y, dx);
}

void dropout(Backend& be, const Tensor& x, const DropoutSpec& d, Tensor& y) {
  detail::expect_dropout("dropout", d);
  detail::expect_compute(be, "dropout", "x", x);
  check_same("dropout", "y", y, "x", x);
  if (be.dry_run) return;
  // Without dropping, in place (evaluation, inference) it moves nothing.
  const bool moves = d.p > 0.0f || x.data != y.data;
  detail::OpScope scope(be, "dropout", OpClass::Elementwise, {0, moves ? detail::bytes(x, y) : 0.0});
  be.dropout(x, d, y);
}

void dropout_add(Backend& be, const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out) {
  detail::expect_dropout("dropout_add", d);
  detail::expect_compute(be, "dropout_add", "x", x);
  check_same("dropout_add", "residual", residual, "x", x);
  check_same("dropout_add", "out", out, "x", x);
  if (be.dry_run) return;
  detail::OpScope scope(be, "dropout_add", OpClass::Elementwise, {0, detail::bytes(x, residual, out)});
  be.dropout_add(x, residual, d, out);
}

}  // namespace ops

namespace {

constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluCubic = 0.044715f;
using cpu_gelu::gelu;
using cpu_gelu::gelu_grad;

// As the erf GELU's (cpu_gelu.h), the tanh GELU and its gradient share t = tanh(...): the
// *_from forms take it, so that a pass wanting both computes it once, to the same bits.
float gelu_tanh_t(float x) { return std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)); }
float gelu_tanh_from(float x, float t) { return 0.5f * x * (1.0f + t); }
float gelu_tanh_grad_from(float x, float t) {
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}
float gelu_tanh(float x) { return gelu_tanh_from(x, gelu_tanh_t(x)); }
float gelu_tanh_grad(float x) { return gelu_tanh_grad_from(x, gelu_tanh_t(x)); }

// f(i) for i in [0, n), in parallel.
template <typename F>
void for_each_index(int64_t n, F f) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// f(lo, hi) over [0, n) in parallel, in ranges of whole 16-element groups.
template <typename F>
void for_each_range(int64_t n, F f) {
  constexpr int64_t kRange = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t lo = 0; lo < n; lo += kRange) f(lo, std::min(n, lo + kRange));
}

// f(i, keep) over the mask of `d` for elements [0, n), in parallel chunks whose size is
// a multiple of 64 so that no Philox block is computed twice.
template <typename F>
void for_each_keep_parallel(const DropoutSpec& d, int64_t n, F f) {
  constexpr int64_t kChunk = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    uint8_t keep[kChunk];
    cpu_dropout::keep_mask(d, uint64_t(c0), m, keep);
    for (int64_t k = 0; k < m; ++k) f(c0 + k, keep[k] != 0);
  }
}

}  // namespace

void CpuBackend::activation_forward(Activation a, const Tensor& x, Tensor& y) {
  const float* xp = x.f32();
  float* yp = y.f32();
  switch (a) {
    case Activation::Gelu:
      return for_each_range(x.numel(), [&](int64_t lo, int64_t hi) { cpu_gelu::forward(xp + lo, yp + lo, hi - lo); });
    case Activation::GeluTanh: return for_each_index(x.numel(), [&](int64_t i) { yp[i] = gelu_tanh(xp[i]); });
    case Activation::Relu: return for_each_index(x.numel(), [&](int64_t i) { yp[i] = std::max(xp[i], 0.0f); });
  }
}

void CpuBackend::activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  const float *dyp = dy.f32(), *xp = x.f32();
  float* dxp = dx.f32();
  switch (a) {
    case Activation::Gelu:
      return for_each_range(x.numel(), [&](int64_t lo, int64_t hi) {
        cpu_gelu::backward(dyp + lo, xp + lo, dxp + lo, hi - lo);
      });
    case Activation::GeluTanh:
      return for_each_index(x.numel(), [&](int64_t i) { dxp[i] = dyp[i] * gelu_tanh_grad(xp[i]); });
    case Activation::Relu:  // zero gradient at 0, as torch
      return for_each_index(x.numel(), [&](int64_t i) { dxp[i] = xp[i] > 0.0f ? dyp[i] : 0.0f; });
  }
}

void activation_with_grad(Activation a, const Tensor& x, Tensor& y, Tensor& g) {
  const float* xp = x.f32();
  float *yp = y.f32(), *gp = g.f32();
  switch (a) {
    case Activation::Gelu:
      return for_each_range(x.numel(), [&](int64_t lo, int64_t hi) {
        cpu_gelu::forward_with_grad(xp + lo, yp + lo, gp + lo, hi - lo);
      });
    case Activation::GeluTanh:
      return for_each_index(x.numel(), [&](int64_t i) {
        const float t = gelu_tanh_t(xp[i]);
        yp[i] = gelu_tanh_from(xp[i], t);
        gp[i] = gp[i] * gelu_tanh_grad_from(xp[i], t);
      });
    case Activation::Relu:
      return for_each_index(x.numel(), [&](int64_t i) {
        yp[i] = std::max(xp[i], 0.0f);
        gp[i] = xp[i] > 0.0f ? gp[i] : 0.0f;
      });
  }
}

namespace {

float activate(Activation a, float x) {
  switch (a) {
    case Activation::Gelu: return gelu(x);
    case Activation::GeluTanh: return gelu_tanh(x);
    case Activation::Relu: return std::max(x, 0.0f);
  }
  return x;
}

float activation_grad(Activation a, float x) {
  switch (a) {
    case Activation::Gelu: return gelu_grad(x);
    case Activation::GeluTanh: return gelu_tanh_grad(x);
    case Activation::Relu: return x > 0.0f ? 1.0f : 0.0f;
  }
  return 1.0f;
}

}  // namespace

void CpuBackend::gated_activation_forward(Activation a, const Tensor& x, Tensor& y) {
  const int64_t rows = x.shape[0], half = x.shape[1] / 2;
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < half; ++c) yp[r * half + c] = activate(a, xp[r * 2 * half + c]) * xp[r * 2 * half + half + c];
}

void CpuBackend::gated_activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t rows = x.shape[0], half = x.shape[1] / 2;
  const float *dyp = dy.f32(), *xp = x.f32();
  float* dxp = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < half; ++c) {
      const float u = xp[r * 2 * half + c], v = xp[r * 2 * half + half + c], d = dyp[r * half + c];
      dxp[r * 2 * half + c] = d * v * activation_grad(a, u);
      dxp[r * 2 * half + half + c] = d * activate(a, u);
    }
}

void CpuBackend::tanh_forward(const Tensor& x, Tensor& y) {
  const float* xp = x.f32();
  float* yp = y.f32();
  for_each_index(x.numel(), [&](int64_t i) { yp[i] = std::tanh(xp[i]); });
}

void CpuBackend::tanh_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  const float *dyp = dy.f32(), *yp = y.f32();
  float* dxp = dx.f32();
  for_each_index(y.numel(), [&](int64_t i) { dxp[i] = dyp[i] * (1.0f - yp[i] * yp[i]); });
}

void CpuBackend::dropout(const Tensor& x, const DropoutSpec& d, Tensor& y) {
  const float* xp = x.f32();
  float* yp = y.f32();
  if (d.p == 0.0f) {
    if (yp != xp) std::memcpy(yp, xp, x.bytes());
    return;
  }
  const float scale = 1.0f / (1.0f - d.p);
  for_each_keep_parallel(d, x.numel(), [&](int64_t i, bool keep) { yp[i] = keep ? xp[i] * scale : 0.0f; });
}

void CpuBackend::dropout_add(const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out) {
  const float *xp = x.f32(), *rp = residual.f32();
  float* op = out.f32();
  if (d.p == 0.0f) return for_each_index(x.numel(), [&](int64_t i) { op[i] = rp[i] + xp[i]; });
  const float scale = 1.0f / (1.0f - d.p);
  for_each_keep_parallel(d, x.numel(), [&](int64_t i, bool keep) { op[i] = rp[i] + (keep ? xp[i] * scale : 0.0f); });
}

}  // namespace hone
