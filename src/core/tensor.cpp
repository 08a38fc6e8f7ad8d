#include "hone/tensor.h"

#include <fmt/format.h>

namespace hone {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

float* Tensor::f32() const {
  HONE_CHECK(dtype == DType::F32, "expected an F32 tensor, got {}", dtype_name(dtype));
  return static_cast<float*>(data);
}

Tensor Tensor::view(Shape s) const {
  HONE_CHECK(s.numel() == numel(), "view {} of a tensor of shape {}", s.str(), shape.str());
  Tensor t = *this;
  t.shape = s;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  HONE_CHECK(shape.rank >= 1 && 0 <= begin && begin <= end && end <= shape[0],
             "rows [{}, {}) of shape {}", begin, end, shape.str());
  Tensor t = *this;
  int64_t row = numel() / (shape[0] ? shape[0] : 1);
  t.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
  t.shape.dims[0] = end - begin;
  return t;
}

}  // namespace hone
