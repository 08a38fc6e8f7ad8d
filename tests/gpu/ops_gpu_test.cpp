// Every op of the CUDA backend against the CPU reference backend on the same random
// inputs and shapes, odd sizes included: fp32 within 1e-5 relative, TF32 products
// within 1e-3, dropout masks and data movement identical.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <deque>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/ops.h"
#include "device_tensor.h"
#include "test_util.h"

namespace hone {
namespace {

using test::clone;
using test::DeviceTensor;
using test::HostTensor;
using test::filled;
using test::random;

constexpr double kFp32Tol = 1e-5;
// TF32 keeps 10 of fp32's 23 mantissa bits; these products and attention land near 3e-4.
constexpr double kTf32Tol = 1e-3;
// Element-wise sizes: one element, less than a vector, odd, and past a million with a tail.
constexpr int64_t kSizes[] = {1, 7, 1001, (1 << 20) + 3};

// Outputs that an op overwrites start as NaN on both sides, so an element the GPU never
// writes fails the comparison.
HostTensor nans(Shape s) { return filled(s, std::numeric_limits<float>::quiet_NaN()); }

HostTensor random_ints(Shape s, uint64_t seed, int lo, int hi) {
  HostTensor h(DType::I32, s);
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> u(lo, hi - 1);
  for (int64_t i = 0; i < h.n(); ++i) h.i()[i] = u(g);
  return h;
}



enum Side { kCpu, kGpu };

// One tensor on both sides with the same starting values: `cpu` is what CpuBackend
// computes on (and holds the reference result afterwards), `gpu` its device copy.
struct Both {
  HostTensor init, cpu;
  DeviceTensor gpu;
  Both(Backend& gpu_backend, HostTensor h) : init(std::move(h)), cpu(clone(init)), gpu(gpu_backend, init) {}
  Tensor& operator[](Side s) { return s == kCpu ? cpu.t : gpu.t; }
  // Back to the starting values on the device, for a run on another GPU backend.
  void reset() { gpu.upload(init); }
};

// The device result against the CPU's (test::expect_close on the two sides).
void expect_close(const std::string& what, const Both& x, double tol) {
  test::expect_close(what, x.gpu.download(), x.cpu, tol);
}

// Each element within 1e-6 of the CPU's, relative to max(1, |value|): results that must
// agree bit for bit up to the last rounding (dropout masks, data movement).
void expect_same(const std::string& what, const Both& x) {
  const std::vector<float> got = x.gpu.download();
  const float* want = x.cpu.t.f32();
  for (int64_t i = 0; i < x.cpu.n(); ++i)
    ASSERT_LE(std::fabs(double(got[size_t(i)]) - want[i]), 1e-6 * std::max(1.0, std::fabs(double(want[i]))))
        << what << ": element " << i << " is " << got[size_t(i)] << " on the GPU, " << want[i] << " on the CPU";
}

struct GpuRun {
  Backend* be;
  double tol;
  std::string name;
};

class GpuOps : public test::GpuTest {
 protected:
  // Where each op runs in turn: the CPU reference, then the GPU.
  std::vector<std::pair<Backend*, Side>> sides() { return {{&cpu, kCpu}, {gpu_.get(), kGpu}}; }

  CpuBackend cpu;
};

// ---------------------------------------------------------------------------- memory

TEST_F(GpuOps, FillCopyReadAddScaled) {
  Backend& g = gpu();
  for (int64_t n : kSizes) {
    const std::string at = " (n = " + std::to_string(n) + ")";
    Both x(g, random({n}, 1)), y(g, random({n}, 2)), z(g, nans({n})), f(g, nans({n}));
    for (auto [be, s] : sides()) {
      ops::add_scaled(*be, x[s], -0.75f, y[s]);
      ops::copy(*be, x[s], z[s]);
      ops::fill(*be, f[s], 2.5f);
    }
    expect_close("add_scaled" + at, y, kFp32Tol);
    expect_same("copy" + at, z);
    expect_same("fill" + at, f);
    const size_t head = size_t(std::min<int64_t>(n, 5));
    std::vector<float> host(head);
    g.read(y.gpu.t, host.data(), head);
    const std::vector<float> all = y.gpu.download();
    for (size_t i = 0; i < head; ++i) EXPECT_EQ(host[i], all[i]) << "read" << at;
  }
}

// ---------------------------------------------------------------------------- linear

TEST_F(GpuOps, LinearMatchesCpuInFp32AndTf32) {
  Backend& g = gpu();
  std::unique_ptr<Backend> tf32 = make_cuda_backend({.tf32 = true});
  const std::vector<GpuRun> gpus = {{&g, kFp32Tol, "fp32"}, {tf32.get(), kTf32Tol, "tf32"}};
  struct Case {
    int m, k, n;
    bool large;  // skips the variants, to stay fast, and checks that TF32 shows
  };
  for (const Case& c : {Case{7, 13, 5, false}, Case{130, 257, 96, false}, Case{2048, 1024, 3072, true}}) {
    const int M = c.m, K = c.k, N = c.n;
    Both x(g, random({M, K}, 1)), w(g, random({N, K}, 2)), b(g, random({N}, 3)), dy(g, random({M, N}, 4));
    // Forward with bias; backward with dx overwritten, dw and db accumulated.
    Both y(g, nans({M, N})), dx1(g, nans({M, K})), dw1(g, random({N, K}, 5)), db1(g, random({N}, 6));
    // The variants: no bias; dx accumulated without db; no dx. Empty in the large case.
    const int vm = c.large ? 0 : M, vn = c.large ? 0 : N;
    Both y_nobias(g, nans({vm, N})), dx2(g, random({vm, K}, 7)), dw2(g, random({vn, K}, 8));
    Both dw3(g, random({vn, K}, 9)), db3(g, random({vn}, 10));
    auto run = [&](Backend& be, Side s) {
      ops::linear_forward(be, x[s], w[s], &b[s], y[s]);
      ops::linear_backward(be, dy[s], x[s], w[s], &dx1[s], false, dw1[s], &db1[s]);
      if (c.large) return;
      ops::linear_forward(be, x[s], w[s], nullptr, y_nobias[s]);
      ops::linear_backward(be, dy[s], x[s], w[s], &dx2[s], true, dw2[s], nullptr);
      ops::linear_backward(be, dy[s], x[s], w[s], nullptr, false, dw3[s], &db3[s]);
    };
    run(cpu, kCpu);
    for (const GpuRun& r : gpus) {
      for (Both* o : {&y, &y_nobias, &dx1, &dw1, &db1, &dx2, &dw2, &dw3, &db3}) o->reset();
      run(*r.be, kGpu);
      const std::string at = fmt::format(" M={} K={} N={} {}", M, K, N, r.name);
      expect_close("y" + at, y, r.tol);
      expect_close("y without bias" + at, y_nobias, r.tol);
      expect_close("dx" + at, dx1, r.tol);
      expect_close("dw" + at, dw1, r.tol);
      expect_close("db" + at, db1, r.tol);
      expect_close("accumulated dx" + at, dx2, r.tol);
      expect_close("dw without db" + at, dw2, r.tol);
      expect_close("dw without dx" + at, dw3, r.tol);
      expect_close("db without dx" + at, db3, r.tol);
    }
    if (c.large) {
      // The TF32 backend ran last: its result should show TF32's rounding, or the
      // option never reached cuBLAS.
      const std::vector<float> got = y.gpu.download();
      EXPECT_GT(test::norm_rel_error(got.data(), y.cpu.f(), y.cpu.n()), 1e-6) << "tf32 made no difference";
    }
  }
}

// ---------------------------------------------------------------------------- attention

TEST_F(GpuOps, AttentionMatchesCpuWithPaddingAndDropout) {
  Backend& g = gpu();
  std::unique_ptr<Backend> tf32 = make_cuda_backend({.tf32 = true});
  const std::vector<GpuRun> gpus = {{&g, kFp32Tol, "fp32"}, {tf32.get(), kTf32Tol, "tf32"}};
  struct Case {
    int batch, seq, heads, head_dim;
    std::vector<int> valid;  // unpadded keys of each sequence; 0 masks a whole sequence
  };
  for (const Case& c : {Case{2, 5, 3, 4, {5, 3}}, Case{2, 128, 4, 64, {128, 100}}, Case{2, 5, 3, 4, {5, 0}}}) {
    const AttentionDims d{c.batch, c.seq, c.heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
    const int64_t T = int64_t(d.batch) * d.seq, H = d.hidden();
    HostTensor mask_host(DType::I32, {d.batch, d.seq});
    for (int b = 0; b < d.batch; ++b)
      for (int j = 0; j < d.seq; ++j) mask_host.i()[b * d.seq + j] = j < c.valid[size_t(b)];
    for (float p : {0.0f, 0.1f}) {
      const DropoutSpec drop{p, 1234, 5};
      Both qkv(g, random({T, 3 * H}, 11)), mask(g, clone(mask_host)), dctx(g, random({T, H}, 12));
      Both stats(g, nans({d.batch, d.heads, d.seq, 2})), ctx(g, nans({T, H})), dqkv(g, nans({T, 3 * H}));
      HostTensor cpu_work(DType::F32, {cpu.attention_workspace_elems(d, DType::F32)});
      DeviceTensor work(g, nans({std::max(g.attention_workspace_elems(d, DType::F32), tf32->attention_workspace_elems(d, DType::F32))}));
      Tensor keep;  // F32 attention keeps no mask bits: backward draws them again
      auto forward = [&](Backend& be, Side s) {
        ops::attention_forward(be, qkv[s], mask[s], d, drop, stats[s], keep, ctx[s], s == kCpu ? cpu_work.t : work.t);
      };
      auto backward = [&](Backend& be, Side s) {
        ops::attention_backward(be, dctx[s], qkv[s], ctx[s], mask[s], stats[s], keep, d, drop, dqkv[s],
                                s == kCpu ? cpu_work.t : work.t);
      };
      forward(cpu, kCpu);
      backward(cpu, kCpu);
      const std::string shape = fmt::format(" B={} S={} heads={} hd={} valid={},{} p={}", d.batch, d.seq, d.heads,
                                            d.head_dim, c.valid[0], c.valid[1], p);
      for (const GpuRun& r : gpus) {
        for (Both* o : {&stats, &ctx, &dqkv}) o->reset();
        forward(*r.be, kGpu);
        expect_close("stats" + shape + " " + r.name, stats, r.tol);
        expect_close("ctx" + shape + " " + r.name, ctx, r.tol);
        backward(*r.be, kGpu);  // recomputes the probabilities from its own forward's statistics
        expect_close("dqkv" + shape + " " + r.name, dqkv, r.tol);
      }
    }
  }
}

// Sliding windows in F32 (the row kernels mask the scores outside the band): 0, 3, 64 and
// one as long as the sequence, at lengths that are no multiple of the row kernels' vector
// width, with right padding whose last queries see only padded keys, with and without
// dropout.
TEST_F(GpuOps, WindowedAttentionMatchesCpu) {
  Backend& g = gpu();
  for (auto [S, valid] : {std::pair<int, int>{77, 50}, {200, 130}})
    for (int window : {0, 3, 64, S}) {
      AttentionDims d{2, S, 2, 32, 1.0f / std::sqrt(32.0f)};
      d.window = window;
      const int64_t T = int64_t(d.batch) * d.seq, H = d.hidden();
      HostTensor mask_host(DType::I32, {d.batch, d.seq});
      for (int j = 0; j < d.seq; ++j) mask_host.i()[j] = 1, mask_host.i()[d.seq + j] = j < valid;
      for (float p : {0.0f, 0.1f}) {
        const DropoutSpec drop{p, 99, 3};
        Both qkv(g, random({T, 3 * H}, 21)), mask(g, clone(mask_host)), dctx(g, random({T, H}, 22));
        Both stats(g, nans({d.batch, d.heads, d.seq, 2})), ctx(g, nans({T, H})), dqkv(g, nans({T, 3 * H}));
        HostTensor cpu_work(DType::F32, {cpu.attention_workspace_elems(d, DType::F32)});
        DeviceTensor work(g, nans({g.attention_workspace_elems(d, DType::F32)}));
        Tensor keep;
        for (auto [be, s] : sides()) {
          Tensor& ws = s == kCpu ? cpu_work.t : work.t;
          ops::attention_forward(*be, qkv[s], mask[s], d, drop, stats[s], keep, ctx[s], ws);
          ops::attention_backward(*be, dctx[s], qkv[s], ctx[s], mask[s], stats[s], keep, d, drop, dqkv[s], ws);
        }
        const std::string at = fmt::format(" S={} window={} p={}", S, window, p);
        expect_close("stats" + at, stats, kFp32Tol);
        expect_close("ctx" + at, ctx, kFp32Tol);
        expect_close("dqkv" + at, dqkv, kFp32Tol);
      }
    }
}

// ---------------------------------------------------------------------------- layernorm

// Shapes for each backward layout: scalar runs (13 columns), 16-byte runs with four rows
// a block (1024) and with a row a block over columns that leave groups part-filled (3000).
TEST_F(GpuOps, LayerNormMatchesCpuAndAccumulatesParameterGrads) {
  Backend& g = gpu();
  for (auto [R, C] : {std::pair<int, int>{7, 13}, {2048, 1024}, {37, 3000}}) {
    // Rows with a non-zero mean, as hidden states have; BERT's eps.
    const float eps = 1e-12f;
    Both x(g, random({R, C}, 1, -1.0f, 3.0f)), gamma(g, random({C}, 2, 0.5f, 1.5f)), beta(g, random({C}, 3));
    Both y(g, nans({R, C})), mean(g, nans({R})), rstd(g, nans({R}));
    Both dy(g, random({R, C}, 4)), dx(g, nans({R, C})), dgamma(g, random({C}, 5)), dbeta(g, random({C}, 6));
    for (auto [be, s] : sides())
      ops::layernorm_forward(*be, x[s], gamma[s], beta[s], eps, y[s], mean[s], rstd[s]);
    const std::string at = fmt::format(" ({} x {})", R, C);
    expect_close("y" + at, y, kFp32Tol);
    expect_close("mean" + at, mean, kFp32Tol);
    expect_close("rstd" + at, rstd, kFp32Tol);
    mean.gpu.upload(mean.cpu);  // backward from the same statistics as the CPU's
    rstd.gpu.upload(rstd.cpu);
    for (auto [be, s] : sides())
      ops::layernorm_backward(*be, dy[s], x[s], gamma[s], mean[s], rstd[s], dx[s], dgamma[s], dbeta[s]);
    expect_close("dx" + at, dx, kFp32Tol);
    expect_close("dgamma" + at, dgamma, kFp32Tol);
    expect_close("dbeta" + at, dbeta, kFp32Tol);
  }
}

// The same elements dropped (zero) on both sides: the dropout masks agree.
void expect_same_zeros(const std::string& what, const Both& x) {
  const std::vector<float> got = x.gpu.download();
  const float* want = x.cpu.t.f32();
  int64_t mismatched = 0, zeros = 0;
  for (int64_t i = 0; i < x.cpu.n(); ++i) {
    zeros += want[i] == 0.0f;
    mismatched += (got[size_t(i)] == 0.0f) != (want[i] == 0.0f);
  }
  EXPECT_EQ(mismatched, 0) << what << ": the GPU zeros other elements than the CPU (which zeros " << zeros << ")";
}

// The fused residual LayerNorm in place, as BERT calls it (sum over x, dx over dy), with
// the tolerances of the unfused ops: the sum (a dropout) and the masks exact, the rest
// within 1e-5. The stream is composed on the host or read from a step counter in device
// memory.
TEST_F(GpuOps, FusedResidualLayerNormMatchesCpu) {
  Backend& g = gpu();
  const int64_t step = (int64_t(1) << 40) + 3;
  HostTensor step_host(DType::I64, {1});
  step_host.t.ptr<int64_t>()[0] = step;
  DeviceTensor device_step(g, step_host);
  // Seed and stream use their high words, which a 32-bit slip would lose.
  const uint64_t seed = 0x9E3779B97F4A7C15ull, site = 5;
  const DropoutSpec composed{0.1f, seed, (uint64_t(step) << kDropoutSiteBits) | site};
  struct Specs {
    DropoutSpec cpu, gpu;
    std::string name;
  };
  const Specs specs[] = {{{}, {}, "p = 0"},
                         {composed, composed, "p = 0.1"},
                         {composed, {0.1f, seed, site, device_step.t.ptr<int64_t>()}, "p = 0.1, device step counter"}};
  for (auto [R, C] : {std::pair<int, int>{7, 13}, {64, 1000}, {2048, 1024}})
    for (const Specs& d : specs) {
      const float eps = 1e-12f;
      const std::string at = fmt::format(" ({} x {}, {})", R, C, d.name);
      Both x(g, random({R, C}, 1)), residual(g, random({R, C}, 2, -1.0f, 3.0f));
      Both gamma(g, random({C}, 3, 0.5f, 1.5f)), beta(g, random({C}, 4));
      Both y(g, nans({R, C})), mean(g, nans({R})), rstd(g, nans({R}));
      for (auto [be, s] : sides())
        ops::dropout_add_layernorm_forward(*be, x[s], residual[s], s == kCpu ? d.cpu : d.gpu, gamma[s], beta[s], eps,
                                           x[s], y[s], mean[s], rstd[s]);
      expect_same("sum" + at, x);
      expect_close("y" + at, y, kFp32Tol);
      expect_close("mean" + at, mean, kFp32Tol);
      expect_close("rstd" + at, rstd, kFp32Tol);
      // Backward from the same sum and statistics as the CPU's.
      x.gpu.upload(x.cpu);
      mean.gpu.upload(mean.cpu);
      rstd.gpu.upload(rstd.cpu);
      Both dy(g, random({R, C}, 5)), dsum(g, nans({R, C})), dgamma(g, random({C}, 6)), dbeta(g, random({C}, 7));
      for (auto [be, s] : sides())
        ops::layernorm_dropout_backward(*be, dy[s], x[s], gamma[s], mean[s], rstd[s], s == kCpu ? d.cpu : d.gpu,
                                        dsum[s], dy[s], dgamma[s], dbeta[s]);
      expect_close("dsum" + at, dsum, kFp32Tol);
      expect_close("dx" + at, dy, kFp32Tol);
      expect_same_zeros("dx" + at, dy);
      expect_close("dgamma" + at, dgamma, kFp32Tol);
      expect_close("dbeta" + at, dbeta, kFp32Tol);
    }
}

// ---------------------------------------------------------------------------- elementwise

// Values in [-4, 4], none exactly 0 where relu has its kink.
HostTensor activation_input(int64_t n) {
  HostTensor x = random({n}, 8, -4.0f, 4.0f);
  for (int64_t i = 0; i < n; ++i)
    if (x.f()[i] == 0.0f) x.f()[i] = 0.5f;
  return x;
}

TEST_F(GpuOps, ActivationsAndTanhMatchCpuAlsoInPlace) {
  Backend& g = gpu();
  for (int64_t n : kSizes) {
    for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
      Both x(g, activation_input(n)), y(g, nans({n})), dy(g, random({n}, 9)), dx(g, nans({n}));
      for (auto [be, s] : sides()) {
        ops::activation_forward(*be, a, x[s], y[s]);
        ops::activation_backward(*be, a, dy[s], x[s], dx[s]);
        ops::activation_backward(*be, a, dy[s], x[s], dy[s]);  // dx aliases dy
      }
      const std::string at = fmt::format(" (activation {}, n = {})", int(a), n);
      expect_close("y" + at, y, kFp32Tol);
      expect_close("dx" + at, dx, kFp32Tol);
      expect_close("dx in place" + at, dy, kFp32Tol);
    }
    Both x(g, activation_input(n)), y(g, nans({n})), dy(g, random({n}, 9)), dx(g, nans({n}));
    for (auto [be, s] : sides()) ops::tanh_forward(*be, x[s], y[s]);
    const std::string at = fmt::format(" (n = {})", n);
    expect_close("tanh" + at, y, kFp32Tol);
    y.gpu.upload(y.cpu);  // backward from the same output as the CPU's
    for (auto [be, s] : sides()) ops::tanh_backward(*be, dy[s], y[s], dx[s]);
    expect_close("tanh dx" + at, dx, kFp32Tol);
  }
}

TEST_F(GpuOps, DropoutMasksEqualCpuAlsoWhenAliased) {
  Backend& g = gpu();
  for (int64_t n : kSizes) {
    for (float p : {0.0f, 0.1f}) {
      // Seed and stream use their high words, which a 32-bit slip would lose.
      const DropoutSpec d{p, 0x9E3779B97F4A7C15ull, (1ull << 33) + 5};
      // Inputs away from 0, so that a kept element never looks dropped.
      Both x(g, random({n}, 1, 0.5f, 1.5f)), res(g, random({n}, 2)), y(g, nans({n})), out(g, nans({n}));
      Both xa(g, random({n}, 1, 0.5f, 1.5f)), xb(g, random({n}, 1, 0.5f, 1.5f)), ra(g, random({n}, 2));
      for (auto [be, s] : sides()) {
        ops::dropout(*be, x[s], d, y[s]);
        ops::dropout_add(*be, x[s], res[s], d, out[s]);
        ops::dropout(*be, xa[s], d, xa[s]);               // y aliases x
        ops::dropout_add(*be, xb[s], res[s], d, xb[s]);   // out aliases x
        ops::dropout_add(*be, x[s], ra[s], d, ra[s]);     // out aliases residual
      }
      const std::string at = fmt::format(" (n = {}, p = {})", n, p);
      expect_same("dropout" + at, y);
      expect_same("dropout_add" + at, out);
      expect_same("dropout in place" + at, xa);
      expect_same("dropout_add into x" + at, xb);
      expect_same("dropout_add into residual" + at, ra);
    }
  }
}

// The step counter is read from device memory by the dropout and fused-lengths kernels:
// the masks equal the CPU's with the stream composed on the host.
TEST_F(GpuOps, DropoutReadsTheStepCounterFromDeviceMemory) {
  Backend& g = gpu();
  const int64_t n = 4099;
  const int64_t counter = (int64_t(1) << 40) + 3;
  HostTensor c(DType::I64, {1});
  c.t.ptr<int64_t>()[0] = counter;
  DeviceTensor device_counter(g, c);
  const DropoutSpec on_gpu{0.2f, 0x9E3779B97F4A7C15ull, 7, device_counter.t.ptr<int64_t>()};
  const DropoutSpec on_cpu{0.2f, 0x9E3779B97F4A7C15ull, (uint64_t(counter) << kDropoutSiteBits) | 7};
  Both x(g, random({n}, 1, 0.5f, 1.5f)), res(g, random({n}, 2)), y(g, nans({n})), out(g, nans({n}));
  for (auto [be, s] : sides()) {
    const DropoutSpec& d = s == kCpu ? on_cpu : on_gpu;
    ops::dropout(*be, x[s], d, y[s]);
    ops::dropout_add(*be, x[s], res[s], d, out[s]);
  }
  expect_same("dropout with a device step counter", y);
  expect_same("dropout_add with a device step counter", out);
}

// ---------------------------------------------------------------------------- embedding

TEST_F(GpuOps, EmbeddingGatherScatterMatchCpu) {
  Backend& g = gpu();
  struct Case {
    int batch, seq, hidden, vocab, positions;
  };
  for (const Case& c : {Case{3, 37, 13, 50, 40}, Case{8, 128, 768, 1000, 512}}) {
    const int64_t T = int64_t(c.batch) * c.seq;
    HostTensor ids_host = random_ints({T}, 1, 0, c.vocab);
    for (int64_t t = 0; t < T; t += 4) ids_host.i()[t] = 1;  // a frequent token: many adds into one row
    Both ids(g, std::move(ids_host)), types(g, random_ints({T}, 2, 0, 2));
    Both word(g, random({c.vocab, c.hidden}, 3)), pos(g, random({c.positions, c.hidden}, 4));
    Both type(g, random({2, c.hidden}, 5)), out(g, nans({T, c.hidden})), dout(g, random({T, c.hidden}, 6));
    Both dword(g, random({c.vocab, c.hidden}, 7)), dpos(g, random({c.positions, c.hidden}, 8));
    Both dtype(g, random({2, c.hidden}, 9));
    Both first(g, nans({c.batch, c.hidden})), dfirst(g, random({c.batch, c.hidden}, 10));
    Both dhidden(g, nans({T, c.hidden}));
    // Packed rows (every row but each sequence's last three) and back into a padded buffer.
    HostTensor rows_host(DType::I32, {T - 3 * c.batch});
    for (int64_t t = 0, k = 0; t < T; ++t)
      if (t % c.seq < c.seq - 3) rows_host.i()[k++] = int32_t(t);
    const int64_t packed_rows = rows_host.t.numel();
    Both rows(g, std::move(rows_host)), packed(g, nans({packed_rows, c.hidden})), scattered(g, nans({T, c.hidden}));
    for (auto [be, s] : sides()) {
      ops::embedding_forward(*be, ids[s], types[s], Tensor{}, word[s], pos[s], type[s], c.seq, out[s]);
      ops::embedding_backward(*be, dout[s], ids[s], types[s], Tensor{}, c.seq, dword[s], dpos[s], dtype[s]);
      ops::gather_first_tokens(*be, dout[s], c.seq, first[s]);
      ops::scatter_first_tokens(*be, dfirst[s], c.seq, dhidden[s]);
      ops::gather_rows(*be, dout[s], rows[s], packed[s]);
      ops::scatter_rows(*be, packed[s], rows[s], scattered[s]);
    }
    const std::string at = fmt::format(" (B={} S={} hidden={})", c.batch, c.seq, c.hidden);
    expect_close("out" + at, out, kFp32Tol);
    expect_close("dword" + at, dword, kFp32Tol);
    expect_close("dpos" + at, dpos, kFp32Tol);
    expect_close("dtype" + at, dtype, kFp32Tol);
    expect_same("gather_first_tokens" + at, first);
    expect_same("scatter_first_tokens" + at, dhidden);
    expect_same("gather_rows" + at, packed);
    expect_same("scatter_rows" + at, scattered);
  }
}

// RoBERTa's embeddings (positions counted after the padding id, one token type) and
// DistilBERT's (no type table): the position ids and both passes as on the CPU.
TEST_F(GpuOps, EmbeddingWithPositionIdsAndWithoutTypesMatchCpu) {
  Backend& g = gpu();
  const int batch = 5, seq = 67, hidden = 48, vocab = 300, pad = 1;
  const int64_t T = int64_t(batch) * seq;
  HostTensor ids_host = random_ints({T}, 1, 0, vocab);
  for (int b = 0; b < batch; ++b)  // right padding of varied length, and a padding id inside row 0
    for (int t = seq - 7 * b; t < seq; ++t) ids_host.i()[b * seq + t] = pad;
  ids_host.i()[5] = pad;
  Both ids(g, std::move(ids_host)), positions(g, random_ints({T}, 12, -9, -1));  // overwritten
  Both word(g, random({vocab, hidden}, 3)), pos(g, random({seq + pad + 1, hidden}, 4)), type(g, random({1, hidden}, 5));
  Both out(g, nans({T, hidden})), out_untyped(g, nans({T, hidden})), dout(g, random({T, hidden}, 6));
  Both dword(g, random({vocab, hidden}, 7)), dpos(g, random({seq + pad + 1, hidden}, 8)), dtype(g, random({1, hidden}, 9));
  Both dword2(g, random({vocab, hidden}, 10)), dpos2(g, random({seq + pad + 1, hidden}, 11));
  for (auto [be, s] : sides()) {
    ops::position_ids_after_padding(*be, ids[s], pad, seq, positions[s]);
    ops::embedding_forward(*be, ids[s], Tensor{}, positions[s], word[s], pos[s], type[s], seq, out[s]);
    ops::embedding_backward(*be, dout[s], ids[s], Tensor{}, positions[s], seq, dword[s], dpos[s], dtype[s]);
    Tensor none;
    ops::embedding_forward(*be, ids[s], Tensor{}, Tensor{}, word[s], pos[s], none, seq, out_untyped[s]);
    ops::embedding_backward(*be, dout[s], ids[s], Tensor{}, Tensor{}, seq, dword2[s], dpos2[s], none);
  }
  expect_close("out (through the position ids)", out, kFp32Tol);
  expect_close("dword", dword, kFp32Tol);
  expect_close("dpos", dpos, kFp32Tol);
  expect_close("dtype", dtype, kFp32Tol);
  expect_close("out without types", out_untyped, kFp32Tol);
  expect_close("dword without types", dword2, kFp32Tol);
  expect_close("dpos without types", dpos2, kFp32Tol);
}

// ---------------------------------------------------------------------------- loss

TEST_F(GpuOps, CrossEntropyMatchesCpuWithIgnoredRows) {
  Backend& g = gpu();
  struct Case {
    int rows, classes;
    std::vector<int> ignored;  // rows labelled -100
  };
  for (const Case& c : {Case{4, 5, {1}}, Case{64, 2, {0, 7, 63}}, Case{7, 1001, {3}}, Case{2, 3, {0, 1}}}) {
    HostTensor labels_host = random_ints({c.rows}, 1, 0, c.classes);
    for (int r : c.ignored) labels_host.i()[r] = -100;
    Both logits(g, random({c.rows, c.classes}, 2, -2.0f, 2.0f)), labels(g, std::move(labels_host));
    Both loss(g, nans({1})), dlogits(g, nans({c.rows, c.classes}));
    for (auto [be, s] : sides())
      ops::cross_entropy(*be, logits[s], labels[s], 0.5f, nullptr, loss[s], dlogits[s]);
    // With every row ignored both must be exactly 0: the tolerance scales with the reference.
    const std::string at = fmt::format(" ({} x {}, {} ignored)", c.rows, c.classes, c.ignored.size());
    expect_close("loss" + at, loss, kFp32Tol);
    expect_close("dlogits" + at, dlogits, kFp32Tol);
  }
}

TEST_F(GpuOps, MseMatchesCpu) {
  Backend& g = gpu();
  for (Shape shape : {Shape{5}, Shape{5, 1}, Shape{1001}}) {
    Both pred(g, random(shape, 1)), target(g, random({shape[0]}, 2)), loss(g, nans({1})), dpred(g, nans(shape));
    for (auto [be, s] : sides())
      ops::mse(*be, pred[s], target[s], 2.0f, nullptr, loss[s], dpred[s]);
    expect_close("loss " + shape.str(), loss, kFp32Tol);
    expect_close("dpred " + shape.str(), dpred, kFp32Tol);
  }
}

// ---------------------------------------------------------------------------- optimizer

TEST_F(GpuOps, SumSquaresOfTenMillionElements) {
  Backend& g = gpu();
  const int64_t n = 10'000'000;
  Both x(g, random({n}, 1)), out(g, filled({1}, 3.0f));  // accumulates onto 3
  double want = 3.0;
  for (int64_t i = 0; i < n; ++i) want += double(x.cpu.f()[i]) * x.cpu.f()[i];
  for (auto [be, s] : sides()) ops::sum_squares(*be, x[s], out[s]);
  const double got = out.gpu.download()[0];
  EXPECT_NEAR(got, want, 1e-6 * want);
  EXPECT_NEAR(got, out.cpu.f()[0], 1e-6 * want);
}

TEST_F(GpuOps, SumSquaresAccumulatesAcrossBuffers) {
  Backend& g = gpu();
  Both out(g, filled({1}, 0.0f));
  for (int64_t n : kSizes) {
    Both x(g, random({n}, uint64_t(n)));
    for (auto [be, s] : sides()) ops::sum_squares(*be, x[s], out[s]);
    EXPECT_NEAR(out.gpu.download()[0], out.cpu.f()[0], 1e-6 * out.cpu.f()[0]) << "after n = " << n;
  }
}

TEST_F(GpuOps, ClipCoefficientMatchesCpu) {
  Backend& g = gpu();
  for (float sumsq : {9.0f, 1e-12f, 0.0f, 2.5e7f})
    for (float max_norm : {1.0f, 10.0f, 0.0f, -1.0f, 1e-6f}) {
      Both in(g, filled({1}, sumsq)), coef(g, nans({kNormCoefSize}));
      for (auto [be, s] : sides())
        ops::clip_coefficient(*be, in[s], max_norm, coef[s]);
      const std::vector<float> got = coef.gpu.download();
      for (int i = 0; i < kNormCoefSize; ++i)
        EXPECT_NEAR(got[size_t(i)], coef.cpu.f()[i], 1e-6 * std::fabs(coef.cpu.f()[i]))
            << "norm_coef[" << i << "] for sumsq " << sumsq << ", max_norm " << max_norm;
    }
}

// A list of parameter groups of very different sizes and decays in one launch each.
TEST_F(GpuOps, TensorListOptimizerMatchesCpu) {
  Backend& g = gpu();
  const int count = 7;
  std::deque<Both> p, grad, m, v;  // Both does not move: a deque builds in place
  for (int t = 0; t < count; ++t) {
    const int64_t n = t == 3 ? (1 << 20) + 5 : 3 + 11 * t;
    p.emplace_back(g, random({n}, uint64_t(t)));
    grad.emplace_back(g, random({n}, uint64_t(50 + t)));
    m.emplace_back(g, filled({n}, 0.02f));
    v.emplace_back(g, filled({n}, 0.03f));
  }
  Both coef(g, test::norm_coef(0.8f)), sumsq(g, filled({1}, 0.0f));
  const AdamWStep st{.lr = 0.05, .step = 2};
  for (auto [be, s] : sides()) {
    std::vector<AdamWSlice> slices;
    std::vector<Tensor> grads;
    for (int t = 0; t < count; ++t) {
      slices.push_back({p[size_t(t)][s], grad[size_t(t)][s], m[size_t(t)][s], v[size_t(t)][s], t % 2 ? 0.0 : 0.1, Tensor{}});
      grads.push_back(grad[size_t(t)][s]);
    }
    ops::sum_squares(*be, grads.data(), count, sumsq[s]);
    ops::adamw(*be, slices.data(), count, st, coef[s]);
  }
  expect_close("sum of squares", sumsq, kFp32Tol);
  for (int t = 0; t < count; ++t) {
    expect_close(fmt::format("param {}", t), p[size_t(t)], kFp32Tol);
    expect_close(fmt::format("v {}", t), v[size_t(t)], kFp32Tol);
  }
}

TEST_F(GpuOps, AdamWTwoStepsMatchCpu) {
  Backend& g = gpu();
  for (int64_t n : {int64_t(7), int64_t(1 << 20) + 3}) {
    Both p(g, random({n}, 1)), m(g, filled({n}, 0.0f)), v(g, filled({n}, 0.0f)), coef(g, test::norm_coef(0.0f));
    for (int step = 1; step <= 2; ++step) {
      Both grad(g, random({n}, uint64_t(10 + step)));
      // The first step is clipped; the coefficient is read from device memory.
      coef.cpu.f()[1] = step == 1 ? 0.5f : 1.0f;
      coef.gpu.upload(coef.cpu);
      // A large learning rate, so that an error in the update shows against the weights.
      const AdamWStep st{.lr = 0.05, .weight_decay = 0.1, .step = step};
      for (auto [be, s] : sides())
        ops::adamw(*be, p[s], grad[s], m[s], v[s], st, coef[s]);
      const std::string at = fmt::format(" after step {} (n = {})", step, n);
      expect_close("param" + at, p, kFp32Tol);
      expect_close("m" + at, m, kFp32Tol);
      expect_close("v" + at, v, kFp32Tol);
    }
  }
}

}  // namespace
}  // namespace hone
