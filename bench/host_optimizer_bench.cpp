// The CPU optimizer against the host's memory bandwidth: a multi-threaded copy (STREAM's
// convention: bytes read plus bytes written) and hone's CPU AdamW (the update an offloaded
// run does on the host: reads parameters, gradients and both moments, writes parameters,
// moments and the bf16 copy, 30 bytes per parameter; then without the copy, 28, as
// DeepSpeed's CPU Adam step moves) on buffers of bert-large's size, each timed as the best
// of several passes after one that touches the memory.
// Usage: host_optimizer_bench [parameters, default 335141890] [passes, default 5]
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/ops.h"

namespace {

double seconds_of(const auto& body, int passes) {
  double best = 1e30;
  for (int i = 0; i < passes; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Allocated and first touched by the threads that will use each part.
struct Buffer {
  explicit Buffer(size_t bytes) : bytes(bytes), data(static_cast<char*>(std::aligned_alloc(4096, round(bytes)))) {
    if (!data) throw std::bad_alloc();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(bytes / 4); ++i) reinterpret_cast<float*>(data)[i] = 0.001f * float(i % 1000);
  }
  ~Buffer() { std::free(data); }
  static size_t round(size_t b) { return (b + 4095) / 4096 * 4096; }
  size_t bytes;
  char* data;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace hone;
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 335141890;
  const int passes = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = omp_get_max_threads();
  fmt::print("host_optimizer_bench: {} parameters, {} threads, best of {} passes\n", n, threads, passes);

  // Copy: each thread copies its contiguous share.
  {
    Buffer src(size_t(n) * 4 * 2), dst(size_t(n) * 4 * 2);  // 2 x the parameters' bytes each
    const size_t bytes = src.bytes;
    const double s = seconds_of(
        [&] {
#pragma omp parallel
          {
            const size_t share = (bytes / size_t(omp_get_num_threads()) + 63) / 64 * 64;
            const size_t begin = std::min(bytes, share * size_t(omp_get_thread_num()));
            const size_t end = std::min(bytes, begin + share);
            std::memcpy(dst.data + begin, src.data + begin, end - begin);
          }
        },
        passes + 1);
    fmt::print("copy: {:.1f} GB/s ({:.2f} GB read + written in {:.1f} ms)\n", 2.0 * bytes / s / 1e9, 2.0 * bytes / 1e9,
               s * 1e3);
  }

  CpuBackend be;
  Buffer p(size_t(n) * 4), g(size_t(n) * 4), m(size_t(n) * 4), v(size_t(n) * 4), half(size_t(n) * 2);
  auto tensor = [n](const Buffer& b, DType t) { return Tensor{b.data, t, {n}, Device::CPU}; };
  std::memset(m.data, 0, m.bytes);
  std::memset(v.data, 0, v.bytes);
  std::vector<float> coef_host = {1.0f, 1.0f, 0.0f};  // norm, clip coefficient, not skipped
  const Tensor coef{coef_host.data(), DType::F32, {int64_t(coef_host.size())}, Device::CPU};
  int64_t step = 0;
  // With the bf16 copy (a mixed-precision run's update, 30 bytes a parameter), then without
  // it (fp32 weights, or DeepSpeed's CPU Adam step, whose copy is a later pass: 28 bytes).
  for (const bool copy : {true, false}) {
    const AdamWSlice slice{tensor(p, DType::F32), tensor(g, DType::F32), tensor(m, DType::F32),
                           tensor(v, DType::F32), 0.01, copy ? tensor(half, DType::BF16) : Tensor{}};
    const double s = seconds_of(
        [&] {
          const AdamWStep st{.lr = 1e-5, .weight_decay = 0.01, .step = ++step};
          ops::adamw(be, &slice, 1, st, coef);
        },
        passes + 1);
    const double bytes = (copy ? 30.0 : 28.0) * double(n);
    fmt::print("adamw (F32 state, {}): {:.1f} GB/s ({:.2f} GB in {:.1f} ms, {:.2f} ns per parameter per thread)\n",
               copy ? "BF16 copy" : "no copy", bytes / s / 1e9, bytes / 1e9, s * 1e3, s * 1e9 * threads / double(n));
  }
  return 0;
}
