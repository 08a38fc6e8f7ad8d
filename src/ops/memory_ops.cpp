// fill, fill_normal, copy, read.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/dtype.h"
#include "hone/memory.h"
#include "hone/normal.h"
#include "hone/ops.h"
#include "ops/cpu_pages.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

void fill(Backend& be, Tensor& x, float value) {
  detail::expect_compute(be, "fill", "x", x);
  if (be.dry_run) return;
  detail::OpScope scope(be, "fill", OpClass::Elementwise, {0, detail::bytes(x)});
  be.fill(x, value);
}

void fill_normal(Backend& be, Tensor& x, float std, uint64_t seed, uint64_t stream) {
  detail::expect_dtype("fill_normal", "x", x, DType::F32);
  if (be.dry_run) return;
  detail::OpScope scope(be, "fill_normal", OpClass::Elementwise, {0, detail::bytes(x)});
  be.fill_normal(x, std, seed, stream);
}

void copy(Backend& be, const Tensor& src, Tensor& dst) {
  if (src.bytes() != dst.bytes())
    fail("copy: src has {} bytes ({} {}), dst has {} bytes ({} {})", src.bytes(), dtype_name(src.dtype),
         src.shape.str(), dst.bytes(), dtype_name(dst.dtype), dst.shape.str());
  if (be.dry_run) return;
  detail::OpScope scope(be, "copy", OpClass::Copy, {0, detail::bytes(src, dst)});
  be.copy(src, dst);
}

// Rounding is not computing in half precision: the CPU rounds as the GPU does, so that
// weights move between the precisions (and the ranks) on either backend.
void cast(Backend& be, const Tensor& src, Tensor& dst) {
  detail::expect_dtype("cast", "src", src, DType::F32);
  if (dst.dtype != DType::F32 && dst.dtype != DType::BF16 && dst.dtype != DType::F16)
    fail("cast: dst has dtype {}, expected F32, BF16 or F16", dtype_name(dst.dtype));
  if (src.numel() != dst.numel())
    fail("cast: src has {} elements ({}), dst {} ({})", src.numel(), src.shape.str(), dst.numel(), dst.shape.str());
  if (be.dry_run) return;
  detail::OpScope scope(be, "cast", OpClass::Copy, {0, detail::bytes(src, dst)});
  be.cast(src, dst);
}

}  // namespace ops

CpuBackend::CpuBackend(bool bf16_products) : bf16_products_(bf16_products) {
  if (std::string why; bf16_products && !cpu_bf16_products_available(&why)) fail("bf16 products on the CPU: {}", why);
  select_blas_kernels();
  openblas_set_num_threads(1);
}

// Host memory aligned for the arenas' 256-byte buffer alignment (and so for SIMD).
void* Backend::allocate_host(size_t bytes) {
  void* p = std::aligned_alloc(kBufferAlignment, (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment);
  if (!p) fail("out of host memory: could not allocate {:.1f} MiB", double(bytes) / (1 << 20));
  return p;
}

void Backend::deallocate_host(void* p) noexcept { std::free(p); }

// The CPU's device memory is host memory.
void* CpuBackend::allocate(size_t bytes) { return Backend::allocate_host(bytes); }

void CpuBackend::deallocate(void* p) noexcept { Backend::deallocate_host(p); }

void Backend::mark(StepSpan s) {
  if (profiler) profiler->set_phase(s);
  record_mark(s);
}

void Backend::record_mark(StepSpan s) {
  if (dry_run) return;
  const auto now = std::chrono::steady_clock::now();
  if (span_started_) span_seconds_[size_t(span_)] += std::chrono::duration<double>(now - span_start_).count();
  span_start_ = now;
  span_started_ = true;
  span_ = s;
}

void Backend::stamp() { stamps_.push_back(std::chrono::steady_clock::now()); }

std::vector<double> Backend::take_stamps() {
  synchronize();
  std::vector<double> out;
  out.reserve(stamps_.size());
  for (const auto& t : stamps_) out.push_back(std::chrono::duration<double>(t - stamps_.front()).count());
  stamps_.clear();
  return out;
}

Backend::Transfer Backend::transfer_to_host(const Tensor& src, Tensor& host_dst) {
  HONE_CHECK(src.bytes() == host_dst.bytes(), "transfer to the host: {} bytes into {}", src.bytes(), host_dst.bytes());
  copy(src, host_dst);
  synchronize();
  return {};
}

Backend::Transfer Backend::transfer_to_device(const Tensor& host_src, Tensor& dst) {
  HONE_CHECK(host_src.bytes() == dst.bytes(), "transfer to the device: {} bytes into {}", host_src.bytes(), dst.bytes());
  synchronize();  // the work queued so far may still read dst
  copy(host_src, dst);
  return {};
}

void Backend::begin_recording() { fail("the {} backend cannot record steps", name()); }
int Backend::end_recording() { fail("the {} backend cannot record steps", name()); }
void Backend::replay(int) { fail("the {} backend cannot replay steps", name()); }

SpanSeconds Backend::take_span_seconds() {
  synchronize();
  mark(span_);  // closes the running span, which goes on
  SpanSeconds out = span_seconds_;
  span_seconds_ = {};
  return out;
}

void CpuBackend::fill(Tensor& x, float value) {
  float* p = x.f32();
  const int64_t n = x.numel();
  if (value == 0.0f && !std::signbit(value)) return cpu_pages::zero_bytes(static_cast<char*>(x.data), static_cast<char*>(x.data) + x.bytes());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::fill_normal(Tensor& x, float std, uint64_t seed, uint64_t stream) {
  float* p = x.f32();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < (n + 1) / 2; ++k) {
    const NormalPair v = normal_pair(seed, stream, uint64_t(k), std);
    p[2 * k] = v.a;
    if (2 * k + 1 < n) p[2 * k + 1] = v.b;
  }
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  HONE_CHECK(src.bytes() == dst.bytes(), "copy of {} bytes into {}", src.bytes(), dst.bytes());
  const size_t n = src.bytes();
  if (src.data == dst.data || n == 0) return;
  // One thread does not reach the memory's bandwidth: large copies take every core.
  if (n < (size_t(1) << 20)) {
    std::memcpy(dst.data, src.data, n);
    return;
  }
  const char* from = static_cast<const char*>(src.data);
  char* to = static_cast<char*>(dst.data);
#pragma omp parallel
  {
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
    std::memcpy(to + lo, from + lo, hi - lo);
  }
}

void CpuBackend::read(const Tensor& src, float* host, size_t n) {
  HONE_CHECK(n <= size_t(src.numel()), "read of {} values from a tensor of shape {}", n, src.shape.str());
  if (n > 0) std::memcpy(host, src.f32(), n * sizeof(float));
}

// Only ever F32 to F32 here (expect_compute keeps half tensors off the CPU backend).
void CpuBackend::cast(const Tensor& src, Tensor& dst) {
  if (dst.dtype == DType::F32) return copy(src, dst);
  const float* x = src.f32();
  uint16_t* y = static_cast<uint16_t*>(dst.data);
  uint16_t (*round)(float) = dst.dtype == DType::BF16 ? float_to_bf16 : float_to_f16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < src.numel(); ++i) y[i] = round(x[i]);
}

}  // namespace hone
