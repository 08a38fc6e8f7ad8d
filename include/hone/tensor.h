#pragma once
// A tensor is a view: a pointer into memory owned by an arena, a dtype, a shape and a
// device. It never owns or copies; every byte it points at was planned (see memory.h).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "hone/dtype.h"
#include "hone/error.h"

namespace hone {

enum class Device : uint8_t { CPU, CUDA };

struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    HONE_CHECK(d.size() <= kMaxRank, "rank {} > {}", d.size(), kMaxRank);
    for (int64_t v : d) dims[rank++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;  // "[4, 512, 1024]"
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <typename T> T* ptr() const { return static_cast<T*>(data); }
  float* f32() const;  // checks dtype == F32
  // Same memory, another shape with the same number of elements.
  Tensor view(Shape s) const;
  // Rows [begin, end) of the first dimension.
  Tensor rows(int64_t begin, int64_t end) const;
};

// A tensor over host memory that the caller owns (a source or destination of copies).
inline Tensor host_tensor(const void* p, DType t, Shape s) { return Tensor{const_cast<void*>(p), t, s, Device::CPU}; }

}  // namespace hone
