// The CPU's vector GELU (ops/cpu_gelu.h) against the scalar reference, bit for bit: erf
// and exp over a sweep of float bit patterns (every one of the 2^32 with HONE_EXHAUSTIVE=1,
// about a minute on two cores), and the three GELU passes over the same inputs.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ops/cpu_gelu.h"

namespace hone {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

// Bit patterns start, start + stride, ... below 2^32, with the values the ranges turn on.
std::vector<float> sweep(uint64_t start, uint64_t stride) {
  std::vector<float> v;
  for (uint64_t b = start; b < (uint64_t(1) << 32); b += stride) v.push_back(from_bits(uint32_t(b)));
  for (float f : {0.0f, -0.0f, 0.84375f, -0.84375f, 1.25f, -1.25f, 6.0f, -6.0f, 2.857142857f, 88.0f, 88.72283f,
                  88.72284f, -103.2789f, -103.9721f, -103.9722f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f})
    v.push_back(f);
  return v;
}

// Counts the elements whose bits differ, reporting the first.
int64_t differing(const char* what, const std::vector<float>& in, const std::vector<float>& got,
                  const std::vector<float>& want) {
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i]) && n++ == 0)
      ADD_FAILURE() << what << "(" << in[i] << " = 0x" << std::hex << bits(in[i]) << "): 0x" << bits(got[i])
                    << ", the reference 0x" << bits(want[i]);
  return n;
}

class CpuGelu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_gelu::vectorized()) GTEST_SKIP() << "this CPU has no AVX-512: the scalar reference runs (nothing to compare)";
  }
};

TEST_F(CpuGelu, ErfAndExpAreTheCLibrarysToTheBit) {
  const bool every = std::getenv("HONE_EXHAUSTIVE") != nullptr;
  const uint64_t stride = every ? 1 : 4099;
  // In slices, so that the exhaustive sweep holds a few MB at a time.
  const uint64_t slice = uint64_t(1) << 24;
  int64_t bad_erf = 0, bad_exp = 0, checked = 0;
  for (uint64_t start = 0; start < (uint64_t(1) << 32); start += every ? slice : uint64_t(1) << 32) {
    std::vector<float> x;
    if (every) {
      x.resize(slice);
      for (uint64_t i = 0; i < slice; ++i) x[i] = from_bits(uint32_t(start + i));
    } else {
      x = sweep(0, stride);
    }
    const int64_t n = int64_t(x.size());
    std::vector<float> got(x.size()), want(x.size());
    cpu_gelu::erf_n(x.data(), got.data(), n);
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = std::erf(x[size_t(i)]);
    bad_erf += differing("erf", x, got, want);
    cpu_gelu::exp_n(x.data(), got.data(), n);
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = std::exp(x[size_t(i)]);
    bad_exp += differing("exp", x, got, want);
    checked += n;
  }
  EXPECT_EQ(bad_erf, 0) << "of " << checked;
  EXPECT_EQ(bad_exp, 0) << "of " << checked;
}

TEST_F(CpuGelu, ThePassesAreTheScalarOnesToTheBit) {
  std::vector<float> x = sweep(7, 65537);
  // And values where pre-activations live, every length's tail included.
  for (int i = -40000; i < 40000; ++i) x.push_back(float(i) * 1.7e-4f);
  x.resize(x.size() - 5);
  const int64_t n = int64_t(x.size());
  std::vector<float> dy(x.size()), y(x.size()), want(x.size()), g(x.size()), want_g(x.size());
  for (size_t i = 0; i < x.size(); ++i) dy[i] = float(int(i % 97) - 48) * 0.031f;

  cpu_gelu::forward(x.data(), y.data(), n);
  for (size_t i = 0; i < x.size(); ++i) want[i] = cpu_gelu::gelu(x[i]);
  EXPECT_EQ(differing("gelu", x, y, want), 0);

  cpu_gelu::backward(dy.data(), x.data(), g.data(), n);
  for (size_t i = 0; i < x.size(); ++i) want[i] = dy[i] * cpu_gelu::gelu_grad(x[i]);
  EXPECT_EQ(differing("gelu'", x, g, want), 0);

  g = dy;
  cpu_gelu::forward_with_grad(x.data(), y.data(), g.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    const float e = cpu_gelu::gelu_e(x[i]);
    want[i] = cpu_gelu::gelu_from(x[i], e);
    want_g[i] = dy[i] * cpu_gelu::gelu_grad_from(x[i], e);
  }
  EXPECT_EQ(differing("gelu with its gradient: y", x, y, want), 0);
  EXPECT_EQ(differing("gelu with its gradient: g", x, g, want_g), 0);
}

}  // namespace
}  // namespace hone
