// transformers' Adafactor (relative_step and scale_parameter off, as Trainer builds it),
// one parameter tensor per call. Means and the update's RMS are summed in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

void adafactor(Backend& be, const AdafactorTensor& t, const Tensor& scalars, const Tensor& norm_coef,
               Tensor& workspace) {
  const char* op = "adafactor";
  const Shape flat{t.rows * t.cols};
  detail::expect(op, "param", t.param, DType::F32, flat);
  detail::expect(op, "grad", t.grad, DType::F32, flat);
  if (t.factored) {
    detail::expect(op, "row", t.row, DType::F32, {t.rows});
    detail::expect(op, "col", t.col, DType::F32, {t.cols});
  } else {
    if (t.rows != 1) fail("adafactor: an unfactored tensor has 1 row, got {}", t.rows);
    detail::expect(op, "v", t.v, DType::F32, flat);
  }
  if (t.m.data) detail::expect(op, "m", t.m, DType::F32, flat);
  if (t.half.data) {
    if (t.half.dtype != DType::BF16 && t.half.dtype != DType::F16)
      fail("adafactor: half has dtype {}, expected BF16 or F16", dtype_name(t.half.dtype));
    detail::expect_shape(op, "half", t.half, flat);
  }
  detail::expect(op, "scalars", scalars, DType::F32, {kAdafactorScalarsSize});
  detail::expect(op, "norm_coef", norm_coef, DType::F32, {kNormCoefSize});
  detail::expect(op, "workspace", workspace, DType::F32, {be.adafactor_workspace_elems(t.rows, t.cols)});
  if (be.dry_run) return;
  // The gradient read twice (statistics, then the update), param and m read and written.
  detail::OpScope scope(be, op, OpClass::Optimizer,
                        {0, detail::bytes(t.param, t.param, t.grad, t.grad, t.half, t.m, t.m, t.v, t.v, t.row, t.col)});
  be.adafactor(t, scalars, norm_coef, workspace);
}

}  // namespace ops

int64_t CpuBackend::adafactor_workspace_elems(int64_t, int64_t) const { return 1; }

void CpuBackend::adafactor(const AdafactorTensor& t, const Tensor& scalars, const Tensor& norm_coef, Tensor&) {
  if (norm_coef.f32()[2] != 0) return;  // a skipped step: the gradients overflowed
  const AdafactorScalars k = *reinterpret_cast<const AdafactorScalars*>(scalars.f32());
  const float clip = norm_coef.f32()[1];
  const int64_t R = t.rows, C = t.cols, n = R * C;
  float* p = t.param.f32();
  const float* gp = t.grad.f32();
  auto g = [&](int64_t i) { return gp[i] * clip; };
  const float keep = k.beta2t, take = 1.0f - k.beta2t;
  // The second moment, and the factor each gradient is divided by: u = g * scale(i).
  std::vector<float> row_factor;
  const float* col = nullptr;
  if (t.factored) {
    float *row = t.row.f32(), *colw = t.col.f32();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += double(g(r * C + c) * g(r * C + c) + k.eps1);
      row[r] = row[r] * keep + float(sum / double(C)) * take;
    }
    std::vector<double> colsum(size_t(C), 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) colsum[size_t(c)] += double(g(r * C + c) * g(r * C + c) + k.eps1);
    for (int64_t c = 0; c < C; ++c) colw[c] = colw[c] * keep + float(colsum[size_t(c)] / double(R)) * take;
    double row_sum = 0;
    for (int64_t r = 0; r < R; ++r) row_sum += row[r];
    const float row_mean = float(row_sum / double(R));
    row_factor.resize(size_t(R));
    for (int64_t r = 0; r < R; ++r) row_factor[size_t(r)] = 1.0f / std::sqrt(row[r] / row_mean);
    col = colw;
  } else {
    float* v = t.v.f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) v[i] = v[i] * keep + (g(i) * g(i) + k.eps1) * take;
  }
  auto u = [&](int64_t i) {
    if (t.factored) return g(i) * (row_factor[size_t(i / C)] * (1.0f / std::sqrt(col[i % C])));
    return g(i) * (1.0f / std::sqrt(t.v.f32()[i]));
  };
  double sumsq = 0;
#pragma omp parallel for schedule(static) reduction(+ : sumsq)
  for (int64_t i = 0; i < n; ++i) sumsq += double(u(i)) * double(u(i));
  const float rms = float(std::sqrt(sumsq / double(n)));
  const float step = k.lr / std::max(1.0f, rms / k.clip_threshold);
  const float decay = t.decay ? -k.weight_decay * k.lr : 0.0f;
  float* m = t.m.data ? t.m.f32() : nullptr;
  uint16_t* hp = t.half.ptr<uint16_t>();
  uint16_t (*round)(float) = t.half.dtype == DType::F16 ? float_to_f16 : float_to_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float upd = u(i) * step;
    if (m) upd = m[i] = m[i] * k.beta1 + upd * (1.0f - k.beta1);
    if (decay != 0) p[i] = p[i] + p[i] * decay;
    p[i] = p[i] - upd;
    if (hp) hp[i] = round(p[i]);
  }
}

}  // namespace hone
