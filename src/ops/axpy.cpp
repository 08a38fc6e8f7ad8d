#include <cblas.h>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

void ops::add_scaled(Backend& be, const Tensor& x, float alpha, Tensor& y) {
  HONE_CHECK(x.dtype == DType::F32 && y.dtype == DType::F32 && x.numel() == y.numel(),
             "add_scaled: x {} and y {} must be F32 of the same size", x.shape.str(), y.shape.str());
  if (be.dry_run) return;
  ops::detail::OpScope scope(be, "add_scaled", OpClass::Elementwise, {2.0 * double(x.numel()), ops::detail::bytes(x, y, y)});
  be.add_scaled(x, alpha, y);
}

void CpuBackend::add_scaled(const Tensor& x, float alpha, Tensor& y) {
  cblas_saxpy(int(x.numel()), alpha, x.f32(), 1, y.f32(), 1);
}

}  // namespace hone
