// The device's best rates, timed through the backend's own ops: what a profile's op
// classes are held against.
#include <fmt/format.h>

#include <algorithm>

#include "hone/ops.h"
#include "hone/profile.h"

namespace hone {

namespace {

// Device memory outside any plan, for the measurement only (before the run's arenas exist).
class Scratch {
 public:
  Scratch(Backend& be, DType t, Shape s) : be_(be) {
    tensor_ = Tensor{nullptr, t, s, be.device()};
    tensor_.data = be.allocate(tensor_.bytes());
  }
  ~Scratch() { be_.deallocate(tensor_.data); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Tensor& get() { return tensor_; }

 private:
  Backend& be_;
  Tensor tensor_;
};

// The shortest of `reps` timed runs of f, after one untimed (which may pick algorithms).
template <typename F>
double best_seconds(Backend& be, int reps, F&& f) {
  f();
  for (int i = 0; i < reps; ++i) {
    be.stamp();
    f();
  }
  be.stamp();
  const std::vector<double> t = be.take_stamps();  // the first stamp comes after the untimed run
  double best = 1e30;
  for (size_t i = 0; i + 1 < t.size(); ++i) best = std::min(best, t[i + 1] - t[i]);
  return best;
}

}  // namespace

Roofline measure_roofline(Backend& be, DType compute, const std::string& precision) {
  const bool gpu = be.device() == Device::CUDA;
  Roofline r;
  {
    // Large enough to run at the product units' rate, small enough to time in milliseconds.
    const int64_t n = gpu ? 8192 : 1024;
    Scratch x(be, compute, {n, n}), w(be, compute, {n, n}), y(be, compute, {n, n});
    for (Scratch* s : {&x, &w, &y}) ops::fill(be, s->get(), 0.01f);
    const double s = best_seconds(be, 3, [&] { ops::linear_forward(be, x.get(), w.get(), nullptr, y.get()); });
    r.flops_per_second = 2.0 * double(n) * double(n) * double(n) / s;
    r.product = fmt::format("{} {}x{}x{} product", precision, n, n, n);
  }
  {
    const int64_t bytes = gpu ? int64_t(1) << 30 : int64_t(256) << 20;
    Scratch a(be, DType::F32, {bytes / 4}), b(be, DType::F32, {bytes / 4});
    ops::fill(be, a.get(), 0.0f);
    const double s = best_seconds(be, 3, [&] { ops::copy(be, a.get(), b.get()); });
    r.bytes_per_second = 2.0 * double(bytes) / s;  // read once, written once
    r.copy = fmt::format("{} MiB copy", bytes >> 20);
  }
  return r;
}

}  // namespace hone
