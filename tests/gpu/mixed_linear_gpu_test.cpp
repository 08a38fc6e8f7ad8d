// The mixed-precision paths of the CUDA backend (compute dtype BF16 or F16, F32
// statistics, parameter gradients and optimizer state) against the F32 CPU reference on
// the same values: inputs are drawn so that the half type represents them exactly, so
// the only differences are the rounding of each half output and the order of F32
// accumulation. Also the rounded parameter copy of AdamW, skipped steps, and the
// dynamic loss scaler of clip_coefficient. Backend methods are called directly.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/dtype.h"
#include "device_tensor.h"
#include "test_util.h"

namespace hone {
namespace {

using test::clone;
using test::DeviceTensor;
using test::expect_close;
using test::half_bits;
using test::HostTensor;
using test::round_to;
using test::filled;
using test::random;

constexpr DType kHalfTypes[] = {DType::BF16, DType::F16};

// Unit roundoff of each half type (8 and 11 significant bits): round to nearest even moves
// a value by at most this much relative to itself, so a half output is within u * max|ref|
// of the exact result, per rounding. The F32 arithmetic before that runs in another order
// than the CPU's, which adds ~1e-6 of the largest value at these sizes; 1e-4 covers it with
// room and stays well below either u, so the bound still shows a wrong rounding or dtype.
double unit_roundoff(DType t) { return t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }
double half_tol(DType t, int roundings = 1) { return roundings * unit_roundoff(t) + 1e-4; }
// F32 outputs (statistics, parameter gradients) from exactly representable inputs differ
// only in the order of F32 accumulation, as in the fp32 tests.
constexpr double kF32Tol = 1e-5;

// Uniform values rounded to the half type, so that BF16/F16 and F32 hold the same numbers.
HostTensor representable(DType t, Shape s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  HostTensor h = random(s, seed, lo, hi);
  for (int64_t i = 0; i < h.n(); ++i) h.f()[i] = round_to(h.f()[i], t);
  return h;
}


class GpuMixed : public test::GpuTest {
 protected:
  CpuBackend cpu;
};

// ---------------------------------------------------------------------------- linear

TEST_F(GpuMixed, LinearInHalfTypesMatchesF32AndAccumulatesF32Grads) {
  Backend& g = gpu();
  struct Case {
    int m, k, n;
  };
  // Odd shapes (2-byte aligned rows for cuBLASLt, scalar column sums), a width that is a
  // multiple of 4 but not of 8 (scalar column sums for halves), and BERT-like aligned ones.
  for (const Case& c : {Case{7, 13, 5}, Case{130, 257, 100}, Case{256, 1024, 768}}) {
    for (DType t : kHalfTypes) {
      const int M = c.m, K = c.k, N = c.n;
      const std::string at = fmt::format(" M={} K={} N={} {}", M, K, N, dtype_name(t));
      HostTensor x = representable(t, {M, K}, 1), w = representable(t, {N, K}, 2), b = representable(t, {N}, 3);
      HostTensor dy = representable(t, {M, N}, 4), dx0 = representable(t, {M, K}, 5);
      // dw and db accumulate into F32 that starts nonzero (not representable in t).
      HostTensor dw0 = random({N, K}, 6), db0 = random({N}, 7);

      // The F32 reference on the CPU.
      HostTensor y = filled({M, N}, 0), y_nobias = filled({M, N}, 0), dx = filled({M, K}, 0), dx_acc = clone(dx0);
      HostTensor dw = clone(dw0), db = clone(db0), dw_acc = clone(dw0);
      cpu.linear_forward(x.t, w.t, &b.t, y.t);
      cpu.linear_forward(x.t, w.t, nullptr, y_nobias.t);
      cpu.linear_backward(dy.t, x.t, w.t, &dx.t, false, dw.t, &db.t);
      cpu.linear_backward(dy.t, x.t, w.t, &dx_acc.t, true, dw_acc.t, nullptr);

      DeviceTensor gx(g, t, x), gw(g, t, w), gb(g, t, b), gdy(g, t, dy), gdx_acc(g, t, dx0);
      DeviceTensor gy(g, t, Shape{M, N}), gy_nobias(g, t, Shape{M, N}), gdx(g, t, Shape{M, K});
      DeviceTensor gdw(g, DType::F32, dw0), gdb(g, DType::F32, db0), gdw_acc(g, DType::F32, dw0);
      g.linear_forward(gx.t, gw.t, &gb.t, gy.t);
      g.linear_forward(gx.t, gw.t, nullptr, gy_nobias.t);
      g.linear_backward(gdy.t, gx.t, gw.t, &gdx.t, false, gdw.t, &gdb.t);
      g.linear_backward(gdy.t, gx.t, gw.t, &gdx_acc.t, true, gdw_acc.t, nullptr);

      expect_close("y" + at, gy.download(), y, half_tol(t));
      expect_close("y without bias" + at, gy_nobias.download(), y_nobias, half_tol(t));
      expect_close("dx" + at, gdx.download(), dx, half_tol(t));
      // cuBLASLt rounds the product to the half type before adding the half C (seen: 1.3 u off
      // for bf16 and 1.4 u for fp16 at 256 x 768 x 1024), as an add after the product would.
      expect_close("accumulated dx" + at, gdx_acc.download(), dx_acc, half_tol(t, 2));
      expect_close("dw (F32, accumulated)" + at, gdw.download(), dw, kF32Tol);
      expect_close("db (F32, accumulated)" + at, gdb.download(), db, kF32Tol);
      expect_close("dw without dx and db" + at, gdw_acc.download(), dw_acc, kF32Tol);
    }
  }
}

// ---------------------------------------------------------------------------- layernorm

TEST_F(GpuMixed, LayerNormInHalfTypesMatchesF32) {
  Backend& g = gpu();
  // Scalar access (13, and 1028: a multiple of 4 but not 8), 16-byte access with one warp
  // per row (1000, and bert-large's 1024) and with rows over several warps (4096).
  for (auto [R, C] : {std::pair<int, int>{7, 13}, {5, 1028}, {9, 1000}, {2048, 1024}, {33, 4096}}) {
    for (DType t : kHalfTypes) {
      const std::string at = fmt::format(" ({} x {}) {}", R, C, dtype_name(t));
      const float eps = 1e-12f;
      HostTensor x = representable(t, {R, C}, 1, -1.0f, 3.0f), gamma = representable(t, {C}, 2, 0.5f, 1.5f);
      HostTensor beta = representable(t, {C}, 3), dy = representable(t, {R, C}, 4);
      HostTensor dgamma0 = random({C}, 5), dbeta0 = random({C}, 6);

      HostTensor y = filled({R, C}, 0), mean = filled({R}, 0), rstd = filled({R}, 0), dx = filled({R, C}, 0);
      HostTensor dgamma = clone(dgamma0), dbeta = clone(dbeta0);
      cpu.layernorm_forward(x.t, gamma.t, beta.t, eps, y.t, mean.t, rstd.t);
      cpu.layernorm_backward(dy.t, x.t, gamma.t, mean.t, rstd.t, dx.t, dgamma.t, dbeta.t);

      DeviceTensor gx(g, t, x), ggamma(g, t, gamma), gbeta(g, t, beta), gdy(g, t, dy);
      DeviceTensor gy(g, t, Shape{R, C}), gmean(g, DType::F32, Shape{R}), grstd(g, DType::F32, Shape{R});
      DeviceTensor gdx(g, t, Shape{R, C}), gdgamma(g, DType::F32, dgamma0), gdbeta(g, DType::F32, dbeta0);
      g.layernorm_forward(gx.t, ggamma.t, gbeta.t, eps, gy.t, gmean.t, grstd.t);
      expect_close("y" + at, gy.download(), y, half_tol(t));
      expect_close("mean (F32)" + at, gmean.download(), mean, kF32Tol);
      expect_close("rstd (F32)" + at, grstd.download(), rstd, kF32Tol);
      gmean.upload(mean.f());  // backward from the same statistics as the CPU's
      grstd.upload(rstd.f());
      g.layernorm_backward(gdy.t, gx.t, ggamma.t, gmean.t, grstd.t, gdx.t, gdgamma.t, gdbeta.t);
      expect_close("dx" + at, gdx.download(), dx, half_tol(t));
      expect_close("dgamma (F32, accumulated)" + at, gdgamma.download(), dgamma, kF32Tol);
      expect_close("dbeta (F32, accumulated)" + at, gdbeta.download(), dbeta, kF32Tol);
    }
  }
}

// A launch whose blocks fill the GPU at most once stages gamma and beta in shared memory;
// a larger one reads them from global memory. The same rows give the same bits either way.
// (`few` rows are more than the SMs, so that the launch keeps the larger one's layout
// rather than spreading each row over more threads, which sums in another order.)
TEST_F(GpuMixed, LayerNormGivesTheSameBitsWhetherItStagesItsParameters) {
  Backend& g = gpu();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int R = 4096, C = 1024, few = 256;  // 512 blocks of 8 rows, and 32
  ASSERT_GT(few, sms);
  ASSERT_LE(few / 8, sms);
  for (DType t : kHalfTypes) {
    HostTensor x = representable(t, {R, C}, 1, -1.0f, 3.0f), gamma = representable(t, {C}, 2, 0.5f, 1.5f);
    HostTensor beta = representable(t, {C}, 3);
    HostTensor head = filled({few, C}, 0);
    std::copy(x.f(), x.f() + few * C, head.f());
    DeviceTensor gx(g, t, x), gfew(g, t, head), ggamma(g, t, gamma), gbeta(g, t, beta);
    DeviceTensor gy(g, t, Shape{R, C}), gmean(g, DType::F32, Shape{R}), grstd(g, DType::F32, Shape{R});
    DeviceTensor gy_few(g, t, Shape{few, C}), gmean_few(g, DType::F32, Shape{few}), grstd_few(g, DType::F32, Shape{few});
    g.layernorm_forward(gx.t, ggamma.t, gbeta.t, 1e-12f, gy.t, gmean.t, grstd.t);
    g.layernorm_forward(gfew.t, ggamma.t, gbeta.t, 1e-12f, gy_few.t, gmean_few.t, grstd_few.t);
    const std::vector<float> y = gy.download(), y_few = gy_few.download();
    const std::vector<float> mean = gmean.download(), mean_few = gmean_few.download();
    for (size_t i = 0; i < y_few.size(); ++i) ASSERT_EQ(y[i], y_few[i]) << dtype_name(t) << " y " << i;
    for (size_t r = 0; r < mean_few.size(); ++r) ASSERT_EQ(mean[r], mean_few[r]) << dtype_name(t) << " mean " << r;
  }
}

// ---------------------------------------------------------------------------- optimizer

// One AdamW list on both backends: slices of odd and large sizes, one without a rounded
// copy, one whose copy starts 2 bytes past an 8-byte boundary (the unvectorized path).
struct AdamWLists {
  static constexpr int kCount = 3;
  static constexpr int64_t kSizes[kCount] = {7, 1001, (1 << 20) + 3};
  static constexpr bool kHasHalf[kCount] = {true, false, true};
  static constexpr int64_t kHalfOffset[kCount] = {1, 0, 0};  // elements

  DType t;
  std::vector<HostTensor> p, grad, m, v, half;     // CPU
  std::vector<std::unique_ptr<DeviceTensor>> dp, dgrad, dm, dv, dhalf;  // GPU; dhalf has the offset's room
  std::vector<AdamWSlice> cpu_slices, gpu_slices;

  AdamWLists(Backend& g, DType type) : t(type) {
    for (int i = 0; i < kCount; ++i) {
      const int64_t n = kSizes[i];
      p.push_back(random({n}, uint64_t(i)));
      grad.push_back(random({n}, uint64_t(20 + i)));
      m.push_back(random({n}, uint64_t(40 + i), -0.1f, 0.1f));
      v.push_back(random({n}, uint64_t(60 + i), 0.0f, 0.01f));
      half.emplace_back(t, Shape{n});
      std::memset(half.back().storage.data(), 0xff, half.back().storage.size());  // NaN bits
      for (auto [host, dev] : {std::pair{&p, &dp}, {&grad, &dgrad}, {&m, &dm}, {&v, &dv}})
        dev->push_back(std::make_unique<DeviceTensor>(g, DType::F32, host->back()));
      dhalf.push_back(std::make_unique<DeviceTensor>(g, t, Shape{n + kHalfOffset[i]}));  // NaN bits
      cpu_slices.push_back({p[i].t, grad[i].t, m[i].t, v[i].t, i % 2 ? 0.0 : 0.1, kHasHalf[i] ? half[i].t : Tensor{}});
      gpu_slices.push_back(
          {dp[i]->t, dgrad[i]->t, dm[i]->t, dv[i]->t, i % 2 ? 0.0 : 0.1, kHasHalf[i] ? gpu_half(i) : Tensor{}});
    }
  }
  Tensor gpu_half(int i) const {
    Tensor h = dhalf[size_t(i)]->t;
    h.data = static_cast<char*>(h.data) + kHalfOffset[i] * 2;
    h.shape = {kSizes[i]};
    return h;
  }
};

TEST_F(GpuMixed, AdamWWritesTheRoundedParametersInTheSamePass) {
  Backend& g = gpu();
  for (DType t : kHalfTypes) {
    AdamWLists l(g, t);
    HostTensor coef = filled({kNormCoefSize}, 0.0f);
    coef.f()[1] = 0.7f;
    DeviceTensor gcoef(g, DType::F32, coef);
    const AdamWStep st{.lr = 0.05, .step = 3};
    cpu.adamw(l.cpu_slices.data(), AdamWLists::kCount, st, coef.t);
    g.adamw(l.gpu_slices.data(), AdamWLists::kCount, st, gcoef.t);
    for (int i = 0; i < AdamWLists::kCount; ++i) {
      const std::string at = fmt::format(" (slice {}, n = {}, {})", i, AdamWLists::kSizes[i], dtype_name(t));
      const std::vector<float> param = l.dp[size_t(i)]->download();
      expect_close("param" + at, param, l.p[size_t(i)], kF32Tol);
      expect_close("m" + at, l.dm[size_t(i)]->download(), l.m[size_t(i)], kF32Tol);
      expect_close("v" + at, l.dv[size_t(i)]->download(), l.v[size_t(i)], kF32Tol);
      const std::vector<uint16_t> bits = l.dhalf[size_t(i)]->bits();
      const uint16_t* cpu_bits = l.half[size_t(i)].t.ptr<uint16_t>();
      const int64_t off = AdamWLists::kHalfOffset[i];
      for (int64_t j = 0; j < AdamWLists::kSizes[i]; ++j) {
        // Without a copy the memory keeps its NaN bits; with one, each element is the
        // updated parameter rounded to nearest even, on either backend.
        const uint16_t want = AdamWLists::kHasHalf[i] ? half_bits(param[size_t(j)], t) : uint16_t(0xffff);
        const uint16_t cpu_want = AdamWLists::kHasHalf[i] ? half_bits(l.p[size_t(i)].f()[j], t) : uint16_t(0xffff);
        ASSERT_EQ(bits[size_t(j + off)], want) << "GPU copy, element " << j << at;
        ASSERT_EQ(cpu_bits[j], cpu_want) << "CPU copy, element " << j << at;
      }
      if (off) {
        EXPECT_EQ(bits[0], 0xffff) << "written before the copy" << at;
      }
    }
  }
}

TEST_F(GpuMixed, AdamWSkippedStepChangesNothing) {
  Backend& g = gpu();
  for (DType t : kHalfTypes) {
    AdamWLists l(g, t);
    HostTensor coef = filled({kNormCoefSize}, 0.0f);
    coef.f()[1] = 0.7f;
    coef.f()[2] = 1.0f;  // the gradients overflowed
    DeviceTensor gcoef(g, DType::F32, coef);
    std::vector<std::vector<std::byte>> before;
    for (int i = 0; i < AdamWLists::kCount; ++i)
      for (const HostTensor* h : {&l.p[size_t(i)], &l.m[size_t(i)], &l.v[size_t(i)], &l.half[size_t(i)]})
        before.push_back(h->storage);
    const AdamWStep st{.lr = 0.05, .step = 3};
    cpu.adamw(l.cpu_slices.data(), AdamWLists::kCount, st, coef.t);
    g.adamw(l.gpu_slices.data(), AdamWLists::kCount, st, gcoef.t);
    size_t k = 0;
    for (int i = 0; i < AdamWLists::kCount; ++i) {
      const std::string at = fmt::format(" (slice {}, {})", i, dtype_name(t));
      const std::vector<const HostTensor*> host = {&l.p[size_t(i)], &l.m[size_t(i)], &l.v[size_t(i)]};
      const std::vector<const DeviceTensor*> dev = {l.dp[size_t(i)].get(), l.dm[size_t(i)].get(),
                                                    l.dv[size_t(i)].get()};
      for (size_t j = 0; j < host.size(); ++j, ++k) {
        EXPECT_TRUE(host[j]->storage == before[k]) << "CPU state " << j << at;
        std::vector<std::byte> got(host[j]->storage.size());
        dev[j]->download_bytes(got.data());
        EXPECT_TRUE(got == before[k]) << "GPU state " << j << at;
      }
      EXPECT_TRUE(l.half[size_t(i)].storage == before[k++]) << "CPU copy" << at;
      for (uint16_t b : l.dhalf[size_t(i)]->bits()) ASSERT_EQ(b, 0xffff) << "GPU copy" << at;
    }
  }
}

// The loss scaler through a sequence of steps, GPU and CPU side by side, against torch's
// rules: the norm and coefficient are those of the unscaled gradients (divided by the
// scale), an inf or NaN sum of squares flags the step and halves the scale, and
// growth_interval clean steps in a row double it.
TEST_F(GpuMixed, ClipCoefficientUpdatesTheLossScaler) {
  Backend& g = gpu();
  const LossScaling ls{.init_scale = 1024.0f, .growth_factor = 2.0f, .backoff_factor = 0.5f, .growth_interval = 3};
  constexpr float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();
  struct Step {
    float unscaled_sumsq;  // times scale^2 gives the scaled gradients' sum of squares
    float max_norm;
    float scale_after, count_after;
  };
  const Step steps[] = {
      {9.0f, 1.0f, 1024, 1}, {9.0f, 10.0f, 1024, 2}, {9.0f, 1.0f, 2048, 0},  // the third clean step grows
      {kInf, 1.0f, 1024, 0}, {9.0f, 0.0f, 1024, 1},  {kNan, 1.0f, 512, 0},   // overflows back off
      {0.25f, 1.0f, 512, 1}, {9.0f, 1.0f, 512, 2},   {9.0f, 1.0f, 1024, 0},
  };
  HostTensor scaler = filled({kScalerSize}, 0.0f), coef = filled({kNormCoefSize}, 0.0f), sumsq = filled({1}, 0.0f);
  scaler.f()[0] = ls.init_scale;
  DeviceTensor gscaler(g, DType::F32, scaler), gcoef(g, DType::F32, coef), gsumsq(g, DType::F32, sumsq);
  for (const Step& s : steps) {
    const float scale = scaler.f()[0];
    const std::string at = fmt::format(" (sumsq {} * {}^2, max_norm {})", s.unscaled_sumsq, scale, s.max_norm);
    sumsq.f()[0] = s.unscaled_sumsq * scale * scale;
    gsumsq.upload(sumsq.f());
    cpu.clip_coefficient(sumsq.t, s.max_norm, coef.t, &scaler.t, ls);
    g.clip_coefficient(gsumsq.t, s.max_norm, gcoef.t, &gscaler.t, ls);
    const std::vector<float> got = gcoef.download(), got_scaler = gscaler.download();
    const bool overflow = !std::isfinite(s.unscaled_sumsq);
    EXPECT_EQ(coef.f()[2], overflow ? 1.0f : 0.0f) << "CPU skip flag" << at;
    EXPECT_EQ(scaler.f()[0], s.scale_after) << "CPU scale" << at;
    EXPECT_EQ(scaler.f()[1], s.count_after) << "CPU clean steps" << at;
    if (!overflow) {
      const double norm = std::sqrt(double(s.unscaled_sumsq));  // exact: the scale is a power of two
      const double clip = s.max_norm > 0 ? std::min(1.0, s.max_norm / (norm + 1e-6)) : 1.0;
      EXPECT_FLOAT_EQ(coef.f()[0], float(norm)) << "CPU norm" << at;
      EXPECT_FLOAT_EQ(coef.f()[1], float(clip / scale)) << "CPU coefficient" << at;
    }
    // The GPU runs the same double formulas: equal to the bit, NaN where the CPU has NaN.
    for (int i = 0; i < kNormCoefSize; ++i) {
      if (std::isnan(coef.f()[i]))
        EXPECT_TRUE(std::isnan(got[size_t(i)])) << "norm_coef[" << i << "]" << at;
      else
        EXPECT_EQ(got[size_t(i)], coef.f()[i]) << "norm_coef[" << i << "]" << at;
    }
    EXPECT_EQ(got_scaler[0], scaler.f()[0]) << "GPU scale" << at;
    EXPECT_EQ(got_scaler[1], scaler.f()[1]) << "GPU clean steps" << at;
  }
}

// Without a scaler nothing is unscaled and nothing is skipped, even for an inf sum.
TEST_F(GpuMixed, ClipCoefficientWithoutScalerNeverSkips) {
  Backend& g = gpu();
  for (float sumsq_value : {9.0f, std::numeric_limits<float>::infinity()}) {
    HostTensor coef = filled({kNormCoefSize}, -1.0f), sumsq = filled({1}, sumsq_value);
    DeviceTensor gcoef(g, DType::F32, coef), gsumsq(g, DType::F32, sumsq);
    cpu.clip_coefficient(sumsq.t, 1.0f, coef.t, nullptr, {});
    g.clip_coefficient(gsumsq.t, 1.0f, gcoef.t, nullptr, {});
    const std::vector<float> got = gcoef.download();
    for (int i = 0; i < kNormCoefSize; ++i) EXPECT_EQ(got[size_t(i)], coef.f()[i]) << "norm_coef[" << i << "]";
    EXPECT_EQ(coef.f()[2], 0.0f);
    if (sumsq_value == 9.0f) {
      EXPECT_FLOAT_EQ(coef.f()[0], 3.0f);
      EXPECT_EQ(coef.f()[1], float(1.0 / (3.0 + 1e-6)));
    }
  }
}

}  // namespace
}  // namespace hone
