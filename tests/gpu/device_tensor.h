#pragma once
// What the GPU test files share: device memory of one tensor from a backend's allocator,
// filled and read through the CUDA runtime rather than through the ops under test, and the
// host side of the half-precision formats.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hone/backend.h"
#include "hone/cuda.h"
#include "hone/dtype.h"
#include "test_util.h"

namespace hone::test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Host conversions of the half formats (t is BF16 or F16), rounding to nearest even.
inline uint16_t half_bits(float v, DType t) { return t == DType::BF16 ? float_to_bf16(v) : float_to_f16(v); }
inline float half_value(uint16_t h, DType t) { return t == DType::BF16 ? bf16_to_float(h) : f16_to_float(h); }
// v rounded to t (unchanged in F32).
inline float round_to(float v, DType t) { return t == DType::F32 ? v : half_value(half_bits(v, t), t); }
inline void round_all(std::vector<float>& v, DType t) {
  for (float& x : v) x = round_to(x, t);
}

// The bits of an element that nothing has written: all ones, a NaN in F32, BF16 and F16.
constexpr uint16_t kUnwrittenHalf = 0xffff;

// One tensor in device memory. It starts `offset` elements into its allocation and `guard`
// elements follow it, so that a write outside it shows; every byte of the allocation starts
// as 0xff, so that an element an op should write but does not fails a comparison. Copies
// go through the runtime with device synchronizations that order them with the backend's
// non-blocking stream (a pageable copy may still be in flight when cudaMemcpy returns).
class DeviceTensor {
 public:
  DeviceTensor(Backend& be, DType d, Shape s, int offset = 0, int guard = 0)
      : be_(be), offset_(offset), elements_(offset + s.numel() + guard) {
    const size_t bytes = std::max<size_t>(size_t(elements_) * dtype_size(d), 1);
    base_ = be_.allocate(bytes);
    cuda_ok(cudaMemset(base_, 0xff, bytes), "cudaMemset");
    // The memset is asynchronous on the legacy stream: it must land before an op on the
    // backend's own stream writes the tensor.
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    t = Tensor{static_cast<char*>(base_) + size_t(offset) * dtype_size(d), d, s, Device::CUDA};
  }
  // A copy of a host tensor, in its dtype.
  DeviceTensor(Backend& be, const HostTensor& h) : DeviceTensor(be, h.t.dtype, h.t.shape) { upload(h); }
  // The F32 values of h in dtype d (rounded), in h's shape.
  DeviceTensor(Backend& be, DType d, const HostTensor& h) : DeviceTensor(be, d, h.t.shape) { upload(h.t.f32()); }
  // A 1-D tensor holding v in dtype d (rounded).
  DeviceTensor(Backend& be, DType d, const std::vector<float>& v, int offset = 0, int guard = 0)
      : DeviceTensor(be, d, Shape{int64_t(v.size())}, offset, guard) {
    upload(v.data());
  }
  ~DeviceTensor() { be_.deallocate(base_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  // Every byte of the allocation back to 0xff (unwritten), before an op runs again.
  void mark_unwritten() {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_ok(cudaMemset(base_, 0xff, std::max<size_t>(size_t(elements_) * dtype_size(t.dtype), 1)), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void upload_bytes(const void* host) { copy_in(t.data, host, t.bytes()); }
  void upload(const HostTensor& h) {
    if (h.t.bytes() != t.bytes()) throw std::runtime_error("upload: size mismatch");
    upload_bytes(h.t.data);
  }
  // numel() floats, rounded to a half dtype.
  void upload(const float* v) {
    if (t.dtype == DType::F32) return upload_bytes(v);
    std::vector<uint16_t> bits(size_t(t.numel()));
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = half_bits(v[i], t.dtype);
    upload_bytes(bits.data());
  }
  void upload(const std::vector<float>& v) {
    if (int64_t(v.size()) != t.numel()) throw std::runtime_error("upload: size mismatch");
    upload(v.data());
  }

  void download_bytes(void* host) const { copy_out(host, t.data, t.bytes()); }
  // The values as floats (F32, BF16 or F16 tensors).
  std::vector<float> download() const {
    std::vector<float> v(size_t(t.numel()));
    if (t.dtype == DType::F32) {
      download_bytes(v.data());
      return v;
    }
    const std::vector<uint16_t> h = bits();
    for (size_t i = 0; i < v.size(); ++i) v[i] = half_value(h[i], t.dtype);
    return v;
  }
  // The raw 16-bit elements of a half tensor, or of its whole allocation (guards included).
  std::vector<uint16_t> bits(bool whole_allocation = false) const {
    std::vector<uint16_t> h(size_t(whole_allocation ? elements_ : t.numel()));
    copy_out(h.data(), whole_allocation ? base_ : t.data, h.size() * sizeof(uint16_t));
    return h;
  }
  int offset() const { return offset_; }

  Tensor t;

 private:
  static void copy_in(void* dst, const void* src, size_t bytes) {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  static void copy_out(void* dst, const void* src, size_t bytes) {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }

  Backend& be_;
  int offset_;
  int64_t elements_;
  void* base_ = nullptr;
};

// The device result against the reference: the norm-wise relative error, and the largest
// element error relative to the largest reference magnitude, both within tol.
inline void expect_close(const std::string& what, const std::vector<float>& got, const HostTensor& want, double tol) {
  const float* w = want.t.f32();
  const int64_t n = want.n();
  ASSERT_EQ(int64_t(got.size()), n) << what;
  double scale = 0, worst = 0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(double(w[i])));
    double err = std::fabs(double(got[size_t(i)]) - w[i]);
    if (std::isnan(err)) err = INFINITY;  // no error is worse
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(norm_rel_error(got.data(), w, n), tol) << what;
  EXPECT_LE(worst, tol * scale) << what << ": element " << worst_i << " is " << got[size_t(worst_i)]
                                << " on the GPU, " << w[worst_i] << " in the reference (largest |value| "
                                << scale << ")";
}

// A fixture with a CUDA backend; without a usable GPU each test skips, saying why.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    gpu_ = make_cuda_backend({});
  }
  Backend& gpu() { return *gpu_; }
  std::unique_ptr<Backend> gpu_;
};

// Milliseconds a call of f takes on be, averaged over `reps` calls after one untimed call:
// the speed tests' figures, printed and never asserted.
inline double average_ms(Backend& be, const std::function<void()>& f, int reps = 20) {
  f();
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f();
  be.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace hone::test
