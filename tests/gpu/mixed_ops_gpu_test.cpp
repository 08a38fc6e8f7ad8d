// The mixed-precision (BF16, F16) paths of the CUDA element-wise, memory, embedding and
// loss kernels against their F32 path on the same values: inputs are rounded to the half
// type on the host first, so both paths see the same numbers and differ only by where
// the result is rounded. Kernels compute in F32 and round once on the store, so a result
// is the F32 result rounded (bit for bit where the arithmetic cannot contract
// differently: dropout, embedding sums, data movement), or within half an ulp of the
// half type: 2^-8 relative for bf16 (8 significant bits), 2^-11 for fp16 (11). The
// fused residual LayerNorm is held instead to the unfused ops it replaces, in the same
// dtype. The backend is called directly: these test the kernels, not the ops.h checks.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "hone/cuda.h"
#include "hone/dtype.h"
#include "hone/ops.h"
#include "device_tensor.h"
#include "test_util.h"

namespace hone {
namespace {

constexpr DType kHalves[] = {DType::BF16, DType::F16};
constexpr DType kComputeTypes[] = {DType::F32, DType::BF16, DType::F16};
// Element-wise sizes: one element, less than a vector, odd, and past a million with a tail.
constexpr int64_t kSizes[] = {1, 7, 1001, (1 << 20) + 3};
// Offsets of a tensor from a 16-byte aligned base, in elements: 1 forces the scalar paths.
constexpr int kOffsets[] = {0, 1};
// The float arithmetic of an instantiation may contract differently (an FMA or not):
// a few float ulps on top of the half type's rounding.
constexpr double kFloatSlack = 1e-6;
// Below 2^-14 fp16 values are subnormal, multiples of 2^-24, and lose relative precision:
// this absolute slack covers them (and is far above bf16's subnormals).
constexpr double kHalfAbs = 0x1p-24;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string name(DType t) { return std::string(dtype_name(t)); }

using test::half_bits;
using test::half_value;
using test::kUnwrittenHalf;
using test::round_to;

std::vector<float> rounded(std::vector<float> v, DType t) {
  test::round_all(v, t);
  return v;
}

// Half an ulp relative to the value: the largest relative error of rounding to t.
double rounding(DType t) { return t == DType::BF16 ? 0x1p-8 : t == DType::F16 ? 0x1p-11 : 0.0; }

std::vector<float> uniform(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  const test::HostTensor h = test::random({n}, seed, lo, hi);
  return {h.t.f32(), h.t.f32() + n};
}

std::vector<int32_t> random_ints(int64_t n, uint64_t seed, int lo, int hi) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> u(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = u(g);
  return v;
}

// A device tensor `offset` elements into its allocation, with kGuard elements after it,
// so that writes outside it show (see test::DeviceTensor).
constexpr int kGuard = 8;
struct Dev : test::DeviceTensor {
  Dev(Backend& b, DType d, Shape s, int offset = 0) : DeviceTensor(b, d, s, offset, kGuard) {}
  Dev(Backend& b, DType d, const std::vector<float>& v, int offset = 0) : DeviceTensor(b, d, v, offset, kGuard) {}
};

bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Bit for bit: each element of `got` is want rounded to got's dtype (any NaN for a NaN).
void expect_rounded(const std::string& what, const Dev& got, const std::vector<float>& want) {
  const std::vector<float> g = got.download();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (!same_value(g[i], round_to(want[i], got.t.dtype)) ||
        (!std::isnan(g[i]) && std::signbit(g[i]) != std::signbit(want[i])))  // -0 is not 0
      if (bad++ == 0) first = int64_t(i);
  if (bad == 0) return;
  const size_t f = size_t(first);
  ADD_FAILURE() << what << ": " << bad << " elements differ; element " << f << " is " << g[f] << ", the F32 result "
                << want[f] << " rounds to " << round_to(want[f], got.t.dtype);
}

// Each element within rel * |want| + abs of the reference.
void expect_near(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= rel * std::fabs(double(want[i])) + abs))  // NaN fails
      if (bad++ == 0) first = int64_t(i);
  }
  if (bad == 0) return;
  const size_t f = size_t(first);
  ADD_FAILURE() << what << ": " << bad << " elements off; element " << f << " is " << got[f] << ", expected "
                << want[f] << " within " << rel << " relative + " << abs;
}

// Within the half type's rounding of the F32 result (plus float slack).
void expect_within_rounding(const std::string& what, const Dev& got, const std::vector<float>& want) {
  expect_near(what, got.download(), want, rounding(got.t.dtype) + kFloatSlack, got.t.dtype == DType::F32 ? 0.0 : kHalfAbs);
}

using MixedOps = test::GpuTest;

// ---------------------------------------------------------------------------- memory

TEST_F(MixedOps, FillRoundsToNearestEvenAndStaysInBounds) {
  Backend& g = gpu();
  // Inexact in both halves; an fp16 subnormal; past fp16's largest finite value (inf there).
  const float values[] = {0.1f, -3.0e-6f, 70000.0f};
  for (DType t : kComputeTypes)
    for (int64_t n : kSizes)
      for (int offset : kOffsets)
        for (float value : values) {
          Dev x(g, t, Shape{n}, offset);
          g.fill(x.t, value);
          const std::string at = fmt::format(" ({}, n = {}, offset {}, value {})", name(t), n, offset, value);
          expect_rounded("fill" + at, x, std::vector<float>(size_t(n), value));
          if (t == DType::F32) continue;
          const std::vector<uint16_t> all = x.bits(true);
          const uint16_t guard = kUnwrittenHalf;
          EXPECT_TRUE(std::all_of(all.begin(), all.begin() + offset, [&](uint16_t h) { return h == guard; }) &&
                      std::all_of(all.end() - kGuard, all.end(), [&](uint16_t h) { return h == guard; }))
              << "fill wrote outside the tensor" << at;
        }
}

// F32 values over the whole range, with the cases where rounding is delicate.
std::vector<float> cast_input(int64_t n) {
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, kNaN, 65504.0f, 65519.996f, 65520.0f,
                            1.0f + 0x1p-8f,            // bf16 tie: to even (1)
                            1.0f + 3 * 0x1p-8f,        // bf16 tie: to even (1 + 2^-6)
                            1.0f + 0x1p-11f,           // fp16 tie
                            0x1p-25f, 0x1.8p-24f,      // fp16 subnormal ties
                            1e-40f, 3.4e38f, -1.5e-5f};
  std::vector<float> v = uniform(n, 21);
  const std::vector<float> e = uniform(n, 22, -30.0f, 20.0f);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::ldexp(v[size_t(i)], int(e[size_t(i)]));
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) v[i] = specials[i];
  return v;
}

TEST_F(MixedOps, CastRoundsToNearestEvenLikeTheHost) {
  Backend& g = gpu();
  for (DType t : kComputeTypes)
    for (int64_t n : kSizes)
      for (int offset : kOffsets) {
        const std::vector<float> v = cast_input(n);
        Dev src(g, DType::F32, v, offset), dst(g, t, Shape{n}, offset);
        g.cast(src.t, dst.t);
        const std::string at = fmt::format(" ({}, n = {}, offset {})", name(t), n, offset);
        if (t == DType::F32) {
          expect_rounded("cast" + at, dst, v);
          continue;
        }
        // Bits against hone's host conversions (any NaN for a NaN).
        const std::vector<uint16_t> all = dst.bits(true);
        const uint16_t guard = kUnwrittenHalf;
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t got = all[size_t(offset + i)], want = half_bits(v[size_t(i)], t);
          if (got != want && !(std::isnan(half_value(got, t)) && std::isnan(v[size_t(i)])))
            if (bad++ == 0) first = i;
        }
        EXPECT_EQ(bad, 0) << "cast" << at << ": " << bad << " elements differ from the host's rounding; element "
                          << first << " (" << (first >= 0 ? v[size_t(first)] : 0) << ")";
        EXPECT_TRUE(std::all_of(all.begin(), all.begin() + offset, [&](uint16_t h) { return h == guard; }) &&
                    std::all_of(all.end() - kGuard, all.end(), [&](uint16_t h) { return h == guard; }))
            << "cast wrote outside the tensor" << at;
      }
}

TEST_F(MixedOps, ReadConvertsHalvesToFloat) {
  Backend& g = gpu();
  for (DType t : kHalves)
    for (int64_t n : kSizes)
      for (int offset : kOffsets) {
        const std::vector<float> v = rounded(cast_input(n), t);
        Dev x(g, t, v, offset);
        for (size_t head : {size_t(1), size_t(n)}) {
          std::vector<float> host(head, -1.0f);
          g.read(x.t, host.data(), head);
          int64_t bad = 0;
          for (size_t i = 0; i < head; ++i) bad += !same_value(host[i], v[i]);
          EXPECT_EQ(bad, 0) << "read of " << head << " of " << name(t) << " n = " << n << ", offset " << offset;
        }
      }
}

// ---------------------------------------------------------------------------- elementwise

// Values in [-4, 4], none exactly 0 where relu has its kink, rounded to t.
std::vector<float> activation_input(int64_t n, DType t) {
  std::vector<float> x = uniform(n, 8, -4.0f, 4.0f);
  for (float& v : x)
    if (round_to(v, t) == 0.0f) v = 0.5f;
  return rounded(x, t);
}

TEST_F(MixedOps, ActivationsAndTanhAreTheF32ResultsRounded) {
  Backend& g = gpu();
  for (DType t : kHalves)
    for (int64_t n : kSizes)
      for (int offset : kOffsets) {
        const std::vector<float> xv = activation_input(n, t), dyv = rounded(uniform(n, 9), t);
        for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
          Dev x32(g, DType::F32, xv), dy32(g, DType::F32, dyv);
          Dev y32(g, DType::F32, Shape{n}), dx32(g, DType::F32, Shape{n});
          g.activation_forward(a, x32.t, y32.t);
          g.activation_backward(a, dy32.t, x32.t, dx32.t);
          Dev x(g, t, xv, offset), dy(g, t, dyv, offset), y(g, t, Shape{n}, offset), dx(g, t, Shape{n}, offset);
          g.activation_forward(a, x.t, y.t);
          g.activation_backward(a, dy.t, x.t, dx.t);
          g.activation_backward(a, dy.t, x.t, dy.t);  // dx aliases dy
          const std::string at = fmt::format(" (activation {}, {}, n = {}, offset {})", int(a), name(t), n, offset);
          const std::vector<float> want_y = y32.download(), want_dx = dx32.download();
          expect_within_rounding("y" + at, y, want_y);
          expect_within_rounding("dx" + at, dx, want_dx);
          expect_within_rounding("dx in place" + at, dy, want_dx);
        }
        Dev x(g, t, xv, offset), y(g, t, Shape{n}, offset), dy(g, t, dyv, offset), dx(g, t, Shape{n}, offset);
        Dev x32(g, DType::F32, xv), y32(g, DType::F32, Shape{n});
        g.tanh_forward(x.t, y.t);
        g.tanh_forward(x32.t, y32.t);
        const std::string at = fmt::format(" ({}, n = {}, offset {})", name(t), n, offset);
        expect_within_rounding("tanh" + at, y, y32.download());
        // Backward from the half forward's output, which F32 holds exactly.
        Dev yh32(g, DType::F32, y.download()), dy32(g, DType::F32, dyv), dx32(g, DType::F32, Shape{n});
        g.tanh_backward(dy.t, y.t, dx.t);
        g.tanh_backward(dy32.t, yh32.t, dx32.t);
        expect_within_rounding("tanh dx" + at, dx, dx32.download());
      }
}

TEST_F(MixedOps, DropoutMasksEqualF32AlsoWhenAliased) {
  Backend& g = gpu();
  for (DType t : kHalves)
    for (int64_t n : kSizes)
      for (int offset : kOffsets)
        for (float p : {0.0f, 0.1f}) {
          // Seed and stream use their high words, which a 32-bit slip would lose.
          const DropoutSpec d{p, 0x9E3779B97F4A7C15ull, (1ull << 33) + 5};
          // Inputs away from 0, so that a kept element never looks dropped.
          const std::vector<float> xv = rounded(uniform(n, 1, 0.5f, 1.5f), t), rv = rounded(uniform(n, 2), t);
          Dev x32(g, DType::F32, xv), r32(g, DType::F32, rv);
          Dev y32(g, DType::F32, Shape{n}), out32(g, DType::F32, Shape{n});
          g.dropout(x32.t, d, y32.t);
          g.dropout_add(x32.t, r32.t, d, out32.t);
          const std::vector<float> want_y = y32.download(), want_out = out32.download();

          Dev x(g, t, xv, offset), r(g, t, rv, offset), y(g, t, Shape{n}, offset), out(g, t, Shape{n}, offset);
          Dev xa(g, t, xv, offset), xb(g, t, xv, offset), ra(g, t, rv, offset);
          g.dropout(x.t, d, y.t);
          g.dropout_add(x.t, r.t, d, out.t);
          g.dropout(xa.t, d, xa.t);             // y aliases x
          g.dropout_add(xb.t, r.t, d, xb.t);    // out aliases x
          g.dropout_add(x.t, ra.t, d, ra.t);    // out aliases residual
          const std::string at = fmt::format(" ({}, n = {}, offset {}, p = {})", name(t), n, offset, p);
          // The same zeros, and every kept element the F32 result rounded: the same mask
          // and the same scaling (x * scale, then + residual, in F32).
          const std::vector<float> got_y = y.download();
          int64_t zeros = 0, mismatched = 0;
          for (int64_t i = 0; i < n; ++i) {
            zeros += want_y[size_t(i)] == 0.0f;
            mismatched += (got_y[size_t(i)] == 0.0f) != (want_y[size_t(i)] == 0.0f);
          }
          EXPECT_EQ(mismatched, 0) << "dropout zeros" << at;
          if (p > 0 && n > 100) {
            EXPECT_GT(zeros, 0) << "nothing dropped" << at;
          }
          expect_rounded("dropout" + at, y, want_y);
          expect_rounded("dropout_add" + at, out, want_out);
          expect_rounded("dropout in place" + at, xa, want_y);
          expect_rounded("dropout_add into x" + at, xb, want_out);
          expect_rounded("dropout_add into residual" + at, ra, want_out);
        }
}

// ---------------------------------------------------------------------------- layernorm

// A residual LayerNorm problem: rows x cols, the inputs rounded to the compute dtype t.
struct ResidualNormInputs {
  int rows, cols;
  DType t;
  std::vector<float> x, residual, gamma, beta, dy, dgamma, dbeta;
  ResidualNormInputs(int r, int c, DType type)
      : rows(r), cols(c), t(type),
        x(rounded(uniform(int64_t(r) * c, 1), t)),
        residual(rounded(uniform(int64_t(r) * c, 2, -1.0f, 3.0f), t)),  // rows with a non-zero mean
        gamma(rounded(uniform(c, 3, 0.5f, 1.5f), t)),
        beta(rounded(uniform(c, 4), t)),
        dy(rounded(uniform(int64_t(r) * c, 5), t)),
        dgamma(uniform(c, 6)),  // F32 gradients that already hold values: the ops add onto them
        dbeta(uniform(c, 7)) {}
};

// Where its tensors start. in_place: sum is x and dx is dy, as BERT calls the ops. x and
// dx (dy when in place) start x_offset elements from a 16-byte boundary, the others
// `offset`: an offset of 1 takes the scalar paths, and x alone at 1 leaves the fused ops
// unable to follow LayerNorm's 16-byte layout (they then run the unfused pair).
struct ResidualNormLayout {
  bool in_place;
  int x_offset, offset;
};
constexpr ResidualNormLayout kResidualNormLayouts[] = {{false, 0, 0}, {true, 0, 0}, {false, 1, 0}, {true, 1, 0}};

// What the ops computed: the raw bytes of each output, and the F32 parameter gradients.
struct ResidualNormResults {
  std::vector<uint8_t> sum, y, mean, rstd, dsum, dx;
  std::vector<float> dgamma, dbeta;
};

std::vector<uint8_t> raw_bytes(const Dev& d) {
  std::vector<uint8_t> b(d.t.bytes());
  d.download_bytes(b.data());
  return b;
}

// Forward and backward of the residual LayerNorm: the fused ops, or the unfused ones
// they replace (dropout_add, layernorm_forward, layernorm_backward, dropout). The fused
// forward also runs without sum (inference), which must leave x as it was.
ResidualNormResults run_residual_norm(Backend& g, const ResidualNormInputs& in, const ResidualNormLayout& l,
                                      const DropoutSpec& d, bool fused) {
  const float eps = 1e-12f;
  const DType t = in.t;
  const Shape shape{in.rows, in.cols}, stat{in.rows};
  Dev x(g, t, shape, l.x_offset), residual(g, t, shape, l.offset), own_sum(g, t, shape, l.offset);
  Dev gamma(g, t, in.gamma, l.offset), beta(g, t, in.beta, l.offset);
  Dev y(g, t, shape, l.offset), mean(g, DType::F32, stat), rstd(g, DType::F32, stat);
  Dev dy(g, t, shape, l.in_place ? l.x_offset : l.offset), dsum(g, t, shape, l.offset), own_dx(g, t, shape, l.x_offset);
  Dev dgamma(g, DType::F32, in.dgamma), dbeta(g, DType::F32, in.dbeta);
  x.upload(in.x);
  residual.upload(in.residual);
  dy.upload(in.dy);
  const Dev& sum = l.in_place ? x : own_sum;
  const Dev& dx = l.in_place ? dy : own_dx;
  Tensor sum_t = sum.t, dx_t = dx.t;
  if (fused) {
    g.dropout_add_layernorm_forward(x.t, residual.t, d, gamma.t, beta.t, eps, sum_t, y.t, mean.t, rstd.t);
    g.layernorm_dropout_backward(dy.t, sum_t, gamma.t, mean.t, rstd.t, d, dsum.t, dx_t, dgamma.t, dbeta.t);
  } else {
    g.dropout_add(x.t, residual.t, d, sum_t);
    g.layernorm_forward(sum_t, gamma.t, beta.t, eps, y.t, mean.t, rstd.t);
    g.layernorm_backward(dy.t, sum_t, gamma.t, mean.t, rstd.t, dsum.t, dgamma.t, dbeta.t);
    g.dropout(dsum.t, d, dx_t);
  }
  return {raw_bytes(sum),  raw_bytes(y),  raw_bytes(mean),   raw_bytes(rstd),
          raw_bytes(dsum), raw_bytes(dx), dgamma.download(), dbeta.download()};
}

// The fused forward without sum (inference): y, mean and rstd, and x's bytes afterwards.
ResidualNormResults run_residual_norm_without_sum(Backend& g, const ResidualNormInputs& in,
                                                  const ResidualNormLayout& l, const DropoutSpec& d) {
  const DType t = in.t;
  const Shape shape{in.rows, in.cols}, stat{in.rows};
  Dev x(g, t, shape, l.x_offset), residual(g, t, shape, l.offset), gamma(g, t, in.gamma, l.offset),
      beta(g, t, in.beta, l.offset), y(g, t, shape, l.offset), mean(g, DType::F32, stat), rstd(g, DType::F32, stat);
  x.upload(in.x);
  residual.upload(in.residual);
  Tensor no_sum;
  g.dropout_add_layernorm_forward(x.t, residual.t, d, gamma.t, beta.t, 1e-12f, no_sum, y.t, mean.t, rstd.t);
  return {raw_bytes(x), raw_bytes(y), raw_bytes(mean), raw_bytes(rstd), {}, {}, {}, {}};
}

void expect_same_bytes(const std::string& what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                       size_t element_bytes) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); i += element_bytes)
    if (std::memcmp(&got[i], &want[i], element_bytes) != 0 && bad++ == 0) first = int64_t(i / element_bytes);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ from the unfused ops', the first at " << first;
}

// The fused ops against the unfused ones on the same backend and the same tensors (same
// dtype, same alignment): bit for bit for every output but dgamma and dbeta. Both run
// the same kernel code in the same thread layout, so each block's partial sums of dgamma
// and dbeta are the same; only the order in which the blocks' atomicAdds land differs,
// as between two runs of layernorm_backward itself. That reorders an F32 sum of at most
// 4 x SMs terms per column, so they are held to 1e-5 of the largest magnitude, as the
// F32 atomics of embedding_backward are.
TEST_F(MixedOps, FusedResidualLayerNormEqualsTheUnfusedOps) {
  Backend& g = gpu();
  const int64_t step = (int64_t(1) << 40) + 3;
  Dev device_step(g, DType::I64, Shape{1});
  device_step.upload_bytes(&step);
  // Seed and stream use their high words, which a 32-bit slip would lose.
  const uint64_t seed = 0x9E3779B97F4A7C15ull, site = 5;
  const DropoutSpec composed{0.1f, seed, (uint64_t(step) << kDropoutSiteBits) | site};
  struct Specs {
    DropoutSpec fused, unfused;
    std::string name;
  };
  const Specs specs[] = {{{}, {}, "p = 0"},
                         {composed, composed, "p = 0.1"},
                         {{0.1f, seed, site, device_step.t.ptr<int64_t>()}, composed, "p = 0.1, device step counter"}};
  // 13 columns: scalar rows in every dtype; 12: 16-byte rows in F32 only; 1000 and 1024:
  // 16-byte rows in all, 1000 leaving threads of the row idle.
  const std::pair<int, int> shapes[] = {{7, 13}, {9, 12}, {64, 1000}, {2048, 1024}};
  auto expect_atomic_sums_close = [](const std::string& what, const std::vector<float>& got,
                                     const std::vector<float>& want) {
    double scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(double(v)));
    expect_near(what, got, want, 0.0, 1e-5 * scale);
  };
  for (DType t : kComputeTypes)
    for (auto [R, C] : shapes) {
      const ResidualNormInputs in(R, C, t);
      for (const ResidualNormLayout& l : kResidualNormLayouts)
        for (const Specs& d : specs) {
          const std::string at = fmt::format(" ({}, {} x {}, {}, x offset {}, offset {}, {})", name(t), R, C,
                                             l.in_place ? "in place" : "separate outputs", l.x_offset, l.offset,
                                             d.name);
          const ResidualNormResults want = run_residual_norm(g, in, l, d.unfused, false);
          const ResidualNormResults got = run_residual_norm(g, in, l, d.fused, true);
          const size_t e = dtype_size(t);
          expect_same_bytes("sum" + at, got.sum, want.sum, e);
          expect_same_bytes("y" + at, got.y, want.y, e);
          expect_same_bytes("mean" + at, got.mean, want.mean, sizeof(float));
          expect_same_bytes("rstd" + at, got.rstd, want.rstd, sizeof(float));
          expect_same_bytes("dsum" + at, got.dsum, want.dsum, e);
          expect_same_bytes("dx" + at, got.dx, want.dx, e);
          expect_atomic_sums_close("dgamma" + at, got.dgamma, want.dgamma);
          expect_atomic_sums_close("dbeta" + at, got.dbeta, want.dbeta);
          // Without sum (inference): the same y and statistics, and x left as it was. (Where
          // no sum is written, "in place" is the separate layout: the unfused ops' statistics
          // follow the alignment of where the sum is stored, here sum's own.)
          if (l.in_place) continue;
          const ResidualNormResults alone = run_residual_norm_without_sum(g, in, l, d.fused);
          Dev x_in(g, t, Shape{R, C});
          x_in.upload(in.x);
          expect_same_bytes("x without sum" + at, alone.sum, raw_bytes(x_in), e);
          expect_same_bytes("y without sum" + at, alone.y, want.y, e);
          expect_same_bytes("mean without sum" + at, alone.mean, want.mean, sizeof(float));
          expect_same_bytes("rstd without sum" + at, alone.rstd, want.rstd, sizeof(float));
        }
    }
}

// parts_add_layernorm_forward is the fused residual LayerNorm on the product's output as
// the split product's parts add up to it (in order, then the bias, rounded to the dtype):
// its kernel spreads a row over more threads, so the row's sums add in another order, and
// the statistics agree to float rounding, y to the dtype's (an element may round the other
// way). In every dtype, on scalar and 16-byte rows, from one part to the most, with and
// without a bias.
// The residual LayerNorm at bert-large's batch 32 (16384 rows of 1024, bf16), forward and
// backward, without and with the hidden states' dropout: time and the rate of the bytes each
// must move (forward: x and residual in, sum and y out; backward: dy and sum in, dsum and dx
// out). Printed, not asserted.
TEST_F(MixedOps, ResidualLayerNormSpeed) {
  Backend& g = gpu();
  const int64_t rows = 16384, cols = 1024;
  const Shape shape{rows, cols}, stat{rows};
  const DType t = DType::BF16;
  test::DeviceTensor x(g, t, test::random(shape, 1, -1.0f, 1.0f)), residual(g, t, test::random(shape, 2, -1.0f, 1.0f)),
      dy(g, t, test::random(shape, 3, -1.0f, 1.0f)), gamma(g, t, test::random({cols}, 4, 0.5f, 1.5f)),
      beta(g, t, test::random({cols}, 5, -0.1f, 0.1f)), sum(g, t, shape), y(g, t, shape), dsum(g, t, shape),
      dx(g, t, shape), mean(g, DType::F32, stat), rstd(g, DType::F32, stat), dgamma(g, DType::F32, Shape{cols}),
      dbeta(g, DType::F32, Shape{cols});
  const double bytes = 4.0 * double(rows * cols) * 2;
  for (const float p : {0.0f, 0.1f}) {
    const DropoutSpec d{p, 42, 7};
    const double forward = test::average_ms(g, [&] {
      ops::dropout_add_layernorm_forward(g, x.t, residual.t, d, gamma.t, beta.t, 1e-12f, sum.t, y.t, mean.t, rstd.t);
    });
    const double backward = test::average_ms(g, [&] {
      ops::layernorm_dropout_backward(g, dy.t, sum.t, gamma.t, mean.t, rstd.t, d, dsum.t, dx.t, dgamma.t, dbeta.t);
    });
    std::printf("  p = %.1f: forward %.1f us (%.0f GB/s), backward %.1f us (%.0f GB/s)\n", p, forward * 1e3,
                bytes / forward / 1e6, backward * 1e3, bytes / backward / 1e6);
  }
}

TEST_F(MixedOps, PartsResidualLayerNormIsTheFusedOpOnTheSummedProduct) {
  Backend& g = gpu();
  const float eps = 1e-12f;
  const std::pair<int, int> shapes[] = {{7, 13}, {128, 1024}, {300, 1000}};
  for (DType t : kComputeTypes)
    for (auto [R, C] : shapes)
      for (int count : {1, 3, 4, 8})
        for (bool with_bias : {true, false}) {
          const std::string at = fmt::format(" ({}, {} x {}, {} parts{})", name(t), R, C, count,
                                             with_bias ? ", bias" : "");
          const ResidualNormInputs in(R, C, t);
          const size_t size = size_t(R) * C;
          const std::vector<float> parts = uniform(int64_t(count) * R * C, 8, -2.0f, 2.0f);
          const std::vector<float> bias = rounded(uniform(C, 9), t);
          std::vector<float> out(size);
          for (size_t i = 0; i < size; ++i) {
            float v = parts[i];
            for (int s = 1; s < count; ++s) v += parts[size_t(s) * size + i];
            if (with_bias) v += bias[i % size_t(C)];
            out[i] = round_to(v, t);
          }
          const Shape shape{R, C}, stat{R};
          Dev dparts(g, DType::F32, Shape{count, R, C}), dbias(g, t, bias), residual(g, t, shape);
          Dev gamma(g, t, in.gamma), beta(g, t, in.beta), x(g, t, shape);
          dparts.upload(parts);
          residual.upload(in.residual);
          x.upload(out);
          Dev y(g, t, shape), mean(g, DType::F32, stat), rstd(g, DType::F32, stat);
          Dev want_y(g, t, shape), want_mean(g, DType::F32, stat), want_rstd(g, DType::F32, stat);
          g.parts_add_layernorm_forward(dparts.t, with_bias ? &dbias.t : nullptr, residual.t, gamma.t, beta.t, eps,
                                        y.t, mean.t, rstd.t);
          Tensor no_sum;
          g.dropout_add_layernorm_forward(x.t, residual.t, {}, gamma.t, beta.t, eps, no_sum, want_y.t, want_mean.t,
                                          want_rstd.t);
          expect_near("y" + at, y.download(), want_y.download(), 2 * rounding(t) + 1e-6, 1e-6);
          expect_near("mean" + at, mean.download(), want_mean.download(), 1e-6, 1e-6);
          expect_near("rstd" + at, rstd.download(), want_rstd.download(), 1e-6, 0.0);
        }
}

// At a small batch's rows the CUDA backend splits a product whose k is longer than its
// output is wide (bert-large's down projection at 128 tokens, and at the one first token
// of the last layer; not the out projection), and the combined op then agrees with the
// product and the fused norm unsplit: the product's sums run in another order, so its
// output may round an ulp apart, and y with it. With work for the product's output alone
// it runs those very ops, bit for bit.
TEST_F(MixedOps, LinearAddLayerNormSplitsSmallProductsAndAgreesWithTheUnsplitOps) {
  Backend& g = gpu();
  const float eps = 1e-12f;
  int sms = 0;
  test::cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  const int N = 1024;
  for (DType t : kHalves)
    for (auto [M, K] : {std::pair{128, 4096}, std::pair{128, 1024}, std::pair{1, 4096}}) {
      const std::string at = fmt::format(" ({}, {} x {} x {})", name(t), M, N, K);
      const int splits = g.linear_splits(M, N, K, t);
      if (sms >= 64) {
        EXPECT_EQ(splits > 1, K > N) << at;
      }
      const Shape shape{M, N}, stat{M};
      Dev x(g, t, rounded(uniform(int64_t(M) * K, 11), t)), w(g, t, rounded(uniform(int64_t(N) * K, 12, -0.05f, 0.05f), t));
      Dev b(g, t, rounded(uniform(N, 13), t)), residual(g, t, rounded(uniform(int64_t(M) * N, 14, -1.0f, 3.0f), t));
      Dev gamma(g, t, rounded(uniform(N, 15, 0.5f, 1.5f), t)), beta(g, t, rounded(uniform(N, 16), t));
      const Tensor xt = x.t.view({M, K}), wt = w.t.view({N, K}), rt = residual.t.view(shape);
      Dev out(g, t, shape), want_y(g, t, shape), want_mean(g, DType::F32, stat), want_rstd(g, DType::F32, stat);
      Tensor no_sum;
      g.linear_forward(xt, wt, &b.t, out.t);
      g.dropout_add_layernorm_forward(out.t, rt, {}, gamma.t, beta.t, eps, no_sum, want_y.t, want_mean.t, want_rstd.t);
      for (bool room_for_parts : {true, false}) {
        const std::string how = at + (room_for_parts ? ", split" : ", work for the output alone");
        const int64_t elems = room_for_parts ? ops::linear_add_layernorm_work(g, M, N, K, t) : int64_t(M) * N;
        Dev work(g, t, Shape{elems}), y(g, t, shape), mean(g, DType::F32, stat), rstd(g, DType::F32, stat);
        ops::linear_add_layernorm_forward(g, xt, wt, &b.t, rt, gamma.t, beta.t, eps, work.t, y.t, mean.t, rstd.t);
        if (room_for_parts) {
          expect_near("y" + how, y.download(), want_y.download(), 2 * rounding(t), 0.05);
          expect_near("mean" + how, mean.download(), want_mean.download(), 1e-3, 1e-3);
          expect_near("rstd" + how, rstd.download(), want_rstd.download(), 1e-3, 0.0);
        } else {
          expect_same_bytes("y" + how, raw_bytes(y), raw_bytes(want_y), dtype_size(t));
          expect_same_bytes("mean" + how, raw_bytes(mean), raw_bytes(want_mean), sizeof(float));
          expect_same_bytes("rstd" + how, raw_bytes(rstd), raw_bytes(want_rstd), sizeof(float));
        }
      }
    }
}

// ---------------------------------------------------------------------------- embedding

struct EmbeddingCase {
  int batch, seq, hidden, vocab, positions;
};
// Hidden 13: scalar rows; 12: float4 rows in F32 but scalar halves; 768: 16-byte rows in all.
constexpr EmbeddingCase kEmbeddingCases[] = {{3, 37, 13, 50, 40}, {2, 9, 12, 20, 16}, {8, 128, 768, 1000, 512}};

std::vector<int32_t> token_ids(const EmbeddingCase& c) {
  std::vector<int32_t> ids = random_ints(int64_t(c.batch) * c.seq, 1, 0, c.vocab);
  for (size_t t = 0; t < ids.size(); t += 4) ids[t] = 1;  // a frequent token: many adds into one row
  return ids;
}

TEST_F(MixedOps, EmbeddingForwardGatherScatterRoundOrMoveBits) {
  Backend& g = gpu();
  for (DType t : kHalves)
    for (const EmbeddingCase& c : kEmbeddingCases) {
      const int64_t T = int64_t(c.batch) * c.seq, H = c.hidden;
      const std::vector<int32_t> idv = token_ids(c), typev = random_ints(T, 2, 0, 2);
      const std::vector<float> wv = rounded(uniform(c.vocab * H, 3), t), pv = rounded(uniform(c.positions * H, 4), t);
      const std::vector<float> tv = rounded(uniform(2 * H, 5), t), hv = rounded(uniform(T * H, 6), t);
      const std::vector<float> fv = rounded(uniform(c.batch * H, 10), t);
      Dev ids(g, DType::I32, Shape{T}), types(g, DType::I32, Shape{T});
      ids.upload_bytes(idv.data());
      types.upload_bytes(typev.data());
      auto table = [&](DType d, const std::vector<float>& v, int64_t rows) {
        auto x = std::make_unique<Dev>(g, d, Shape{rows, H});
        x->upload(v);
        return x;
      };
      // Out = word + pos + type, summed in F32 in the same order, rounded once.
      auto w32 = table(DType::F32, wv, c.vocab), p32 = table(DType::F32, pv, c.positions);
      auto ty32 = table(DType::F32, tv, 2);
      Dev out32(g, DType::F32, Shape{T, H});
      g.embedding_forward(ids.t, types.t, Tensor{}, w32->t, p32->t, ty32->t, c.seq, out32.t);
      auto w = table(t, wv, c.vocab), p = table(t, pv, c.positions), ty = table(t, tv, 2);
      Dev out(g, t, Shape{T, H});
      g.embedding_forward(ids.t, types.t, Tensor{}, w->t, p->t, ty->t, c.seq, out.t);
      const std::string at = fmt::format(" ({}, B={} S={} hidden={})", name(t), c.batch, c.seq, H);
      expect_rounded("embedding out" + at, out, out32.download());

      // Gather and scatter: the [CLS] rows, and zeros elsewhere, exactly.
      auto hidden = table(t, hv, T), dfirst = table(t, fv, c.batch);
      Dev first(g, t, Shape{c.batch, H}), dhidden(g, t, Shape{T, H});
      g.gather_first_tokens(hidden->t, c.seq, first.t);
      g.scatter_first_tokens(dfirst->t, c.seq, dhidden.t);
      std::vector<float> want_first(size_t(c.batch * H)), want_dhidden(size_t(T * H), 0.0f);
      for (int b = 0; b < c.batch; ++b)
        for (int64_t k = 0; k < H; ++k) {
          want_first[size_t(b * H + k)] = hv[size_t(b * c.seq * H + k)];
          want_dhidden[size_t(b * c.seq * H + k)] = fv[size_t(b * H + k)];
        }
      expect_rounded("gather_first_tokens" + at, first, want_first);
      expect_rounded("scatter_first_tokens" + at, dhidden, want_dhidden);
    }
}

// Mixed precision reads the tables from the F32 master weights: the lookup sums F32 values
// (not rounded beforehand) and rounds once, into the compute dtype; with and without the
// position table (ModernBERT has none).
TEST_F(MixedOps, EmbeddingForwardFromF32TablesRoundsTheSumOnce) {
  Backend& g = gpu();
  for (DType t : kHalves)
    for (const EmbeddingCase& c : kEmbeddingCases)
      for (bool positions : {true, false}) {
        const int64_t T = int64_t(c.batch) * c.seq, H = c.hidden;
        const std::vector<int32_t> idv = token_ids(c), typev = random_ints(T, 2, 0, 2);
        const std::vector<float> wv = uniform(c.vocab * H, 13), pv = uniform(c.positions * H, 14);
        const std::vector<float> tv = uniform(2 * H, 15);
        Dev ids(g, DType::I32, Shape{T}), types(g, DType::I32, Shape{T});
        ids.upload_bytes(idv.data());
        types.upload_bytes(typev.data());
        Dev word(g, DType::F32, Shape{c.vocab, H}), pos(g, DType::F32, Shape{c.positions, H}),
            type(g, DType::F32, Shape{2, H});
        word.upload(wv);
        pos.upload(pv);
        type.upload(tv);
        const Tensor pos_t = positions ? pos.t : Tensor{}, type_t = positions ? type.t : Tensor{};
        const Tensor types_t = positions ? types.t : Tensor{};
        Dev out32(g, DType::F32, Shape{T, H}), out(g, t, Shape{T, H});
        g.embedding_forward(ids.t, types_t, Tensor{}, word.t, pos_t, type_t, c.seq, out32.t);
        g.embedding_forward(ids.t, types_t, Tensor{}, word.t, pos_t, type_t, c.seq, out.t);
        expect_rounded(fmt::format("embedding from F32 tables ({}, B={} S={} hidden={}{})", name(t), c.batch, c.seq, H,
                                   positions ? "" : ", no positions"),
                       out, out32.download());
      }
}

TEST_F(MixedOps, EmbeddingBackwardAccumulatesHalfGradientsIntoF32) {
  Backend& g = gpu();
  for (DType t : kHalves)
    for (const EmbeddingCase& c : kEmbeddingCases) {
      const int64_t T = int64_t(c.batch) * c.seq, H = c.hidden;
      const std::vector<int32_t> idv = token_ids(c), typev = random_ints(T, 2, 0, 2);
      const std::vector<float> doutv = rounded(uniform(T * H, 6), t);
      // The gradients already hold values (accumulation): the result adds onto them.
      const std::vector<float> wv = uniform(c.vocab * H, 7), pv = uniform(c.positions * H, 8), tv = uniform(2 * H, 9);
      Dev ids(g, DType::I32, Shape{T}), types(g, DType::I32, Shape{T}), dout(g, t, Shape{T, H});
      ids.upload_bytes(idv.data());
      types.upload_bytes(typev.data());
      dout.upload(doutv);
      Dev dword(g, DType::F32, Shape{c.vocab, H}), dpos(g, DType::F32, Shape{c.positions, H});
      Dev dtype(g, DType::F32, Shape{2, H});
      dword.upload(wv);
      dpos.upload(pv);
      dtype.upload(tv);
      g.embedding_backward(dout.t, ids.t, types.t, Tensor{}, c.seq, dword.t, dpos.t, dtype.t);
      // The reference in double on the host.
      std::vector<double> rw(wv.begin(), wv.end()), rp(pv.begin(), pv.end()), rt(tv.begin(), tv.end());
      for (int64_t i = 0; i < T; ++i)
        for (int64_t k = 0; k < H; ++k) {
          const double d = doutv[size_t(i * H + k)];
          rw[size_t(idv[size_t(i)] * H + k)] += d;
          rp[size_t((i % c.seq) * H + k)] += d;
          rt[size_t(typev[size_t(i)] * H + k)] += d;
        }
      // F32 sums in the order of the atomics: 1e-5 of the largest magnitude, as the F32
      // path is held to against the CPU.
      auto check = [&](const std::string& what, const Dev& got, const std::vector<double>& want) {
        const std::vector<float> w(want.begin(), want.end());
        double scale = 0;
        for (float v : w) scale = std::max(scale, std::fabs(double(v)));
        expect_near(what + fmt::format(" ({}, B={} S={} hidden={})", name(t), c.batch, c.seq, H), got.download(), w, 0.0,
                    1e-5 * scale);
      };
      check("dword", dword, rw);
      check("dpos", dpos, rp);
      check("dtype", dtype, rt);
    }
}

// ---------------------------------------------------------------------------- loss

// Powers of two, so that the scaled F32 gradient is exactly the unscaled one times it.
constexpr float kLossScales[] = {1024.0f, 0.25f};

TEST_F(MixedOps, CrossEntropyInHalvesAndLossScale) {
  Backend& g = gpu();
  struct Case {
    int rows, classes;
    std::vector<int> ignored;  // rows labelled -100
  };
  for (DType t : kComputeTypes)
    for (const Case& c : {Case{4, 5, {1}}, Case{64, 2, {0, 7, 63}}, Case{7, 1001, {3}}, Case{2, 3, {0, 1}}}) {
      std::vector<int32_t> labelv = random_ints(c.rows, 1, 0, c.classes);
      for (int r : c.ignored) labelv[size_t(r)] = -100;
      const std::vector<float> xv = rounded(uniform(int64_t(c.rows) * c.classes, 2, -2.0f, 2.0f), t);
      const Shape shape{c.rows, c.classes};
      Dev labels(g, DType::I32, Shape{c.rows});
      labels.upload_bytes(labelv.data());
      Dev x32(g, DType::F32, shape), loss32(g, DType::F32, Shape{1}), dx32(g, DType::F32, shape);
      x32.upload(xv);
      g.cross_entropy(x32.t, labels.t, 0.5f, nullptr, loss32.t, dx32.t);
      const std::vector<float> want_loss = loss32.download(), want_dx = dx32.download();
      const std::string at = fmt::format(" ({}, {} x {}, {} ignored)", name(t), c.rows, c.classes, c.ignored.size());

      Dev x(g, t, shape), loss(g, DType::F32, Shape{1}), dx(g, t, shape);
      x.upload(xv);
      g.cross_entropy(x.t, labels.t, 0.5f, nullptr, loss.t, dx.t);
      // The same inputs in the same double arithmetic: the same F32 loss.
      expect_near("loss" + at, loss.download(), want_loss, 1e-6, 0.0);
      expect_within_rounding("dlogits" + at, dx, want_dx);

      for (float s : kLossScales) {
        Dev scale(g, DType::F32, std::vector<float>{s});
        g.cross_entropy(x.t, labels.t, 0.5f, &scale.t, loss.t, dx.t);
        std::vector<float> want_scaled = want_dx;
        for (float& v : want_scaled) v *= s;
        const std::string sat = at + fmt::format(" loss scale {}", s);
        expect_near("loss" + sat, loss.download(), want_loss, 1e-6, 0.0);  // the loss is not scaled
        expect_within_rounding("scaled dlogits" + sat, dx, want_scaled);
      }
    }
}

TEST_F(MixedOps, MseInHalvesAndLossScale) {
  Backend& g = gpu();
  for (DType t : kComputeTypes)
    for (Shape shape : {Shape{5}, Shape{5, 1}, Shape{1001}}) {
      const int64_t n = shape[0];
      const std::vector<float> pv = rounded(uniform(n, 1), t), target = uniform(n, 2);
      Dev tg(g, DType::F32, target);
      Dev p32(g, DType::F32, shape), loss32(g, DType::F32, Shape{1}), dp32(g, DType::F32, shape);
      p32.upload(pv);
      g.mse(p32.t, tg.t, 2.0f, nullptr, loss32.t, dp32.t);
      const std::vector<float> want_loss = loss32.download(), want_dp = dp32.download();
      const std::string at = fmt::format(" ({}, {})", name(t), shape.str());

      Dev p(g, t, shape), loss(g, DType::F32, Shape{1}), dp(g, t, shape);
      p.upload(pv);
      g.mse(p.t, tg.t, 2.0f, nullptr, loss.t, dp.t);
      expect_near("loss" + at, loss.download(), want_loss, 1e-6, 0.0);
      expect_within_rounding("dpred" + at, dp, want_dp);

      for (float s : kLossScales) {
        Dev scale(g, DType::F32, std::vector<float>{s});
        g.mse(p.t, tg.t, 2.0f, &scale.t, loss.t, dp.t);
        std::vector<float> want_scaled = want_dp;
        for (float& v : want_scaled) v *= s;
        const std::string sat = at + fmt::format(" loss scale {}", s);
        expect_near("loss" + sat, loss.download(), want_loss, 1e-6, 0.0);
        expect_within_rounding("scaled dpred" + sat, dp, want_scaled);
      }
    }
}

}  // namespace
}  // namespace hone
