// The CPU backend against naive double-precision references (forward), central finite
// differences (backward), and the contract of the ops.h wrappers.
#include "hone/ops.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <string>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/philox.h"
#include "hone/profile.h"
#include "ops/cpu_pages.h"
#include "ops/cpu_quotient.h"
#include "test_util.h"

namespace hone {
namespace {

using test::clone;
using test::HostTensor;
using test::filled;
using test::random;

HostTensor ints(Shape s, const std::vector<int32_t>& values) {
  HostTensor h(DType::I32, s);
  EXPECT_EQ(size_t(h.n()), values.size());
  for (size_t i = 0; i < values.size(); ++i) h.i()[i] = values[i];
  return h;
}

// sum(out * r) in double: the scalar loss whose gradient with respect to out is r.
double weighted_sum(HostTensor& out, HostTensor& r) {
  double s = 0;
  for (int64_t i = 0; i < out.n(); ++i) s += double(out.f()[i]) * r.f()[i];
  return s;
}

// Central differences of f with respect to every element of x.
std::vector<double> numeric_grad(HostTensor& x, const std::function<double()>& f, float h = 1e-2f) {
  std::vector<double> g(size_t(x.n()));
  for (int64_t i = 0; i < x.n(); ++i) {
    const float orig = x.f()[i];
    x.f()[i] = orig + h;
    const double up = f(), step_up = x.f()[i];
    x.f()[i] = orig - h;
    const double down = f(), step_down = x.f()[i];
    x.f()[i] = orig;
    g[size_t(i)] = (up - down) / (step_up - step_down);
  }
  return g;
}

// Every |got - want| within tol times the largest |want|, which must not be negligible
// (a test of all-zero gradients would pass for any bug).
void expect_grad(const std::string& what, const float* got, const std::vector<double>& want, double tol = 1e-2,
                 const float* before = nullptr) {
  double scale = 0, worst = 0;
  size_t worst_i = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  ASSERT_GT(scale, 1e-3) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = double(got[i]) - (before ? before[i] : 0.0f);
    if (std::fabs(g - want[i]) > worst) worst = std::fabs(g - want[i]), worst_i = i;
  }
  EXPECT_LE(worst, tol * scale) << what << ": element " << worst_i << " is " << got[worst_i] << ", expected "
                                << want[worst_i];
}

// |got - want| <= rtol * max(|want|, 0.1 * max |want|) elementwise.
void expect_close(const std::string& what, const float* got, const std::vector<double>& want, double rtol = 2e-5) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = rtol * std::max(std::fabs(want[i]), 0.1 * scale);
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
  }
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---------------------------------------------------------------------------- memory

TEST(OpsMemory, FillCopyRead) {
  CpuBackend be;
  HostTensor a = random({3, 5}, 1), b = filled({15}, 0.0f);
  ops::copy(be, a.t, b.t);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(b.f()[i], a.f()[i]);
  ops::fill(be, b.t, 2.5f);
  float host[4] = {};
  be.read(b.t, host, 4);
  for (float v : host) EXPECT_EQ(v, 2.5f);
  HostTensor c = filled({14}, 0.0f);
  EXPECT_THROW(ops::copy(be, a.t, c.t), Error);

  // Zeroing skips the pages (1024 floats) already +0, and clears any other bits: a -0 in
  // an otherwise zero page, a page set after its first element, the partial last page.
  HostTensor z = filled({2500}, 0.0f);
  z.f()[1024 + 5] = -0.0f;
  for (int i = 2049; i < 2500; ++i) z.f()[i] = 1.5f;
  ops::fill(be, z.t, 0.0f);
  for (int i = 0; i < 2500; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(z.f()[i]), 0u) << i;
  ops::fill(be, z.t, -0.0f);
  for (int i = 0; i < 2500; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(z.f()[i]), 0x80000000u) << i;

  // Pages the process never wrote stay out of its resident set when zeroed; written ones
  // are cleared, partial pages at either end too.
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), pages = 64;
  void* map = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  float* f = static_cast<float*>(map);
  const size_t per_page = page / sizeof(float);
  for (size_t k : {size_t(3), size_t(10)}) f[k * per_page + 7] = 2.0f;
  f[1] = 5.0f;                             // the partial first page of the range below
  f[pages * per_page - 1] = 6.0f;          // and of its last
  Tensor range{f + 1, DType::F32, {int64_t(pages * per_page - 1)}, Device::CPU};
  ops::fill(be, range, 0.0f);
  unsigned char resident[64];
  ASSERT_EQ(mincore(map, pages * page, resident), 0);
  EXPECT_TRUE(resident[3] & 1);
  EXPECT_FALSE(resident[20] & 1);
  for (size_t i = 0; i < pages * per_page; ++i) ASSERT_EQ(f[i], 0.0f) << i;
  munmap(map, pages * page);
}

// Claimed pages are resident and writable before anything reads them, and keep what they
// held; pages outside the range stay as they were.
TEST(OpsFill, ClaimForWriteMakesPagesResident) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), pages = 16;
  void* map = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  if (madvise(map, page, MADV_POPULATE_WRITE) != 0) {
    munmap(map, pages * page);
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14): claim_for_write is a no-op here";
  }
  float* f = static_cast<float*>(map);
  const size_t per_page = page / sizeof(float);
  f[2 * per_page + 3] = 7.0f;                                       // one page written already
  cpu_pages::claim_for_write(f + per_page + 5, 8 * page);  // pages 1..9, partial at both ends
  unsigned char resident[16];
  ASSERT_EQ(mincore(map, pages * page, resident), 0);
  for (size_t i = 1; i <= 9; ++i) EXPECT_TRUE(resident[i] & 1) << "page " << i;
  EXPECT_FALSE(resident[12] & 1);
  for (size_t i = per_page; i < 10 * per_page; ++i) ASSERT_EQ(f[i], i == 2 * per_page + 3 ? 7.0f : 0.0f) << i;
  munmap(map, pages * page);
}

// ---------------------------------------------------------------------------- linear

TEST(OpsLinear, ForwardMatchesDoubleReference) {
  CpuBackend be;
  const int M = 7, K = 13, N = 5;
  HostTensor x = random({M, K}, 1), w = random({N, K}, 2), b = random({N}, 3), y = filled({M, N}, 9.0f);
  for (bool bias : {true, false}) {
    ops::linear_forward(be, x.t, w.t, bias ? &b.t : nullptr, y.t);
    std::vector<double> want(M * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = bias ? b.f()[j] : 0.0;
        for (int k = 0; k < K; ++k) s += double(x.f()[i * K + k]) * w.f()[j * K + k];
        want[i * N + j] = s;
      }
    expect_close(bias ? "y with bias" : "y without bias", y.f(), want);
  }
}

TEST(OpsLinear, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  const int M = 7, K = 13, N = 5;
  HostTensor x = random({M, K}, 1), w = random({N, K}, 2), b = random({N}, 3), r = random({M, N}, 4);
  HostTensor y(DType::F32, {M, N});
  auto loss = [&] {
    ops::linear_forward(be, x.t, w.t, &b.t, y.t);
    return weighted_sum(y, r);
  };
  HostTensor dx = filled({M, K}, 7.0f), dw = filled({N, K}, 0.0f), db = filled({N}, 0.0f);
  ops::linear_backward(be, r.t, x.t, w.t, &dx.t, false, dw.t, &db.t);
  expect_grad("dx", dx.f(), numeric_grad(x, loss));
  expect_grad("dw", dw.f(), numeric_grad(w, loss));
  expect_grad("db", db.f(), numeric_grad(b, loss));
}

TEST(OpsLinear, BackwardAccumulatesParameterGradsAndOptionallyDx) {
  CpuBackend be;
  const int M = 4, K = 3, N = 2;
  HostTensor x = random({M, K}, 1), w = random({N, K}, 2), dy = random({M, N}, 3);
  HostTensor dx1 = filled({M, K}, 0.0f), dw1 = filled({N, K}, 0.0f), db1 = filled({N}, 0.0f);
  ops::linear_backward(be, dy.t, x.t, w.t, &dx1.t, false, dw1.t, &db1.t);
  HostTensor dx = filled({M, K}, 1.0f), dw = filled({N, K}, 2.0f), db = filled({N}, 3.0f);
  ops::linear_backward(be, dy.t, x.t, w.t, &dx.t, true, dw.t, &db.t);
  ops::linear_backward(be, dy.t, x.t, w.t, nullptr, false, dw.t, nullptr);
  for (int i = 0; i < M * K; ++i) EXPECT_FLOAT_EQ(dx.f()[i], 1.0f + dx1.f()[i]);
  for (int i = 0; i < N * K; ++i) EXPECT_FLOAT_EQ(dw.f()[i], 2.0f + 2.0f * dw1.f()[i]);
  for (int i = 0; i < N; ++i) EXPECT_FLOAT_EQ(db.f()[i], 3.0f + db1.f()[i]);
  ops::linear_backward(be, dy.t, x.t, w.t, &dx.t, false, dw.t, nullptr);  // overwrites dx
  for (int i = 0; i < M * K; ++i) EXPECT_FLOAT_EQ(dx.f()[i], dx1.f()[i]);
}

TEST(OpsLinear, WrapperNamesOpTensorAndShapes) {
  CpuBackend be;
  HostTensor x = random({4, 3}, 1), w = random({8, 3}, 2), y = filled({4, 7}, 0.0f), b = filled({7}, 0.0f);
  EXPECT_EQ(error_of([&] { ops::linear_forward(be, x.t, w.t, nullptr, y.t); }),
            "linear_forward: y has shape [4, 7], expected [4, 8]");
  EXPECT_EQ(error_of([&] { ops::linear_forward(be, x.t, w.t, &b.t, y.t); }),
            "linear_forward: b has shape [7], expected [8]");
  HostTensor w_bad = random({8, 4}, 2), y8 = filled({4, 8}, 0.0f);
  EXPECT_THROW(ops::linear_forward(be, x.t, w_bad.t, nullptr, y8.t), Error);
  HostTensor xi(DType::I32, {4, 3});
  EXPECT_EQ(error_of([&] { ops::linear_forward(be, xi.t, w.t, nullptr, y8.t); }),
            "linear_forward: x has dtype I32, expected F32, BF16 or F16");
  // Half precision is for the GPU; the reference says so rather than misreading bytes.
  HostTensor xh(DType::BF16, {4, 3}), wh(DType::BF16, {8, 3}), yh(DType::BF16, {4, 8});
  EXPECT_EQ(error_of([&] { ops::linear_forward(be, xh.t, wh.t, nullptr, yh.t); }),
            "linear_forward: x is BF16, but the CPU backend computes in F32 only (mixed precision needs a GPU)");
  EXPECT_EQ(error_of([&] { ops::linear_forward(be, xh.t, w.t, nullptr, yh.t); }),
            "linear_forward: x is BF16, but the CPU backend computes in F32 only (mixed precision needs a GPU)");
  be.dry_run = true;  // plans of GPU runs are made anywhere: only the dtypes must agree
  ops::linear_forward(be, xh.t, wh.t, nullptr, yh.t);
  EXPECT_EQ(error_of([&] { ops::linear_forward(be, xh.t, w.t, nullptr, yh.t); }),
            "linear_forward: w has dtype F32, expected BF16");
  be.dry_run = false;
  HostTensor dw = filled({8, 4}, 0.0f);
  EXPECT_THROW(ops::linear_backward(be, y8.t, x.t, w.t, nullptr, false, dw.t, nullptr), Error);
}

// The product-and-activation ops are the two unfused ops in sequence on the CPU; the
// wrappers check shapes and that no output overlaps an input (the GPU's epilogue reads pre
// while it writes dpre).
TEST(OpsLinear, ActivationOpsEqualTheUnfusedOpsAndCheckTheirTensors) {
  CpuBackend be;
  const int M = 5, K = 4, N = 6;
  HostTensor x = random({M, K}, 1), w = random({N, K}, 2), b = random({N}, 3);
  HostTensor pre = filled({M, N}, 0.0f), y = filled({M, N}, 0.0f), pre1 = filled({M, N}, 0.0f), y1 = filled({M, N}, 0.0f);
  ops::linear_activation_forward(be, Activation::GeluTanh, x.t, w.t, &b.t, pre.t, y.t);
  ops::linear_forward(be, x.t, w.t, &b.t, pre1.t);
  ops::activation_forward(be, Activation::GeluTanh, pre1.t, y1.t);
  for (int i = 0; i < M * N; ++i) EXPECT_EQ(pre.f()[i], pre1.f()[i]);
  for (int i = 0; i < M * N; ++i) EXPECT_EQ(y.f()[i], y1.f()[i]);
  // Inference keeps no pre (an empty tensor): y alone, the same bits.
  for (const Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
    HostTensor kept_pre = filled({M, N}, 0.0f), kept_y = filled({M, N}, 0.0f), y_alone = filled({M, N}, 0.0f);
    ops::linear_activation_forward(be, a, x.t, w.t, &b.t, kept_pre.t, kept_y.t);
    Tensor no_pre;
    ops::linear_activation_forward(be, a, x.t, w.t, &b.t, no_pre, y_alone.t);
    for (int i = 0; i < M * N; ++i) EXPECT_EQ(y_alone.f()[i], kept_y.f()[i]) << "activation " << int(a);
  }

  // Backward of a product reading act(pre) [M, N] with weights w2 [K, N]: the fused pass
  // (one erf or tanh per element) gives the unfused ops' bits for every activation.
  HostTensor dy = random({M, K}, 4), w2 = random({K, N}, 6);
  for (const Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
    SCOPED_TRACE(int(a));
    HostTensor act = filled({M, N}, 0.0f), dpre = filled({M, N}, 0.0f), dw = filled({K, N}, 1.0f),
               db = filled({K}, 2.0f);
    HostTensor act1 = filled({M, N}, 0.0f), dpre1 = filled({M, N}, 0.0f), dw1 = filled({K, N}, 1.0f),
               db1 = filled({K}, 2.0f);
    // db_pre, the bias gradient of the product that made pre, is that product's backward's.
    HostTensor dbp = filled({N}, 3.0f), dbp1 = filled({N}, 3.0f), dw_up = filled({N, K}, 0.0f);
    ops::activation_linear_backward(be, a, dy.t, pre.t, w2.t, act.t, dpre.t, dw.t, &db.t, &dbp.t);
    ops::activation_forward(be, a, pre.t, act1.t);
    ops::linear_backward(be, dy.t, act1.t, w2.t, &dpre1.t, false, dw1.t, &db1.t);
    ops::activation_backward(be, a, dpre1.t, pre.t, dpre1.t);
    ops::linear_backward(be, dpre1.t, x.t, w.t, nullptr, false, dw_up.t, &dbp1.t);
    for (int i = 0; i < M * N; ++i) EXPECT_EQ(act.f()[i], act1.f()[i]);
    for (int i = 0; i < M * N; ++i) EXPECT_EQ(dpre.f()[i], dpre1.f()[i]);
    for (int i = 0; i < K * N; ++i) EXPECT_EQ(dw.f()[i], dw1.f()[i]);
    for (int i = 0; i < K; ++i) EXPECT_EQ(db.f()[i], db1.f()[i]);
    for (int i = 0; i < N; ++i) EXPECT_EQ(dbp.f()[i], dbp1.f()[i]);
  }
  HostTensor act = filled({M, N}, 0.0f), dpre = filled({M, N}, 0.0f), dw = filled({K, N}, 1.0f), db = filled({K}, 2.0f);

  auto forward = [&](Tensor& pre_t, Tensor& y_t) {
    return error_of([&] { ops::linear_activation_forward(be, Activation::GeluTanh, x.t, w.t, &b.t, pre_t, y_t); });
  };
  HostTensor narrow = filled({M, N - 1}, 0.0f);
  EXPECT_EQ(forward(narrow.t, y.t), "linear_activation_forward: pre has shape [5, 5], expected [5, 6]");
  EXPECT_EQ(forward(pre.t, pre.t), "linear_activation_forward: outputs pre and y share memory");
  HostTensor square = random({N, N}, 7), x_and_y = random({M, N}, 8);
  EXPECT_EQ(error_of([&] {
              ops::linear_activation_forward(be, Activation::GeluTanh, x_and_y.t, square.t, nullptr, pre.t, x_and_y.t);
            }),
            "linear_activation_forward: y shares memory with the input x");
  auto backward = [&](const Tensor& pre_t, Tensor& y_t, Tensor& dpre_t) {
    return error_of(
        [&] { ops::activation_linear_backward(be, Activation::GeluTanh, dy.t, pre_t, w2.t, y_t, dpre_t, dw.t, &db.t); });
  };
  EXPECT_EQ(backward(pre.t, act.t, pre.t), "activation_linear_backward: dpre shares memory with the input pre");
  EXPECT_EQ(backward(pre.t, pre.t, dpre.t), "activation_linear_backward: y shares memory with the input pre");
  EXPECT_EQ(backward(pre.t, act.t, act.t), "activation_linear_backward: outputs y and dpre share memory");
  EXPECT_EQ(backward(narrow.t, act.t, dpre.t), "activation_linear_backward: pre has shape [5, 5], expected [5, 6]");
  EXPECT_EQ(backward(pre.t, act.t, dpre.t), "(no error)");
  // Two absent optional outputs (db, db_pre) are not memory that two outputs share.
  EXPECT_EQ(error_of([&] {
              ops::activation_linear_backward(be, Activation::Gelu, dy.t, pre.t, w2.t, act.t, dpre.t, dw.t, nullptr,
                                              nullptr);
            }),
            "(no error)");
  HostTensor short_bias = filled({N - 1}, 0.0f);
  EXPECT_EQ(error_of([&] {
              ops::activation_linear_backward(be, Activation::Gelu, dy.t, pre.t, w2.t, act.t, dpre.t, dw.t, &db.t,
                                              &short_bias.t);
            }),
            "activation_linear_backward: db_pre has shape [5], expected [6]");
}

// ---------------------------------------------------------------------------- attention

struct AttentionCase {
  AttentionDims d{2, 5, 3, 4, 0.5f};
  HostTensor qkv = random({10, 36}, 11, -2.0f, 2.0f);
  // Batch 1 pads its last two keys; batch 0 attends everywhere.
  HostTensor mask = ints({2, 5}, {1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  HostTensor stats{DType::F32, {2, 3, 5, 2}};
  HostTensor ctx{DType::F32, {10, 12}};
  HostTensor work;
  Tensor keep;  // the CPU backend keeps no mask bits
  explicit AttentionCase(const Backend& be) : work(DType::F32, {be.attention_workspace_elems(d, DType::F32)}) {}
};

// stats [B, heads, S, {max, 1 / sum}] and ctx [B*S, H] computed in double from the definition.
void attention_reference(const AttentionCase& c, const DropoutSpec& drop, std::vector<double>& stats,
                         std::vector<double>& ctx) {
  const AttentionDims& d = c.d;
  const int S = d.seq, H = d.hidden(), hd = d.head_dim;
  const float* qkv = c.qkv.t.f32();
  const int32_t* mask = c.mask.t.ptr<int32_t>();
  stats.assign(size_t(d.batch) * d.heads * S * 2, 0.0);
  ctx.assign(size_t(d.batch) * S * H, 0.0);
  auto at = [&](int b, int s, int col) { return double(qkv[(b * S + s) * 3 * H + col]); };
  for (int b = 0; b < d.batch; ++b)
    for (int h = 0; h < d.heads; ++h)
      for (int i = 0; i < S; ++i) {
        std::vector<double> row(S);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < S; ++j) {
          double s = 0;
          for (int e = 0; e < hd; ++e) s += at(b, i, h * hd + e) * at(b, j, H + h * hd + e);
          row[j] = d.scale * s + (mask[b * S + j] ? 0.0 : -double(FLT_MAX));
          mx = std::max(mx, row[j]);
        }
        for (int j = 0; j < S; ++j) sum += (row[j] = std::exp(row[j] - mx));
        const size_t r = (size_t(b) * d.heads + h) * S + i;
        stats[2 * r] = mx;
        stats[2 * r + 1] = 1.0 / sum;
        for (int j = 0; j < S; ++j) {
          const size_t idx = r * S + j;
          const bool keep = drop.p == 0 || attention_keep(drop.seed, drop.stream, idx, drop.p);
          const double pd = keep ? row[j] / sum / (1.0 - drop.p) : 0.0;
          for (int e = 0; e < hd; ++e) ctx[(b * S + i) * H + h * hd + e] += pd * at(b, j, 2 * H + h * hd + e);
        }
      }
}

TEST(OpsAttention, ForwardMatchesDoubleReference) {
  CpuBackend be;
  for (float p : {0.0f, 0.3f}) {
    AttentionCase c(be);
    const DropoutSpec drop{p, 1234, 5};
    ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, drop, c.stats.t, c.keep, c.ctx.t, c.work.t);
    std::vector<double> stats, ctx;
    attention_reference(c, drop, stats, ctx);
    expect_close("stats, p = " + std::to_string(p), c.stats.f(), stats);
    expect_close("ctx, p = " + std::to_string(p), c.ctx.f(), ctx);
  }
}

TEST(OpsAttention, FullyMaskedSequenceGivesUniformProbs) {
  CpuBackend be;
  AttentionCase c(be);
  for (int j = 0; j < 5; ++j) c.mask.i()[5 + j] = 0;
  ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
  // Every key weighs 1/5: each context row of sequence 1 is the mean of its value rows.
  for (int r = 15; r < 30; ++r) EXPECT_FLOAT_EQ(c.stats.f()[2 * r + 1], 0.2f);
  for (int i = 0; i < 5; ++i)
    for (int col = 0; col < 12; ++col) {
      double mean = 0;
      for (int j = 0; j < 5; ++j) mean += c.qkv.f()[(5 + j) * 36 + 24 + col] / 5.0;
      EXPECT_NEAR(c.ctx.f()[(5 + i) * 12 + col], mean, 1e-5);
    }
}

TEST(OpsAttention, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  for (float p : {0.0f, 0.3f}) {
    AttentionCase c(be);
    const DropoutSpec drop{p, 77, 2};
    HostTensor r = random({10, 12}, 12);
    auto loss = [&] {
      ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, drop, c.stats.t, c.keep, c.ctx.t, c.work.t);
      return weighted_sum(c.ctx, r);
    };
    loss();
    HostTensor dqkv = filled({10, 36}, 5.0f);
    ops::attention_backward(be, r.t, c.qkv.t, c.ctx.t, c.mask.t, c.stats.t, c.keep, c.d, drop, dqkv.t, c.work.t);
    expect_grad("dqkv, p = " + std::to_string(p), dqkv.f(), numeric_grad(c.qkv, loss, 1e-2f));
  }
}

TEST(OpsAttention, WrapperChecksShapesAndWorkspace) {
  CpuBackend be;
  AttentionCase c(be);
  HostTensor small(DType::F32, {be.attention_workspace_elems(c.d, DType::F32) - 1});
  EXPECT_THROW(ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, small.t), Error);
  HostTensor fmask = filled({2, 5}, 1.0f);
  EXPECT_EQ(error_of([&] { ops::attention_forward(be, c.qkv.t, fmask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t); }),
            "attention_forward: mask has dtype F32, expected I32");
  AttentionDims wrong = c.d;
  wrong.heads = 4;
  EXPECT_THROW(ops::attention_forward(be, c.qkv.t, c.mask.t, wrong, {}, c.stats.t, c.keep, c.ctx.t, c.work.t), Error);
  EXPECT_THROW(ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {1.5f, 0, 0}, c.stats.t, c.keep, c.ctx.t, c.work.t), Error);
}

// first_rows_only (inference's last layer) is a forward's choice without dropout: the CPU
// writes every row anyway, and a backward or a dropped forward with it is an error.
TEST(OpsAttention, FirstRowsOnlyIsAForwardsChoiceWithoutDropout) {
  CpuBackend be;
  AttentionCase c(be);
  HostTensor whole(DType::F32, c.ctx.t.shape);
  ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, whole.t, c.work.t);
  AttentionDims first = c.d;
  first.first_rows_only = true;
  ops::attention_forward(be, c.qkv.t, c.mask.t, first, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
  EXPECT_TRUE(std::equal(c.ctx.f(), c.ctx.f() + c.ctx.t.numel(), whole.f()));
  EXPECT_EQ(error_of([&] {
              ops::attention_forward(be, c.qkv.t, c.mask.t, first, {0.1f, 1, 2}, c.stats.t, c.keep, c.ctx.t, c.work.t);
            }),
            "attention_forward: first_rows_only is for an inference forward, without dropout");
  HostTensor dqkv(DType::F32, c.qkv.t.shape);
  EXPECT_EQ(error_of([&] {
              ops::attention_backward(be, c.ctx.t, c.qkv.t, c.ctx.t, c.mask.t, c.stats.t, c.keep, first, {}, dqkv.t,
                                      c.work.t);
            }),
            "attention_backward: first_rows_only is for an inference forward, without dropout; a backward needs "
            "every row");
}

// ---------------------------------------------------------------------------- sliding-window attention

// Nine tokens, so that windows 0, 1 and 3 leave keys out of most rows. Sequence 0 pads its
// middle key, sequence 1 its last three: with window 1, query 8 of sequence 1 sees only
// padded keys (7 and 8), so its row is uniform over them, and with window 0 every padded
// query sees only itself.
struct WindowCase {
  AttentionDims d{2, 9, 2, 4, 0.5f};
  HostTensor qkv = random({18, 24}, 21, -2.0f, 2.0f);
  HostTensor mask = ints({2, 9}, {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0});
  HostTensor stats{DType::F32, {2, 2, 9, 2}};
  HostTensor ctx{DType::F32, {18, 8}};
  HostTensor work;
  Tensor keep;
  WindowCase(const Backend& be, int window) {
    d.window = window;
    work = HostTensor(DType::F32, {be.attention_workspace_elems(d, DType::F32)});
  }
};

// Windowed attention from its definition, in double, with explicit loops: query i weighs
// key j only if |i - j| <= window (window < 0: every key), a padded key inside the window
// scoring exactly -FLT_MAX (the float sum of the score and the float minimum); stats, ctx
// and, given dctx, the gradient dqkv [B*S, 3H] (P' = the dropped and scaled P:
// dV = P'^T dO, dP = keep / (1 - p) dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
// dK = scale dS^T Q).
struct WindowReference {
  std::vector<double> stats, ctx, dqkv;
};
WindowReference window_reference(const WindowCase& c, const DropoutSpec& drop, const float* dctx) {
  const AttentionDims& d = c.d;
  const int S = d.seq, H = d.hidden(), hd = d.head_dim;
  const float* qkv = c.qkv.t.f32();
  const int32_t* mask = c.mask.t.ptr<int32_t>();
  WindowReference r;
  r.stats.assign(size_t(d.batch) * d.heads * S * 2, 0.0);
  r.ctx.assign(size_t(d.batch) * S * H, 0.0);
  r.dqkv.assign(size_t(d.batch) * S * 3 * H, 0.0);
  auto x = [&](int b, int s, int col) { return double(qkv[(b * S + s) * 3 * H + col]); };
  const double keep_scale = 1.0 / (1.0 - drop.p);
  for (int b = 0; b < d.batch; ++b)
    for (int h = 0; h < d.heads; ++h) {
      // P and the keep decisions of this head, [S][S]; out-of-window entries stay 0.
      std::vector<double> p(size_t(S) * S, 0.0), kept(size_t(S) * S, 0.0);
      for (int i = 0; i < S; ++i) {
        const auto in_window = [&](int j) { return d.window < 0 || std::abs(i - j) <= d.window; };
        double mx = -INFINITY, sum = 0;
        std::vector<double> score(S);
        for (int j = 0; j < S; ++j) {
          if (!in_window(j)) continue;
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += x(b, i, h * hd + e) * x(b, j, H + h * hd + e);
          score[j] = mask[b * S + j] ? d.scale * dot : -double(FLT_MAX);
          mx = std::max(mx, score[j]);
        }
        for (int j = 0; j < S; ++j)
          if (in_window(j)) sum += std::exp(score[j] - mx);
        const size_t row = (size_t(b) * d.heads + h) * S + i;
        r.stats[2 * row] = mx;
        r.stats[2 * row + 1] = 1.0 / sum;
        for (int j = 0; j < S; ++j) {
          if (!in_window(j)) continue;
          p[i * S + j] = std::exp(score[j] - mx) / sum;
          const bool keep = drop.p == 0 || attention_keep(drop.seed, drop.stream, row * S + j, drop.p);
          kept[i * S + j] = keep ? keep_scale : 0.0;
          for (int e = 0; e < hd; ++e)
            r.ctx[(b * S + i) * H + h * hd + e] += p[i * S + j] * kept[i * S + j] * x(b, j, 2 * H + h * hd + e);
        }
      }
      if (!dctx) continue;
      auto go = [&](int s, int e) { return double(dctx[(b * S + s) * H + h * hd + e]); };
      auto grad = [&](int s, int col) -> double& { return r.dqkv[size_t(b * S + s) * 3 * H + col]; };
      for (int i = 0; i < S; ++i) {
        std::vector<double> dp(S, 0.0);
        double dot = 0;
        for (int j = 0; j < S; ++j) {
          for (int e = 0; e < hd; ++e) {
            dp[j] += go(i, e) * x(b, j, 2 * H + h * hd + e);
            grad(j, 2 * H + h * hd + e) += p[i * S + j] * kept[i * S + j] * go(i, e);
          }
          dp[j] *= kept[i * S + j];
          dot += p[i * S + j] * dp[j];
        }
        for (int j = 0; j < S; ++j) {
          const double ds = p[i * S + j] * (dp[j] - dot);
          for (int e = 0; e < hd; ++e) {
            grad(i, h * hd + e) += d.scale * ds * x(b, j, H + h * hd + e);
            grad(j, H + h * hd + e) += d.scale * ds * x(b, i, h * hd + e);
          }
        }
      }
    }
  return r;
}

TEST(OpsAttentionWindow, ForwardAndBackwardMatchTheDefinition) {
  CpuBackend be;
  for (int window : {0, 1, 3})
    for (float p : {0.0f, 0.3f}) {
      const std::string what = "window " + std::to_string(window) + ", p = " + std::to_string(p);
      WindowCase c(be, window);
      const DropoutSpec drop{p, 99, 4};
      HostTensor dctx = random({18, 8}, 23);
      ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, drop, c.stats.t, c.keep, c.ctx.t, c.work.t);
      HostTensor dqkv = filled({18, 24}, 5.0f);  // overwritten
      ops::attention_backward(be, dctx.t, c.qkv.t, c.ctx.t, c.mask.t, c.stats.t, c.keep, c.d, drop, dqkv.t,
                              c.work.t);
      const WindowReference want = window_reference(c, drop, dctx.f());
      expect_close("stats, " + what, c.stats.f(), want.stats);
      expect_close("ctx, " + what, c.ctx.f(), want.ctx, 1e-4);
      expect_close("dqkv, " + what, dqkv.f(), want.dqkv, 1e-4);
    }
}

TEST(OpsAttentionWindow, OutOfWindowKeysHaveNoWeightWhateverTheirValues) {
  CpuBackend be;
  WindowCase c(be, 1);
  ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
  HostTensor before = clone(c.ctx);
  // Token 8 of sequence 0: keys and values of every token but 7 and 8 change, and the
  // queries of 7 and 8 stay: the context of query 8 (window 1: keys 7, 8) must not move.
  for (int s = 0; s < 7; ++s)
    for (int col = 8; col < 24; ++col) c.qkv.f()[s * 24 + col] += 100.0f;
  ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
  for (int col = 0; col < 8; ++col) EXPECT_EQ(c.ctx.f()[8 * 8 + col], before.f()[8 * 8 + col]) << col;
  // Query 8 of sequence 1 sees only padded keys (7 and 8): uniform over them.
  for (int h = 0; h < 2; ++h) EXPECT_FLOAT_EQ(c.stats.f()[2 * ((2 + h) * 9 + 8) + 1], 0.5f);
}

TEST(OpsAttentionWindow, AWindowAsLongAsTheSequenceIsFullAttentionBitForBit) {
  CpuBackend be;
  for (float p : {0.0f, 0.3f}) {
    const DropoutSpec drop{p, 7, 1};
    WindowCase full(be, -1);
    HostTensor dctx = random({18, 8}, 29);
    HostTensor want_dqkv = filled({18, 24}, 0.0f);
    ops::attention_forward(be, full.qkv.t, full.mask.t, full.d, drop, full.stats.t, full.keep, full.ctx.t,
                           full.work.t);
    ops::attention_backward(be, dctx.t, full.qkv.t, full.ctx.t, full.mask.t, full.stats.t, full.keep, full.d, drop,
                            want_dqkv.t, full.work.t);
    for (int window : {8, 9, 1000, std::numeric_limits<int>::max()}) {
      WindowCase c(be, window);
      HostTensor dqkv = filled({18, 24}, 0.0f);
      ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, drop, c.stats.t, c.keep, c.ctx.t, c.work.t);
      ops::attention_backward(be, dctx.t, c.qkv.t, c.ctx.t, c.mask.t, c.stats.t, c.keep, c.d, drop, dqkv.t, c.work.t);
      EXPECT_EQ(std::memcmp(c.stats.f(), full.stats.f(), size_t(c.stats.t.bytes())), 0) << window;
      EXPECT_EQ(std::memcmp(c.ctx.f(), full.ctx.f(), size_t(c.ctx.t.bytes())), 0) << window;
      EXPECT_EQ(std::memcmp(dqkv.f(), want_dqkv.f(), size_t(dqkv.t.bytes())), 0) << window;
    }
  }
}

TEST(OpsAttentionWindow, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  for (float p : {0.0f, 0.3f}) {
    WindowCase c(be, 2);
    // Sequence 1 pads two keys only: a query whose window holds only padded keys has
    // scores of exactly -FLT_MAX, flat in float, where finite differences see no gradient
    // (the analytic one, as torch's, passes through the mask's addition).
    c.mask.i()[15] = 1;
    const DropoutSpec drop{p, 77, 2};
    HostTensor r = random({18, 8}, 12);
    auto loss = [&] {
      ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, drop, c.stats.t, c.keep, c.ctx.t, c.work.t);
      return weighted_sum(c.ctx, r);
    };
    loss();
    HostTensor dqkv = filled({18, 24}, 5.0f);
    ops::attention_backward(be, r.t, c.qkv.t, c.ctx.t, c.mask.t, c.stats.t, c.keep, c.d, drop, dqkv.t, c.work.t);
    expect_grad("dqkv, p = " + std::to_string(p), dqkv.f(), numeric_grad(c.qkv, loss, 1e-2f));
  }
}

TEST(OpsAttentionWindow, PackedForwardCountsTheWindowFromEachSequencesStart) {
  CpuBackend be;
  // Sequences of 9 and 6 tokens packed into 15 rows: each alone, padded to 9 with its
  // mask, must give the packed rows' context.
  for (int window : {0, 2, 20}) {
    AttentionDims d{2, 9, 2, 4, 0.5f};
    d.window = window;
    HostTensor qkv = random({15, 24}, 31, -2.0f, 2.0f);
    HostTensor row_start = ints({3}, {0, 9, 15});
    HostTensor ctx(DType::F32, {15, 8});
    HostTensor work(DType::F32, {be.attention_workspace_elems(d, DType::F32)});
    ops::attention_forward_packed(be, qkv.t, row_start.t, d, ctx.t, work.t);
    WindowCase c(be, window);
    std::memcpy(c.qkv.f(), qkv.f(), size_t(qkv.t.bytes()));  // rows 15 .. 17 pad sequence 1
    for (int j = 0; j < 18; ++j) c.mask.i()[j] = j < 15 ? 1 : 0;
    ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
    for (int s = 0; s < 15; ++s)
      for (int col = 0; col < 8; ++col)
        EXPECT_NEAR(ctx.f()[s * 8 + col], c.ctx.f()[s * 8 + col], 1e-5) << "window " << window << " row " << s;
  }
}

// Training on packed sequences of lengths 7, 3 and 9 (S = 9) against the padded batch
// whose masks attend to each sequence's first tokens: with and without dropout and a
// window, the context, statistics and gradients of the attended rows are the padded
// ones (the masks are the same elements of the same stream), and positions past a
// sequence keep what the caller put in stats.
TEST(OpsAttentionPacked, TrainingIsThePaddedBatchAtItsAttendedRows) {
  CpuBackend be;
  const int lengths[3] = {7, 3, 9}, S = 9, B = 3, heads = 2, hd = 4, H = heads * hd;
  for (int window : {-1, 2})
    for (float p : {0.0f, 0.3f}) {
      const std::string what = "window " + std::to_string(window) + ", p " + std::to_string(p);
      AttentionDims d{B, S, heads, hd, 0.5f};
      d.window = window;
      const DropoutSpec drop{p, 99, 4};
      HostTensor padded_qkv = random({B * S, 3 * H}, 41, -2.0f, 2.0f), padded_dctx = filled({B * S, H}, 0.0f);
      HostTensor mask = filled({B, S}, 0.0f), dctx_rand = random({B * S, H}, 42);
      std::vector<int32_t> mask_values(B * S, 0), starts{0}, rows;
      for (int b = 0; b < B; ++b) {
        for (int i = 0; i < lengths[b]; ++i) {
          mask_values[b * S + i] = 1;
          rows.push_back(b * S + i);
          std::memcpy(padded_dctx.f() + (b * S + i) * H, dctx_rand.f() + (b * S + i) * H, H * sizeof(float));
        }
        starts.push_back(int32_t(rows.size()));
      }
      const int T = int(rows.size());
      HostTensor padded_mask = ints({B, S}, mask_values), row_start = ints({B + 1}, starts);
      HostTensor qkv(DType::F32, {T, 3 * H}), dctx(DType::F32, {T, H});
      for (int r = 0; r < T; ++r) {
        std::memcpy(qkv.f() + r * 3 * H, padded_qkv.f() + rows[r] * 3 * H, 3 * H * sizeof(float));
        std::memcpy(dctx.f() + r * H, padded_dctx.f() + rows[r] * H, H * sizeof(float));
      }
      HostTensor work(DType::F32, {be.attention_workspace_elems(d, DType::F32)});
      HostTensor padded_stats(DType::F32, {B, heads, S, 2}), padded_ctx(DType::F32, {B * S, H});
      HostTensor padded_dqkv(DType::F32, {B * S, 3 * H});
      Tensor keep;
      ops::attention_forward(be, padded_qkv.t, padded_mask.t, d, drop, padded_stats.t, keep, padded_ctx.t, work.t);
      ops::attention_backward(be, padded_dctx.t, padded_qkv.t, padded_ctx.t, padded_mask.t, padded_stats.t, keep, d,
                              drop, padded_dqkv.t, work.t);
      HostTensor stats = filled({B, heads, S, 2}, 7.0f), ctx(DType::F32, {T, H}), dqkv(DType::F32, {T, 3 * H});
      ops::attention_forward_packed(be, qkv.t, row_start.t, d, drop, stats.t, keep, ctx.t, work.t);
      ops::attention_backward_packed(be, dctx.t, qkv.t, ctx.t, row_start.t, stats.t, keep, d, drop, dqkv.t, work.t);
      for (int r = 0; r < T; ++r) {
        for (int c = 0; c < H; ++c)
          ASSERT_NEAR(ctx.f()[r * H + c], padded_ctx.f()[rows[r] * H + c], 1e-5) << what << ", row " << r;
        for (int c = 0; c < 3 * H; ++c)
          ASSERT_NEAR(dqkv.f()[r * 3 * H + c], padded_dqkv.f()[rows[r] * 3 * H + c], 1e-4) << what << ", row " << r;
      }
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < S; ++i) {
            const int at = 2 * ((b * heads + h) * S + i);
            for (int k = 0; k < 2; ++k)
              EXPECT_EQ(stats.f()[at + k], i < lengths[b] ? padded_stats.f()[at + k] : 7.0f) << what;
          }
    }
}

TEST(OpsAttentionPacked, WrapperChecksStatsRowsAndGradients) {
  CpuBackend be;
  AttentionDims d{2, 5, 3, 4, 0.5f};
  HostTensor qkv = random({7, 36}, 3), row_start = ints({3}, {0, 5, 7}), ctx(DType::F32, {7, 12});
  HostTensor stats(DType::F32, {2, 3, 5, 2}), short_stats(DType::F32, {2, 3, 4, 2});
  HostTensor work(DType::F32, {be.attention_workspace_elems(d, DType::F32)});
  Tensor keep;
  EXPECT_EQ(error_of([&] {
              ops::attention_forward_packed(be, qkv.t, row_start.t, d, {}, short_stats.t, keep, ctx.t, work.t);
            }),
            "attention_forward_packed: stats has shape [2, 3, 4, 2], expected [2, 3, 5, 2]");
  HostTensor long_qkv = random({11, 36}, 3), long_ctx(DType::F32, {11, 12});
  EXPECT_EQ(error_of([&] {
              ops::attention_forward_packed(be, long_qkv.t, row_start.t, d, {}, stats.t, keep, long_ctx.t, work.t);
            }),
            "attention_forward_packed: qkv has 11 rows, more than 2 sequences of at most 5");
  HostTensor dqkv(DType::F32, {7, 35});
  ops::attention_forward_packed(be, qkv.t, row_start.t, d, {}, stats.t, keep, ctx.t, work.t);
  EXPECT_EQ(error_of([&] {
              ops::attention_backward_packed(be, ctx.t, qkv.t, ctx.t, row_start.t, stats.t, keep, d, {}, dqkv.t,
                                             work.t);
            }),
            "attention_backward_packed: dqkv has shape [7, 35], expected [7, 36]");
}

TEST(OpsAttentionWindow, FlopsCountTheWindowsPairsAndTheWrapperChecksTheWindow) {
  CpuBackend be;
  const auto profiled_flops = [&](int window) {
    WindowCase c(be, window);
    HostTensor dqkv = filled({18, 24}, 0.0f);
    OpProfiler profiler(be);
    profiler.start();
    ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
    ops::attention_backward(be, c.ctx.t, c.qkv.t, c.ctx.t, c.mask.t, c.stats.t, c.keep, c.d, {}, dqkv.t, c.work.t);
    const Profile p = profiler.finish();
    EXPECT_EQ(p.ops.size(), 2u);
    EXPECT_EQ(p.ops[1].cost.flops, 2 * p.ops[0].cost.flops);
    return p.ops[0].cost.flops;
  };
  const double per_pair = 4.0 * 2 * 2 * 4;  // 2 * 2 head_dim per (query, key), B = heads = 2
  EXPECT_EQ(profiled_flops(-1), 81 * per_pair);
  EXPECT_EQ(profiled_flops(0), 9 * per_pair);
  EXPECT_EQ(profiled_flops(1), (2 + 7 * 3 + 2) * per_pair);
  EXPECT_EQ(profiled_flops(3), (4 + 5 + 6 + 7 * 3 + 6 + 5 + 4) * per_pair);  // rows 0..8: 4 5 6 7 7 7 6 5 4
  EXPECT_EQ(profiled_flops(8), 81 * per_pair);
  EXPECT_EQ(profiled_flops(100), 81 * per_pair);
  {  // first rows only: query 0's pairs, 9 without a window and 2 at window 1
    for (const auto& [window, pairs] : {std::pair{-1, 9}, std::pair{1, 2}}) {
      WindowCase c(be, window);
      c.d.first_rows_only = true;
      OpProfiler profiler(be);
      profiler.start();
      ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t);
      EXPECT_EQ(profiler.finish().ops.at(0).cost.flops, pairs * per_pair) << "window " << window;
    }
  }

  WindowCase c(be, -2);
  EXPECT_EQ(error_of([&] { ops::attention_forward(be, c.qkv.t, c.mask.t, c.d, {}, c.stats.t, c.keep, c.ctx.t, c.work.t); }),
            "attention_forward: window -2 must be -1 (no window) or a distance >= 0");
}

// ---------------------------------------------------------------------------- layernorm

TEST(OpsLayerNorm, ForwardMatchesDoubleReference) {
  CpuBackend be;
  const int R = 6, C = 11;
  const float eps = 1e-5f;
  HostTensor x = random({R, C}, 1, 0.0f, 3.0f), g = random({C}, 2, 0.5f, 1.5f), b = random({C}, 3);
  HostTensor y(DType::F32, {R, C}), mean(DType::F32, {R}), rstd(DType::F32, {R});
  ops::layernorm_forward(be, x.t, g.t, b.t, eps, y.t, mean.t, rstd.t);
  std::vector<double> wy(R * C), wm(R), wr(R);
  for (int r = 0; r < R; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x.f()[r * C + c] / double(C);
    for (int c = 0; c < C; ++c) v += (x.f()[r * C + c] - m) * (x.f()[r * C + c] - m) / C;
    wm[r] = m;
    wr[r] = 1.0 / std::sqrt(v + eps);
    for (int c = 0; c < C; ++c) wy[r * C + c] = (x.f()[r * C + c] - m) * wr[r] * g.f()[c] + b.f()[c];
  }
  expect_close("y", y.f(), wy);
  expect_close("mean", mean.f(), wm);
  expect_close("rstd", rstd.f(), wr);
}

TEST(OpsLayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  CpuBackend be;
  const int R = 6, C = 11;
  HostTensor x = random({R, C}, 1, 0.0f, 3.0f), g = random({C}, 2, 0.5f, 1.5f), b = random({C}, 3);
  HostTensor r = random({R, C}, 4);
  HostTensor y(DType::F32, {R, C}), mean(DType::F32, {R}), rstd(DType::F32, {R});
  auto loss = [&] {
    ops::layernorm_forward(be, x.t, g.t, b.t, 1e-5f, y.t, mean.t, rstd.t);
    return weighted_sum(y, r);
  };
  loss();
  HostTensor dx(DType::F32, {R, C}), dg = random({C}, 5), db = random({C}, 6);
  HostTensor dg0 = random({C}, 5), db0 = random({C}, 6);
  ops::layernorm_backward(be, r.t, x.t, g.t, mean.t, rstd.t, dx.t, dg.t, db.t);
  expect_grad("dx", dx.f(), numeric_grad(x, loss));
  expect_grad("dgamma", dg.f(), numeric_grad(g, loss), 1e-2, dg0.f());
  expect_grad("dbeta", db.f(), numeric_grad(b, loss), 1e-2, db0.f());
}

// Every element of got has the bits of want's (a NaN's included).
void expect_same_bits(const std::string& what, const HostTensor& got, const HostTensor& want) {
  ASSERT_TRUE(got.t.dtype == DType::F32 && got.t.shape == want.t.shape) << what;
  const auto* g = static_cast<const uint32_t*>(got.t.data);
  const auto* w = static_cast<const uint32_t*>(want.t.data);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.n(); ++i)
    if (g[i] != w[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ, the first at " << first;
}

// The fused residual LayerNorm ops are the composition of the unfused ones, bit for bit:
// with separate outputs and in place as BERT calls them (sum over x, dx over dy), at
// widths that are not multiples of four, that are and are not powers of two, with and
// without dropout, and with the stream read from a step counter.
TEST(OpsLayerNorm, FusedResidualOpsEqualTheUnfusedOpsBitForBit) {
  CpuBackend be;
  const int R = 5;
  const float eps = 1e-12f;
  int64_t step = 41;
  for (int C : {11, 1000, 1024})
    for (const DropoutSpec& d : {DropoutSpec{}, DropoutSpec{0.1f, 99, 7}, DropoutSpec{0.1f, 99, 7, &step}}) {
      const std::string at = "C = " + std::to_string(C) + ", p = " + std::to_string(d.p) +
                             (d.step ? " from a step counter" : "");
      HostTensor x = random({R, C}, 1), res = random({R, C}, 2, -1.0f, 3.0f), dy = random({R, C}, 5);
      HostTensor g = random({C}, 3, 0.5f, 1.5f), b = random({C}, 4);
      HostTensor sum(DType::F32, {R, C}), y(DType::F32, {R, C}), mean(DType::F32, {R}), rstd(DType::F32, {R});
      HostTensor dsum(DType::F32, {R, C}), dx(DType::F32, {R, C}), dg = random({C}, 6), db = random({C}, 7);
      ops::dropout_add(be, x.t, res.t, d, sum.t);
      ops::layernorm_forward(be, sum.t, g.t, b.t, eps, y.t, mean.t, rstd.t);
      ops::layernorm_backward(be, dy.t, sum.t, g.t, mean.t, rstd.t, dsum.t, dg.t, db.t);
      ops::dropout(be, dsum.t, d, dx.t);
      int dropped = 0;
      for (int64_t i = 0; i < dx.n(); ++i) dropped += dx.f()[i] == 0.0f && dsum.f()[i] != 0.0f;
      EXPECT_EQ(dropped > 0, d.p > 0) << at;

      for (bool in_place : {false, true}) {
        const std::string how = at + (in_place ? ", in place" : ", separate outputs");
        HostTensor fx = clone(x), fdy = clone(dy), own_sum(DType::F32, {R, C}), own_dx(DType::F32, {R, C});
        HostTensor fy(DType::F32, {R, C}), fmean(DType::F32, {R}), frstd(DType::F32, {R});
        HostTensor fdsum(DType::F32, {R, C}), fdg = random({C}, 6), fdb = random({C}, 7);
        HostTensor& fsum = in_place ? fx : own_sum;
        HostTensor& fdx = in_place ? fdy : own_dx;
        ops::dropout_add_layernorm_forward(be, fx.t, res.t, d, g.t, b.t, eps, fsum.t, fy.t, fmean.t, frstd.t);
        ops::layernorm_dropout_backward(be, fdy.t, fsum.t, g.t, fmean.t, frstd.t, d, fdsum.t, fdx.t, fdg.t, fdb.t);
        expect_same_bits("sum, " + how, fsum, sum);
        expect_same_bits("y, " + how, fy, y);
        expect_same_bits("mean, " + how, fmean, mean);
        expect_same_bits("rstd, " + how, frstd, rstd);
        expect_same_bits("dsum, " + how, fdsum, dsum);
        expect_same_bits("dx, " + how, fdx, dx);
        expect_same_bits("dgamma, " + how, fdg, dg);
        expect_same_bits("dbeta, " + how, fdb, db);
      }
      // Without sum (inference): the same y and statistics, and x left as it was.
      HostTensor ax = clone(x), ay(DType::F32, {R, C}), amean(DType::F32, {R}), arstd(DType::F32, {R});
      Tensor no_sum;
      ops::dropout_add_layernorm_forward(be, ax.t, res.t, d, g.t, b.t, eps, no_sum, ay.t, amean.t, arstd.t);
      expect_same_bits("x without sum, " + at, ax, x);
      expect_same_bits("y without sum, " + at, ay, y);
      expect_same_bits("mean without sum, " + at, amean, mean);
      expect_same_bits("rstd without sum, " + at, arstd, rstd);
    }
}

// A split product's parts are the products of x's and w's column slices; their residual
// LayerNorm is the unfused ops' on the product (to F32 rounding: the sums take another
// order). The combined op runs those ops themselves on the CPU, which splits nothing.
TEST(OpsLayerNorm, SplitProductPartsAndTheirResidualNormAreTheUnfusedOps) {
  CpuBackend be;
  const int M = 5, K = 12, N = 7;
  const float eps = 1e-12f;
  HostTensor x = random({M, K}, 1), w = random({N, K}, 2), b = random({N}, 3), res = random({M, N}, 4, -1.0f, 3.0f);
  HostTensor g = random({N}, 5, 0.5f, 1.5f), beta = random({N}, 6);
  HostTensor out(DType::F32, {M, N}), y(DType::F32, {M, N}), mean(DType::F32, {M}), rstd(DType::F32, {M});
  Tensor no_sum;
  ops::linear_forward(be, x.t, w.t, &b.t, out.t);
  ops::dropout_add_layernorm_forward(be, out.t, res.t, {}, g.t, beta.t, eps, no_sum, y.t, mean.t, rstd.t);
  const auto doubles = [](HostTensor& h) { return std::vector<double>(h.f(), h.f() + h.n()); };
  for (int splits : {1, 2, 3, 4}) {
    const std::string at = std::to_string(splits) + " parts";
    HostTensor parts = filled({splits, M, N}, 9.0f);
    ops::linear_split_forward(be, x.t, w.t, parts.t);
    const int ks = K / splits;
    std::vector<double> want(size_t(splits) * M * N);
    for (int s = 0; s < splits; ++s)
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j)
          for (int k = s * ks; k < (s + 1) * ks; ++k)
            want[(size_t(s) * M + i) * N + j] += double(x.f()[i * K + k]) * w.f()[j * K + k];
    expect_close("parts, " + at, parts.f(), want);
    HostTensor py = filled({M, N}, 9.0f), pmean(DType::F32, {M}), prstd(DType::F32, {M});
    ops::parts_add_layernorm_forward(be, parts.t, &b.t, res.t, g.t, beta.t, eps, py.t, pmean.t, prstd.t);
    expect_close("y, " + at, py.f(), doubles(y));
    expect_close("mean, " + at, pmean.f(), doubles(mean));
    expect_close("rstd, " + at, prstd.f(), doubles(rstd));
  }
  EXPECT_EQ(be.linear_splits(M, N, K, DType::F32), 1);
  HostTensor work = filled({ops::linear_add_layernorm_work(be, M, N, K, DType::F32)}, 9.0f);
  HostTensor cy(DType::F32, {M, N}), cmean(DType::F32, {M}), crstd(DType::F32, {M});
  ops::linear_add_layernorm_forward(be, x.t, w.t, &b.t, res.t, g.t, beta.t, eps, work.t, cy.t, cmean.t, crstd.t);
  expect_same_bits("y of the combined op", cy, y);
  expect_same_bits("mean of the combined op", cmean, mean);
  expect_same_bits("rstd of the combined op", crstd, rstd);

  HostTensor five = filled({5, M, N}, 0.0f), small = filled({M * N - 1}, 0.0f);
  EXPECT_EQ(error_of([&] { ops::linear_split_forward(be, x.t, w.t, five.t); }),
            "linear_split_forward: 5 parts do not divide x's 12 columns");
  EXPECT_EQ(error_of([&] {
              ops::linear_add_layernorm_forward(be, x.t, w.t, &b.t, res.t, g.t, beta.t, eps, small.t, cy.t, cmean.t,
                                                crstd.t);
            }),
            "linear_add_layernorm_forward: work of 34 elements is less than the product's 5 x 7");
  HostTensor parts = filled({2, M, N}, 0.0f);
  Tensor first_part = parts.t.view({2 * M, N}).rows(0, M);
  EXPECT_EQ(error_of([&] {
              ops::parts_add_layernorm_forward(be, parts.t, &b.t, res.t, g.t, beta.t, eps, first_part, cmean.t,
                                               crstd.t);
            }),
            "parts_add_layernorm_forward: y shares memory with the input parts");
}

TEST(OpsLayerNorm, FusedResidualWrappersCheckShapesAndAliasing) {
  CpuBackend be;
  const int R = 3, C = 4;
  HostTensor x = random({R, C}, 1), res = random({R, C}, 2), g = random({C}, 3), b = random({C}, 4);
  HostTensor sum(DType::F32, {R, C}), y(DType::F32, {R, C}), mean(DType::F32, {R}), rstd(DType::F32, {R});
  auto forward = [&](const Tensor& xt, const Tensor& rt, const DropoutSpec& d, Tensor& st, Tensor& yt) {
    return error_of([&] { ops::dropout_add_layernorm_forward(be, xt, rt, d, g.t, b.t, 1e-5f, st, yt, mean.t, rstd.t); });
  };
  HostTensor wide = random({R, C + 1}, 5), two_rows_apart = random({R + 1, C}, 6);
  Tensor head = two_rows_apart.t.rows(0, R), tail = two_rows_apart.t.rows(1, R + 1);
  EXPECT_EQ(forward(x.t, wide.t, {}, sum.t, y.t),
            "dropout_add_layernorm_forward: residual has shape [3, 5], expected [3, 4]");
  EXPECT_EQ(forward(x.t, res.t, {1.5f}, sum.t, y.t),
            "dropout_add_layernorm_forward: dropout probability 1.5 is outside [0, 1]");
  EXPECT_EQ(forward(x.t, res.t, {}, res.t, y.t),
            "dropout_add_layernorm_forward: sum shares memory with the input residual");
  EXPECT_EQ(forward(head, res.t, {}, tail, y.t),
            "dropout_add_layernorm_forward: sum overlaps x without being it (it may only be x itself)");
  EXPECT_EQ(forward(x.t, res.t, {}, sum.t, x.t), "dropout_add_layernorm_forward: y shares memory with the input x");
  EXPECT_EQ(forward(x.t, res.t, {}, sum.t, sum.t), "dropout_add_layernorm_forward: outputs sum and y share memory");
  EXPECT_EQ(forward(x.t, res.t, {}, x.t, y.t), "(no error)");

  HostTensor dy = random({R, C}, 7), dsum(DType::F32, {R, C}), dx(DType::F32, {R, C});
  HostTensor dg = filled({C}, 0.0f), db = filled({C}, 0.0f), narrow = filled({C - 1}, 1.0f);
  auto backward = [&](const Tensor& gamma, Tensor& dsum_t, Tensor& dx_t) {
    return error_of([&] {
      ops::layernorm_dropout_backward(be, dy.t, sum.t, gamma, mean.t, rstd.t, {}, dsum_t, dx_t, dg.t, db.t);
    });
  };
  EXPECT_EQ(backward(narrow.t, dsum.t, dx.t), "layernorm_dropout_backward: gamma has shape [3], expected [4]");
  EXPECT_EQ(backward(g.t, dy.t, dx.t), "layernorm_dropout_backward: dsum shares memory with the input dy");
  EXPECT_EQ(backward(g.t, dsum.t, sum.t), "layernorm_dropout_backward: dx shares memory with the input sum");
  EXPECT_EQ(backward(g.t, dsum.t, dsum.t), "layernorm_dropout_backward: outputs dsum and dx share memory");
  EXPECT_EQ(backward(g.t, dsum.t, dy.t), "(no error)");
}

// ---------------------------------------------------------------------------- elementwise

double act_ref(Activation a, double x) {
  switch (a) {
    case Activation::Gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::GeluTanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::Relu: return x > 0 ? x : 0;
  }
  return 0;
}

// Values in [-3, 3] away from 0, where relu has its kink.
HostTensor activation_input() {
  HostTensor x = random({37}, 8, -3.0f, 3.0f);
  for (int64_t i = 0; i < x.n(); ++i)
    if (std::fabs(x.f()[i]) < 0.05f) x.f()[i] = 0.5f;
  return x;
}

TEST(OpsElementwise, ActivationsMatchDoubleReference) {
  CpuBackend be;
  for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
    HostTensor x = activation_input(), y(DType::F32, {37});
    ops::activation_forward(be, a, x.t, y.t);
    std::vector<double> want(37);
    for (int i = 0; i < 37; ++i) want[i] = act_ref(a, x.f()[i]);
    expect_close("activation " + std::to_string(int(a)), y.f(), want);
  }
  HostTensor x = activation_input(), y(DType::F32, {37});
  ops::tanh_forward(be, x.t, y.t);
  std::vector<double> want(37);
  for (int i = 0; i < 37; ++i) want[i] = std::tanh(double(x.f()[i]));
  expect_close("tanh", y.f(), want);
}

TEST(OpsElementwise, ActivationBackwardMatchesFiniteDifferencesInPlace) {
  CpuBackend be;
  for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
    HostTensor x = activation_input(), y(DType::F32, {37}), r = random({37}, 9);
    auto loss = [&] {
      ops::activation_forward(be, a, x.t, y.t);
      return weighted_sum(y, r);
    };
    HostTensor d = random({37}, 9);  // dy, overwritten by dx
    ops::activation_backward(be, a, d.t, x.t, d.t);
    expect_grad("activation " + std::to_string(int(a)), d.f(), numeric_grad(x, loss, 1e-3f));
  }
}

TEST(OpsElementwise, TanhBackwardFromOutputInPlace) {
  CpuBackend be;
  HostTensor x = random({37}, 8, -2.0f, 2.0f), y(DType::F32, {37}), r = random({37}, 9);
  auto loss = [&] {
    ops::tanh_forward(be, x.t, y.t);
    return weighted_sum(y, r);
  };
  loss();
  HostTensor d = random({37}, 9);
  ops::tanh_backward(be, d.t, y.t, d.t);
  expect_grad("tanh", d.f(), numeric_grad(x, loss, 1e-3f));
}

TEST(OpsElementwise, DropoutFollowsPhiloxMaskAndMayAlias) {
  CpuBackend be;
  const int n = 10001;  // not a multiple of the four words of a Philox block
  const DropoutSpec d{0.25f, 31, 4};
  HostTensor x = random({n}, 1), res = random({n}, 2), y(DType::F32, {n}), out(DType::F32, {n});
  ops::dropout(be, x.t, d, y.t);
  ops::dropout_add(be, x.t, res.t, d, out.t);
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    const bool keep = dropout_keep(d.seed, d.stream, uint64_t(i), d.p);
    kept += keep;
    ASSERT_EQ(y.f()[i], keep ? x.f()[i] * (1.0f / 0.75f) : 0.0f) << i;
    ASSERT_EQ(out.f()[i], res.f()[i] + y.f()[i]) << i;
  }
  EXPECT_NEAR(kept / double(n), 0.75, 0.02);

  HostTensor xa = random({n}, 1), ra = random({n}, 2), xb = random({n}, 1), rb = random({n}, 2);
  ops::dropout_add(be, xa.t, ra.t, d, ra.t);  // out aliases residual
  ops::dropout_add(be, xb.t, rb.t, d, xb.t);  // out aliases x
  ops::dropout(be, xa.t, d, xa.t);            // y aliases x
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(ra.f()[i], out.f()[i]) << i;
    ASSERT_EQ(xb.f()[i], out.f()[i]) << i;
    ASSERT_EQ(xa.f()[i], y.f()[i]) << i;
  }
}

// A step counter in memory gives the masks of the stream composed on the host, and the
// op reads the counter when it runs (what a replayed CUDA graph relies on).
TEST(OpsElementwise, DropoutReadsItsStepCounterWhenItRuns) {
  CpuBackend be;
  const int n = 4099;
  int64_t counter = (int64_t(1) << 40) + 3;
  const DropoutSpec by_counter{0.3f, 77, 5, &counter};
  HostTensor x = random({n}, 1, 0.5f, 1.5f), a(DType::F32, {n}), b(DType::F32, {n});
  for (int round = 0; round < 2; ++round, ++counter) {
    const DropoutSpec composed{0.3f, 77, (uint64_t(counter) << kDropoutSiteBits) | 5};
    ops::dropout(be, x.t, by_counter, a.t);
    ops::dropout(be, x.t, composed, b.t);
    for (int i = 0; i < n; ++i) ASSERT_EQ(a.f()[i], b.f()[i]) << "round " << round << ", element " << i;
  }
  HostTensor first(DType::F32, {n});
  --counter;
  ops::dropout(be, x.t, by_counter, first.t);
  ++counter;
  ops::dropout(be, x.t, by_counter, a.t);
  int differ = 0;
  for (int i = 0; i < n; ++i) differ += a.f()[i] != first.f()[i];
  EXPECT_GT(differ, n / 10) << "a new counter value must draw a new mask";
}

TEST(OpsElementwise, DropoutOfZeroIsIdentity) {
  CpuBackend be;
  HostTensor x = random({9}, 1), res = random({9}, 2), y = filled({9}, 0.0f), out(DType::F32, {9});
  ops::dropout(be, x.t, {}, y.t);
  ops::dropout_add(be, x.t, res.t, {}, out.t);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(y.f()[i], x.f()[i]);
    EXPECT_EQ(out.f()[i], x.f()[i] + res.f()[i]);
  }
  HostTensor other = random({3, 3}, 3);
  EXPECT_EQ(error_of([&] { ops::dropout(be, x.t, {}, other.t); }),
            "dropout: y has shape [3, 3], expected [9] (the shape of x)");
}

// The bytes a profiled op counts: what memory serves it, which the roofline divides by.
double profiled_bytes(Backend& be, const std::function<void()>& op) {
  OpProfiler profiler(be);
  profiler.start();
  op();
  const Profile p = profiler.finish();
  EXPECT_EQ(p.ops.size(), 1u);
  return p.ops.empty() ? -1 : p.ops[0].cost.bytes;
}

TEST(OpsElementwise, DropoutInPlaceWithoutDroppingCountsNoBytes) {
  CpuBackend be;
  HostTensor x = random({64}, 1), y = filled({64}, 0.0f);
  EXPECT_EQ(profiled_bytes(be, [&] { ops::dropout(be, x.t, {}, x.t); }), 0.0);  // evaluation: nothing moves
  EXPECT_EQ(profiled_bytes(be, [&] { ops::dropout(be, x.t, {}, y.t); }), 2 * 64 * 4.0);
  EXPECT_EQ(profiled_bytes(be, [&] { ops::dropout(be, x.t, {0.1f, 1}, x.t); }), 2 * 64 * 4.0);
}

// ---------------------------------------------------------------------------- embedding

struct EmbeddingCase {
  static constexpr int kSeq = 3;
  HostTensor ids = ints({6}, {4, 0, 4, 6, 2, 4});
  HostTensor types = ints({6}, {0, 1, 1, 0, 0, 1});
  HostTensor word = random({7, 4}, 1), pos = random({5, 4}, 2), type = random({2, 4}, 3);
  HostTensor out{DType::F32, {6, 4}};
};

// A token reads its word row; the position and type tables' rows, shared by every sequence,
// count once each (at most the table, at most one a token).
TEST(OpsEmbedding, ForwardCountsSharedTableRowsOnce) {
  CpuBackend be;
  EmbeddingCase c;
  const double ids = 2 * 6 * 4, out = 6 * 4 * 4, row = 4 * 4;
  EXPECT_EQ(profiled_bytes(be, [&] {
              ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t);
            }),
            ids + out + (6 + 5 + 2) * row);
}

TEST(OpsEmbedding, ForwardSumsThreeTables) {
  CpuBackend be;
  EmbeddingCase c;
  ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t);
  std::vector<double> want(24);
  for (int t = 0; t < 6; ++t)
    for (int h = 0; h < 4; ++h)
      want[t * 4 + h] = double(c.word.f()[c.ids.i()[t] * 4 + h]) + c.pos.f()[(t % 3) * 4 + h] +
                        c.type.f()[c.types.i()[t] * 4 + h];
  expect_close("out", c.out.f(), want);
}

TEST(OpsEmbedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  CpuBackend be;
  EmbeddingCase c;
  HostTensor r = random({6, 4}, 4);
  auto loss = [&] {
    ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t);
    return weighted_sum(c.out, r);
  };
  HostTensor dw = random({7, 4}, 5), dp = random({5, 4}, 6), dt = random({2, 4}, 7);
  HostTensor dw0 = random({7, 4}, 5), dp0 = random({5, 4}, 6), dt0 = random({2, 4}, 7);
  ops::embedding_backward(be, r.t, c.ids.t, c.types.t, Tensor{}, c.kSeq, dw.t, dp.t, dt.t);
  expect_grad("dword", dw.f(), numeric_grad(c.word, loss), 1e-4, dw0.f());
  expect_grad("dpos", dp.f(), numeric_grad(c.pos, loss), 1e-4, dp0.f());
  expect_grad("dtype", dt.f(), numeric_grad(c.type, loss), 1e-4, dt0.f());
}

// RoBERTa's embeddings: positions given (counted after the padding id), type 0 for every
// token; DistilBERT's: no type table at all.
TEST(OpsEmbedding, GivenPositionsAndAbsentTypes) {
  CpuBackend be;
  EmbeddingCase c;
  HostTensor positions = ints({6}, {2, 3, 4, 2, 1, 1});
  ops::embedding_forward(be, c.ids.t, Tensor{}, positions.t, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t);
  std::vector<double> want(24), want_no_type(24);
  for (int t = 0; t < 6; ++t)
    for (int h = 0; h < 4; ++h) {
      const double wp = double(c.word.f()[c.ids.i()[t] * 4 + h]) + c.pos.f()[positions.i()[t] * 4 + h];
      want[t * 4 + h] = wp + c.type.f()[h];
      want_no_type[t * 4 + h] = wp;
    }
  expect_close("out", c.out.f(), want);
  ops::embedding_forward(be, c.ids.t, Tensor{}, positions.t, c.word.t, c.pos.t, Tensor{}, c.kSeq, c.out.t);
  expect_close("out without types", c.out.f(), want_no_type);

  HostTensor r = random({6, 4}, 4);
  for (bool with_type : {true, false}) {
    const Tensor type = with_type ? c.type.t : Tensor{};
    auto loss = [&] {
      ops::embedding_forward(be, c.ids.t, Tensor{}, positions.t, c.word.t, c.pos.t, type, c.kSeq, c.out.t);
      return weighted_sum(c.out, r);
    };
    HostTensor dw = random({7, 4}, 5), dp = random({5, 4}, 6), dt = random({2, 4}, 7);
    HostTensor dw0 = random({7, 4}, 5), dp0 = random({5, 4}, 6), dt0 = random({2, 4}, 7);
    Tensor dtype = with_type ? dt.t : Tensor{};
    ops::embedding_backward(be, r.t, c.ids.t, Tensor{}, positions.t, c.kSeq, dw.t, dp.t, dtype);
    expect_grad("dword", dw.f(), numeric_grad(c.word, loss), 1e-4, dw0.f());
    expect_grad("dpos", dp.f(), numeric_grad(c.pos, loss), 1e-4, dp0.f());
    if (with_type) expect_grad("dtype", dt.f(), numeric_grad(c.type, loss), 1e-4, dt0.f());
  }
  positions.i()[2] = 5;  // past the 5 rows of pos
  EXPECT_EQ(error_of([&] {
              ops::embedding_forward(be, c.ids.t, Tensor{}, positions.t, c.word.t, c.pos.t, c.type.t, c.kSeq,
                                     c.out.t);
            }),
            "position id 5 at token 2 is out of range for 5 position embeddings");
  EXPECT_EQ(error_of([&] {
              ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, Tensor{}, c.kSeq, c.out.t);
            }),
            "embedding_forward: token types given without a type table");
}

// transformers' create_position_ids_from_input_ids: padding keeps the padding index, the
// others count from after it, also where padding sits between tokens.
TEST(OpsEmbedding, PositionIdsAfterPadding) {
  CpuBackend be;
  HostTensor ids = ints({8}, {0, 5, 9, 1, 0, 1, 7, 1}), out(DType::I32, {8});
  ops::position_ids_after_padding(be, ids.t, 1, 4, out.t);
  EXPECT_EQ(std::vector<int32_t>(out.i(), out.i() + 8), (std::vector<int32_t>{2, 3, 4, 1, 2, 1, 3, 1}));
}

TEST(OpsEmbedding, OutOfRangeIdsThrow) {
  CpuBackend be;
  EmbeddingCase c;
  c.ids.i()[4] = 7;
  EXPECT_EQ(error_of([&] {
              ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t);
            }),
            "token id 7 at position 4 is out of range for a vocabulary of 7");
  c.ids.i()[4] = -1;
  EXPECT_THROW(ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t), Error);
  c.ids.i()[4] = 2;
  c.types.i()[1] = 2;
  EXPECT_THROW(ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, c.kSeq, c.out.t), Error);
  HostTensor dw(DType::F32, {7, 4}), dp(DType::F32, {5, 4}), dt(DType::F32, {2, 4});
  EXPECT_THROW(ops::embedding_backward(be, c.out.t, c.ids.t, c.types.t, Tensor{}, c.kSeq, dw.t, dp.t, dt.t), Error);
  // Positions beyond the table: seq 6 needs 6 rows of pos.
  c.types.i()[1] = 1;
  EXPECT_THROW(ops::embedding_forward(be, c.ids.t, c.types.t, Tensor{}, c.word.t, c.pos.t, c.type.t, 6, c.out.t), Error);
}

TEST(OpsEmbedding, GatherAndScatterFirstTokens) {
  CpuBackend be;
  HostTensor hidden = random({6, 4}, 1), first(DType::F32, {2, 4});
  ops::gather_first_tokens(be, hidden.t, 3, first.t);
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(first.f()[h], hidden.f()[h]);
    EXPECT_EQ(first.f()[4 + h], hidden.f()[12 + h]);
  }
  HostTensor dhidden = filled({6, 4}, 9.0f);
  ops::scatter_first_tokens(be, first.t, 3, dhidden.t);
  for (int t = 0; t < 6; ++t)
    for (int h = 0; h < 4; ++h) EXPECT_EQ(dhidden.f()[t * 4 + h], t % 3 == 0 ? hidden.f()[t * 4 + h] : 0.0f);
  HostTensor wrong(DType::F32, {3, 4});
  EXPECT_THROW(ops::gather_first_tokens(be, hidden.t, 3, wrong.t), Error);
}

// Packed rows and back: scatter_rows puts each row where gather_rows took it from and
// zeroes the rest (the padding a packed training step scatters attention's inputs into).
TEST(OpsEmbedding, ScatterRowsUndoesGatherRows) {
  CpuBackend be;
  HostTensor padded = random({6, 4}, 2), rows(DType::I32, {4}), packed(DType::F32, {4, 4});
  const int32_t picked[] = {0, 1, 3, 4};
  std::copy(picked, picked + 4, rows.i());
  ops::gather_rows(be, padded.t, rows.t, packed.t);
  HostTensor back = filled({6, 4}, 9.0f);
  ops::scatter_rows(be, packed.t, rows.t, back.t);
  for (int r = 0; r < 6; ++r)
    for (int h = 0; h < 4; ++h)
      EXPECT_EQ(back.f()[r * 4 + h], r == 2 || r == 5 ? 0.0f : padded.f()[r * 4 + h]) << r << " " << h;
  HostTensor small(DType::F32, {3, 4});
  EXPECT_THROW(ops::scatter_rows(be, packed.t, rows.t, small.t), Error);  // more rows than dst has
  EXPECT_THROW(ops::scatter_rows(be, small.t, rows.t, back.t), Error);    // src is not [rows, W]
}

// ---------------------------------------------------------------------------- ModernBERT's ops

TEST(OpsEmbedding, WithoutPositionTableTheWordRowsAlone) {
  CpuBackend be;
  HostTensor ids = ints({6}, {3, 0, 4, 4, 1, 2}), word = random({5, 4}, 1), out(DType::F32, {6, 4});
  ops::embedding_forward(be, ids.t, Tensor{}, Tensor{}, word.t, Tensor{}, Tensor{}, 3, out.t);
  for (int t = 0; t < 6; ++t)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out.f()[t * 4 + c], word.f()[ids.i()[t] * 4 + c]);
  HostTensor dout = random({6, 4}, 2), dword = filled({5, 4}, 1.0f);
  Tensor none;
  ops::embedding_backward(be, dout.t, ids.t, Tensor{}, Tensor{}, 3, dword.t, none, none);
  for (int c = 0; c < 4; ++c) {
    EXPECT_FLOAT_EQ(dword.f()[4 * 4 + c], 1.0f + dout.f()[2 * 4 + c] + dout.f()[3 * 4 + c]);
    EXPECT_FLOAT_EQ(dword.f()[0 * 4 + c], 1.0f + dout.f()[1 * 4 + c]);
  }
  HostTensor positions = ints({6}, {0, 1, 2, 0, 1, 2});
  EXPECT_NE(error_of([&] {
              ops::embedding_forward(be, ids.t, Tensor{}, positions.t, word.t, Tensor{}, Tensor{}, 3, out.t);
            }).find("position ids given without a pos table"),
            std::string::npos);
}

TEST(OpsLayerNorm, WithoutBiasEqualsAZeroBias) {
  CpuBackend be;
  const int R = 5, C = 9;
  HostTensor x = random({R, C}, 1, 0.0f, 2.0f), g = random({C}, 2, 0.5f, 1.5f), zero = filled({C}, 0.0f);
  HostTensor y(DType::F32, {R, C}), y0(DType::F32, {R, C}), mean(DType::F32, {R}), rstd(DType::F32, {R});
  ops::layernorm_forward(be, x.t, g.t, Tensor{}, 1e-5f, y.t, mean.t, rstd.t);
  ops::layernorm_forward(be, x.t, g.t, zero.t, 1e-5f, y0.t, mean.t, rstd.t);
  expect_same_bits("y", y, y0);
  HostTensor dy = random({R, C}, 3), dx(DType::F32, {R, C}), dx0(DType::F32, {R, C});
  HostTensor dg = filled({C}, 0.0f), dg0 = filled({C}, 0.0f), db0 = filled({C}, 0.0f);
  Tensor no_dbeta;
  ops::layernorm_backward(be, dy.t, x.t, g.t, mean.t, rstd.t, dx.t, dg.t, no_dbeta);
  ops::layernorm_backward(be, dy.t, x.t, g.t, mean.t, rstd.t, dx0.t, dg0.t, db0.t);
  expect_same_bits("dx", dx, dx0);
  expect_same_bits("dgamma", dg, dg0);
  // The fused residual forms too.
  HostTensor res = random({R, C}, 4), sum(DType::F32, {R, C}), sum0(DType::F32, {R, C});
  ops::dropout_add_layernorm_forward(be, x.t, res.t, {}, g.t, Tensor{}, 1e-5f, sum.t, y.t, mean.t, rstd.t);
  ops::dropout_add_layernorm_forward(be, x.t, res.t, {}, g.t, zero.t, 1e-5f, sum0.t, y0.t, mean.t, rstd.t);
  expect_same_bits("fused y", y, y0);
  HostTensor dxd(DType::F32, {R, C}), dxd0(DType::F32, {R, C});
  ops::layernorm_dropout_backward(be, dy.t, sum.t, g.t, mean.t, rstd.t, {}, dx.t, dxd.t, dg.t, no_dbeta);
  ops::layernorm_dropout_backward(be, dy.t, sum0.t, g.t, mean.t, rstd.t, {}, dx0.t, dxd0.t, dg0.t, db0.t);
  expect_same_bits("fused dsum", dx, dx0);
  expect_same_bits("fused dx", dxd, dxd0);
}

// A [T, 3 heads d] qkv turned in place by the angles pos * theta^(-2i/d).
TEST(OpsRotary, TurnsQueryAndKeyAsTheFormulaAndInverseUndoesIt) {
  CpuBackend be;
  const int seq = 5, batch = 2, heads = 2, d = 6, half = d / 2, T = seq * batch, W = 3 * heads * d;
  const float theta = 500.0f;
  for (bool given_rows : {false, true}) {
    HostTensor qkv = random({T, W}, 1), orig = clone(qkv);
    HostTensor rows = ints({T}, {7, 3, 0, 9, 4, 1, 2, 8, 6, 5});
    ops::rotary(be, qkv.t, given_rows ? rows.t : Tensor{}, seq, heads, d, theta, false);
    for (int t = 0; t < T; ++t) {
      const int pos = (given_rows ? rows.i()[t] : t) % seq;
      for (int h = 0; h < 3 * heads; ++h)
        for (int i = 0; i < d; ++i) {
          const int at = t * W + h * d + i;
          if (h >= 2 * heads) {  // values are not turned
            EXPECT_EQ(qkv.f()[at], orig.f()[at]);
            continue;
          }
          const int k = i % half;
          const double angle = pos * std::pow(double(theta), -2.0 * k / d);
          const double x1 = orig.f()[t * W + h * d + k], x2 = orig.f()[t * W + h * d + k + half];
          const double want = i < half ? x1 * std::cos(angle) - x2 * std::sin(angle)
                                       : x2 * std::cos(angle) + x1 * std::sin(angle);
          EXPECT_NEAR(qkv.f()[at], want, 2e-6) << "token " << t << " head " << h << " element " << i;
        }
    }
    // The rotation is orthogonal: its inverse is its transpose, so it is also the backward.
    ops::rotary(be, qkv.t, given_rows ? rows.t : Tensor{}, seq, heads, d, theta, true);
    for (int64_t i = 0; i < qkv.n(); ++i) EXPECT_NEAR(qkv.f()[i], orig.f()[i], 2e-6);
  }
  HostTensor odd = random({4, 3 * 2 * 5}, 1);
  EXPECT_NE(error_of([&] { ops::rotary(be, odd.t, Tensor{}, 2, 2, 5, theta, false); }).find("head_dim even"),
            std::string::npos);
}

TEST(OpsElementwise, GatedActivationMatchesReferenceAndFiniteDifferences) {
  CpuBackend be;
  const int R = 3, I = 5;
  for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
    HostTensor x = random({R, 2 * I}, 1, -2.0f, 2.0f), y(DType::F32, {R, I}), r = random({R, I}, 2);
    ops::gated_activation_forward(be, a, x.t, y.t);
    std::vector<double> want(R * I);
    for (int row = 0; row < R; ++row)
      for (int c = 0; c < I; ++c)
        want[row * I + c] = act_ref(a, x.f()[row * 2 * I + c]) * x.f()[row * 2 * I + I + c];
    expect_close(fmt::format("y ({})", int(a)), y.f(), want, 1e-5);
    auto loss = [&] {
      ops::gated_activation_forward(be, a, x.t, y.t);
      return weighted_sum(y, r);
    };
    HostTensor dx(DType::F32, {R, 2 * I});
    ops::gated_activation_backward(be, a, r.t, x.t, dx.t);
    expect_grad(fmt::format("dx ({})", int(a)), dx.f(), numeric_grad(x, loss, 1e-3f));
  }
  HostTensor odd(DType::F32, {2, 5}), y(DType::F32, {2, 2});
  EXPECT_THROW(ops::gated_activation_forward(be, Activation::Gelu, odd.t, y.t), Error);
}

TEST(OpsEmbedding, MeanPoolOverTheAttendedTokens) {
  CpuBackend be;
  const int B = 3, S = 4, H = 5;
  HostTensor hidden = random({B * S, H}, 1), mask = ints({B, S}, {1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1});
  HostTensor out(DType::F32, {B, H}), r = random({B, H}, 2);
  ops::mean_pool_forward(be, hidden.t, mask.t, out.t);
  std::vector<double> want(B * H);
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < H; ++c) {
      double sum = 0, n = 0;
      for (int s = 0; s < S; ++s)
        if (mask.i()[b * S + s]) sum += hidden.f()[(b * S + s) * H + c], n += 1;
      want[b * H + c] = sum / n;
    }
  expect_close("pooled", out.f(), want, 1e-6);
  auto loss = [&] {
    ops::mean_pool_forward(be, hidden.t, mask.t, out.t);
    return weighted_sum(out, r);
  };
  HostTensor dhidden = filled({B * S, H}, 7.0f);  // overwritten, padding rows included
  ops::mean_pool_backward(be, r.t, mask.t, dhidden.t);
  expect_grad("dhidden", dhidden.f(), numeric_grad(hidden, loss));
  for (int c = 0; c < H; ++c) EXPECT_EQ(dhidden.f()[3 * H + c], 0.0f);
  HostTensor wrong(DType::F32, {B, H + 1});
  EXPECT_THROW(ops::mean_pool_forward(be, hidden.t, mask.t, wrong.t), Error);
  // Packed, each sequence's attended rows alone: the padded mean bit for bit.
  HostTensor packed(DType::F32, {8, H}), row_start = ints({B + 1}, {0, 3, 4, 8}), out_packed(DType::F32, {B, H});
  int64_t at = 0;
  for (int t = 0; t < B * S; ++t)
    if (mask.i()[t]) std::copy(hidden.f() + t * H, hidden.f() + (t + 1) * H, packed.f() + H * at++);
  ops::mean_pool_forward(be, hidden.t, mask.t, out.t);
  ops::mean_pool_packed(be, packed.t, row_start.t, out_packed.t);
  expect_same_bits("packed mean", out_packed, out);
}

// ---------------------------------------------------------------------------- loss

TEST(OpsLoss, CrossEntropyMatchesReferenceAndFiniteDifferences) {
  CpuBackend be;
  const float scale = 0.5f;
  HostTensor logits = random({4, 5}, 1, -2.0f, 2.0f), labels = ints({4}, {1, -100, 4, 0});
  HostTensor loss(DType::F32, {1}), dlogits = filled({4, 5}, 3.0f);
  ops::cross_entropy(be, logits.t, labels.t, scale, nullptr, loss.t, dlogits.t);
  double want = 0;
  for (int r : {0, 2, 3}) {
    double z = 0;
    for (int c = 0; c < 5; ++c) z += std::exp(double(logits.f()[r * 5 + c]));
    want += (std::log(z) - logits.f()[r * 5 + labels.i()[r]]) / 3;
  }
  EXPECT_NEAR(loss.f()[0], want, 1e-6 * want);
  HostTensor scratch_loss(DType::F32, {1}), scratch_grad(DType::F32, {4, 5});
  auto f = [&] {
    ops::cross_entropy(be, logits.t, labels.t, scale, nullptr, scratch_loss.t, scratch_grad.t);
    return double(scratch_loss.f()[0]) * scale;
  };
  expect_grad("dlogits", dlogits.f(), numeric_grad(logits, f, 1e-2f));
  for (int c = 0; c < 5; ++c) EXPECT_EQ(dlogits.f()[5 + c], 0.0f);
}

TEST(OpsLoss, CrossEntropyEdgeCases) {
  CpuBackend be;
  HostTensor logits = random({2, 3}, 1), loss = filled({1}, 7.0f), dlogits = filled({2, 3}, 7.0f);
  HostTensor ignored = ints({2}, {-100, -100});
  ops::cross_entropy(be, logits.t, ignored.t, 1.0f, nullptr, loss.t, dlogits.t);
  EXPECT_EQ(loss.f()[0], 0.0f);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dlogits.f()[i], 0.0f);
  HostTensor bad = ints({2}, {0, 3});
  EXPECT_EQ(error_of([&] { ops::cross_entropy(be, logits.t, bad.t, 1.0f, nullptr, loss.t, dlogits.t); }),
            "cross_entropy: label 3 of row 1 is out of range for 3 classes");
}

TEST(OpsLoss, MseMatchesReferenceAndFiniteDifferences) {
  CpuBackend be;
  for (Shape s : {Shape{5, 1}, Shape{5}}) {
    HostTensor pred = random(s, 1), target = random({5}, 2), loss(DType::F32, {1}), dpred(DType::F32, s);
    ops::mse(be, pred.t, target.t, 2.0f, nullptr, loss.t, dpred.t);
    double want = 0;
    for (int i = 0; i < 5; ++i) want += std::pow(double(pred.f()[i]) - target.f()[i], 2) / 5;
    EXPECT_NEAR(loss.f()[0], want, 1e-6 * want);
    HostTensor scratch_loss(DType::F32, {1}), scratch_grad(DType::F32, s);
    auto f = [&] {
      ops::mse(be, pred.t, target.t, 2.0f, nullptr, scratch_loss.t, scratch_grad.t);
      return 2.0 * scratch_loss.f()[0];
    };
    expect_grad("dpred", dpred.f(), numeric_grad(pred, f));
  }
  HostTensor pred = random({5, 2}, 1), target = random({5}, 2), loss(DType::F32, {1}), dpred(DType::F32, {5, 2});
  EXPECT_THROW(ops::mse(be, pred.t, target.t, 1.0f, nullptr, loss.t, dpred.t), Error);
}

// ---------------------------------------------------------------------------- optimizer

TEST(OpsOptimizer, SumSquaresAccumulatesAndClipCoefficient) {
  CpuBackend be;
  HostTensor a = filled({3}, 2.0f), sumsq = filled({1}, 0.0f), coef(DType::F32, {kNormCoefSize});
  a.f()[0] = 1;                              // 9
  HostTensor b = filled({1000}, 0.5f);       // 250
  ops::sum_squares(be, a.t, sumsq.t);
  ops::sum_squares(be, b.t, sumsq.t);
  EXPECT_FLOAT_EQ(sumsq.f()[0], 259.0f);
  // Lengths past and between the pass's eight running sums per thread.
  for (const int n : {7, 8, 1003}) {
    HostTensor r = random({n}, n), sum = filled({1}, 0.0f);
    double want = 0;
    for (int i = 0; i < n; ++i) want += double(r.f()[i]) * r.f()[i];
    ops::sum_squares(be, r.t, sum.t);
    EXPECT_EQ(sum.f()[0], float(want)) << n;
  }

  HostTensor nine = filled({1}, 9.0f);
  ops::clip_coefficient(be, nine.t, 1.0f, coef.t);
  EXPECT_FLOAT_EQ(coef.f()[0], 3.0f);
  EXPECT_FLOAT_EQ(coef.f()[1], float(1.0 / (3.0 + 1e-6)));
  ops::clip_coefficient(be, nine.t, 10.0f, coef.t);
  EXPECT_EQ(coef.f()[1], 1.0f);
  ops::clip_coefficient(be, nine.t, 0.0f, coef.t);
  EXPECT_EQ(coef.f()[1], 1.0f);
  EXPECT_FLOAT_EQ(coef.f()[0], 3.0f);
  HostTensor tiny = filled({1}, 1e-12f);  // norm 1e-6: the 1e-6 guard halves the coefficient
  ops::clip_coefficient(be, tiny.t, 1e-6f, coef.t);
  EXPECT_NEAR(coef.f()[1], 0.5f, 1e-5);
}

TEST(OpsOptimizer, AdamWTwoStepsMatchHandComputedReference) {
  CpuBackend be;
  const int n = 7;
  HostTensor p = random({n}, 1), m = filled({n}, 0.0f), v = filled({n}, 0.0f), coef = test::norm_coef(0.0f);
  std::vector<double> rp(p.f(), p.f() + n), rm(n, 0.0), rv(n, 0.0);
  // The float hyperparameters AdamWStep carries, widened.
  const double lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
  for (int step = 1; step <= 2; ++step) {
    HostTensor g = random({n}, 10 + step);
    coef.f()[1] = step == 1 ? 0.5f : 1.0f;  // the first step is clipped
    AdamWStep s{float(lr), float(b1), float(b2), float(eps), float(wd), step};
    ops::adamw(be, p.t, g.t, m.t, v.t, s, coef.t);
    // The textbook form: bias-corrected moments, decoupled decay.
    for (int i = 0; i < n; ++i) {
      const double gi = double(g.f()[i]) * coef.f()[1];
      rp[i] -= lr * wd * rp[i];
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      const double mhat = rm[i] / (1 - std::pow(b1, step)), vhat = rv[i] / (1 - std::pow(b2, step));
      rp[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    expect_close("param step " + std::to_string(step), p.f(), rp, 1e-5);
    expect_close("m step " + std::to_string(step), m.f(), rm, 1e-5);
    expect_close("v step " + std::to_string(step), v.f(), rv, 1e-5);
  }
}

// The multi-tensor ops (one call for many parameter groups, each with its own weight
// decay; lists longer than one backend call are split) equal one call per tensor.
TEST(OpsOptimizer, TensorListsEqualOneCallPerTensor) {
  CpuBackend be;
  const int count = kMaxTensorList + 5;
  std::vector<HostTensor> p, g, m, v, p1, m1, v1;
  std::vector<AdamWSlice> slices;
  std::vector<Tensor> grads;
  HostTensor coef = test::norm_coef(0.7f);
  for (int t = 0; t < count; ++t) {
    const int64_t n = 1 + t * 3;
    p.push_back(random({n}, uint64_t(t)));
    p1.push_back(random({n}, uint64_t(t)));
    g.push_back(random({n}, uint64_t(100 + t)));
    for (auto* list : {&m, &v, &m1, &v1}) list->push_back(filled({n}, 0.01f));
  }
  for (int t = 0; t < count; ++t) {
    slices.push_back({p[size_t(t)].t, g[size_t(t)].t, m[size_t(t)].t, v[size_t(t)].t, t % 2 ? 0.0 : 0.1, Tensor{}});
    grads.push_back(g[size_t(t)].t);
  }
  const AdamWStep s{.lr = 0.01, .step = 3};
  ops::adamw(be, slices.data(), count, s, coef.t);
  HostTensor sum_list = filled({1}, 0.0f), sum_each = filled({1}, 0.0f);
  ops::sum_squares(be, grads.data(), count, sum_list.t);
  for (int t = 0; t < count; ++t) {
    AdamWStep one = s;
    one.weight_decay = t % 2 ? 0.0 : 0.1;
    ops::adamw(be, p1[size_t(t)].t, g[size_t(t)].t, m1[size_t(t)].t, v1[size_t(t)].t, one, coef.t);
    ops::sum_squares(be, g[size_t(t)].t, sum_each.t);
    for (int64_t i = 0; i < p[size_t(t)].n(); ++i) {
      EXPECT_EQ(p[size_t(t)].f()[i], p1[size_t(t)].f()[i]) << t;
      EXPECT_EQ(v[size_t(t)].f()[i], v1[size_t(t)].f()[i]) << t;
    }
  }
  EXPECT_NEAR(sum_list.f()[0], sum_each.f()[0], 1e-6 * sum_each.f()[0]);
}

TEST(OpsOptimizer, AdamWFirstStepMovesByLearningRate) {
  // With zero moments, step 1 moves each weight by lr * sign(g) after decay.
  CpuBackend be;
  HostTensor p = filled({2}, 1.0f), g = filled({2}, 0.0f), m = filled({2}, 0.0f), v = filled({2}, 0.0f);
  g.f()[0] = 3.0f, g.f()[1] = -0.01f;
  HostTensor coef = test::norm_coef(1.0f);
  ops::adamw(be, p.t, g.t, m.t, v.t, {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1}, coef.t);
  EXPECT_NEAR(p.f()[0], 0.95f - 0.1f, 1e-6);
  EXPECT_NEAR(p.f()[1], 0.95f + 0.1f, 1e-5);
}

// GradScaler's semantics on the reference: gradients come in multiplied by the scale;
// the norm and the coefficient undo it; an overflow flags the step and halves the scale;
// growth_interval clean steps double it.
TEST(OpsOptimizer, ClipCoefficientUnscalesAndUpdatesTheLossScale) {
  CpuBackend be;
  const LossScaling ls{65536.0f, 2.0f, 0.5f, 2};
  HostTensor coef(DType::F32, {kNormCoefSize}), scaler = filled({kScalerSize}, 0.0f);
  scaler.f()[0] = 4.0f;
  HostTensor sumsq = filled({1}, 16.0f);  // scaled norm 4: true norm 1
  ops::clip_coefficient(be, sumsq.t, 0.5f, coef.t, &scaler.t, ls);
  EXPECT_FLOAT_EQ(coef.f()[0], 1.0f);
  EXPECT_FLOAT_EQ(coef.f()[1], float(0.5 / (1.0 + 1e-6) / 4.0));
  EXPECT_EQ(coef.f()[2], 0.0f);
  EXPECT_EQ(scaler.f()[0], 4.0f);  // one clean step of two
  EXPECT_EQ(scaler.f()[1], 1.0f);
  ops::clip_coefficient(be, sumsq.t, 10.0f, coef.t, &scaler.t, ls);
  EXPECT_FLOAT_EQ(coef.f()[1], 0.25f);  // no clipping: just the unscaling
  EXPECT_EQ(scaler.f()[0], 8.0f);       // the second: the scale grows
  EXPECT_EQ(scaler.f()[1], 0.0f);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    HostTensor overflow = filled({1}, bad);
    scaler.f()[1] = 1.0f;
    const float before = scaler.f()[0];
    ops::clip_coefficient(be, overflow.t, 1.0f, coef.t, &scaler.t, ls);
    EXPECT_EQ(coef.f()[2], 1.0f) << bad;
    EXPECT_EQ(scaler.f()[0], before / 2) << bad;
    EXPECT_EQ(scaler.f()[1], 0.0f) << bad;
  }
  // Without a scaler a non-finite norm is not a skip: it reaches the loss, as in fp32 torch.
  HostTensor overflow = filled({1}, std::numeric_limits<float>::infinity());
  ops::clip_coefficient(be, overflow.t, 1.0f, coef.t);
  EXPECT_EQ(coef.f()[2], 0.0f);
}

TEST(OpsOptimizer, AdamWSkipsAFlaggedStepAndWritesTheHalfCopy) {
  CpuBackend be;
  const int n = 9;
  HostTensor p = random({n}, 1), g = random({n}, 2), m = filled({n}, 0.0f), v = filled({n}, 0.0f);
  const std::vector<float> p0(p.f(), p.f() + n);
  std::vector<uint16_t> half(n, 0);
  AdamWSlice slice{p.t, g.t, m.t, v.t, 0.01, Tensor{half.data(), DType::BF16, {n}, Device::CPU}};
  HostTensor coef = test::norm_coef(1.0f);
  coef.f()[2] = 1.0f;  // skipped
  ops::adamw(be, &slice, 1, {.lr = 0.1, .step = 1}, coef.t);
  EXPECT_EQ(std::vector<float>(p.f(), p.f() + n), p0);
  for (int i = 0; i < n; ++i) EXPECT_EQ(m.f()[i], 0.0f);
  EXPECT_EQ(half, std::vector<uint16_t>(n, 0));
  coef.f()[2] = 0.0f;
  ops::adamw(be, &slice, 1, {.lr = 0.1, .step = 1}, coef.t);
  for (int i = 0; i < n; ++i) {
    EXPECT_NE(p.f()[i], p0[size_t(i)]);
    EXPECT_EQ(half[size_t(i)], float_to_bf16(p.f()[i])) << i;
  }
}

// The vectorised update equals the same formula computed one element at a time, bit for
// bit, for every kind of rounded copy and for lengths that leave vector tails; a NaN
// parameter's bf16 copy is float_to_bf16's quiet NaN.
TEST(OpsOptimizer, AdamWEqualsTheScalarFormulaBitForBit) {
  CpuBackend be;
  // Past two pages (1024 floats), the second never touched (zero gradient and moments,
  // as a word embedding's unused rows): its moments are left alone, to the same bits, and
  // without weight decay its parameters too.
  // The second moments span 2^-100 .. 2^50 and the steps give bias corrections from
  // 0.04 to near 1, so that sqrt(v) / bias2_sqrt (a product and two FMAs there) meets many
  // quotients and binades. The thread counts split the three pages every way a thread's
  // walk over the two halves of its range can go (none, one, two or three pages a thread).
  const int n = 3003;
  const int threads_before = omp_get_max_threads();
  for (const int threads : {1, 2, 3, 5})
  for (const int64_t step : {int64_t(2), int64_t(4), int64_t(1000)})
  for (const double wd : {0.01, 0.0})
  for (DType half_type : {DType::F32, DType::BF16, DType::F16}) {
    HostTensor p = random({n}, 3), g = random({n}, 4), m = random({n}, 5), v = random({n}, 6);
    for (int i = 0; i < n; ++i) v.f()[i] = std::ldexp(std::abs(v.f()[i]), i % 151 - 100);
    for (int i = 1024; i < 2048; ++i) g.f()[i] = m.f()[i] = v.f()[i] = 0.0f;
    g.f()[7] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> p0(p.f(), p.f() + n), g0(g.f(), g.f() + n), m0(m.f(), m.f() + n), v0(v.f(), v.f() + n);
    omp_set_num_threads(threads);
    // The rounded copy 16-byte aligned, or (step 4) 2 bytes past it, as a slice of a larger one may lie.
    std::vector<uint16_t> buffer(n + 8, 0);
    uint16_t* half = buffer.data() + (step == 4 ? 1 : 0);
    const bool with_half = half_type != DType::F32;
    AdamWSlice slice{p.t, g.t, m.t, v.t, wd, with_half ? Tensor{half, half_type, {n}, Device::CPU} : Tensor{}};
    HostTensor coef = test::norm_coef(0.8f);
    const AdamWStep s{.lr = 1e-3, .weight_decay = 0.01, .step = step};
    ops::adamw(be, &slice, 1, s, coef.t);
    const AdamWScalars k = adamw_scalars(s);
    for (int i = 0; i < n; ++i) {
      const float gi = g0[size_t(i)] * coef.f()[1];
      float pi = p0[size_t(i)] * (wd == 0 ? 1.0f : k.decay);
      const float mi = m0[size_t(i)] + k.w1 * (gi - m0[size_t(i)]);
      const float vi = v0[size_t(i)] * k.b2 + k.w2 * gi * gi;
      pi -= k.step_size * (mi / (std::sqrt(vi) / k.bias2_sqrt + k.eps));
      const auto bits = [](float x) { uint32_t b; std::memcpy(&b, &x, 4); return b; };
      ASSERT_EQ(bits(p.f()[i]), bits(pi)) << dtype_name(half_type) << " weight decay " << wd << " step " << step
                                          << " threads " << threads << " " << i;
      ASSERT_EQ(bits(m.f()[i]), bits(mi)) << i;
      ASSERT_EQ(bits(v.f()[i]), bits(vi)) << i;
      if (half_type == DType::BF16) {
        ASSERT_EQ(half[i], float_to_bf16(pi)) << i;
      } else if (half_type == DType::F16) {
        ASSERT_EQ(half[i], float_to_f16(pi)) << i;
      }
    }
    EXPECT_TRUE(std::isnan(p.f()[7]));
  }
  omp_set_num_threads(threads_before);
}

// The update's sqrt(v) / bias2_sqrt, a product and two FMAs, has the division's bits: every
// 997th float from 2^-75 (below the square root of the least positive float) to 2^64 (above
// that of the greatest), and 0, inf and NaN, at the bias corrections of several betas and steps.
TEST(OpsOptimizer, RoundedQuotientHasTheDivisionsBits) {
  const auto bits = [](float x) { return std::bit_cast<uint32_t>(x); };
  for (const double beta2 : {0.95, 0.999, 0.9999, 0.99999})
    for (const int64_t step : {int64_t(1), int64_t(2), int64_t(10), int64_t(1000), int64_t(100000)}) {
      const float b = adamw_scalars(AdamWStep{.beta2 = beta2, .step = step}).bias2_sqrt, y = 1.0f / b;
      for (uint32_t i = 0x1A000000u; i <= 0x5F800000u; i += 997) {
        const float s = std::bit_cast<float>(i);
        ASSERT_EQ(bits(cpu::rounded_quotient(s, b, y)), bits(s / b)) << s << " / " << b;
      }
      for (const float s : {0.0f, std::numeric_limits<float>::infinity()})
        EXPECT_EQ(bits(cpu::rounded_quotient(s, b, y)), bits(s / b)) << s;
      EXPECT_TRUE(std::isnan(cpu::rounded_quotient(std::numeric_limits<float>::quiet_NaN(), b, y)));
    }
}

// ---------------------------------------------------------------------------- dry run

TEST(OpsDryRun, ChecksShapesButTouchesNothing) {
  CpuBackend be;
  be.dry_run = true;
  HostTensor x = random({4, 3}, 1), w = random({5, 3}, 2), y = filled({4, 5}, 7.0f);
  ops::linear_forward(be, x.t, w.t, nullptr, y.t);
  HostTensor dw = filled({5, 3}, 7.0f);
  ops::linear_backward(be, y.t, x.t, w.t, nullptr, false, dw.t, nullptr);
  ops::fill(be, y.t, 1.0f);
  HostTensor p = filled({3}, 7.0f), m = filled({3}, 7.0f), v = filled({3}, 7.0f), coef = test::norm_coef(1.0f);
  ops::adamw(be, p.t, p.t, m.t, v.t, {0.1f}, coef.t);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(y.f()[i], 7.0f);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(dw.f()[i], 7.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.f()[i], 7.0f);
  // The planner's tensors have no memory: nothing may be read, ids included.
  AttentionDims d{2, 5, 3, 4, 0.5f};
  Tensor qkv{nullptr, DType::F32, {10, 36}}, mask{nullptr, DType::I32, {2, 5}};
  Tensor stats{nullptr, DType::F32, {2, 3, 5, 2}}, ctx{nullptr, DType::F32, {10, 12}};
  Tensor work{nullptr, DType::F32, {be.attention_workspace_elems(d, DType::F32)}};
  Tensor keep;
  ops::attention_forward(be, qkv, mask, d, {0.1f, 1, 2}, stats, keep, ctx, work);
  ops::attention_backward(be, ctx, qkv, ctx, mask, stats, keep, d, {0.1f, 1, 2}, qkv, work);
  Tensor ids{nullptr, DType::I32, {10}}, word{nullptr, DType::F32, {50, 12}}, pos{nullptr, DType::F32, {8, 12}};
  Tensor type{nullptr, DType::F32, {2, 12}};
  ops::embedding_forward(be, ids, ids, Tensor{}, word, pos, type, 5, ctx);
  ops::embedding_backward(be, ctx, ids, ids, Tensor{}, 5, word, pos, type);
  // Planned tensors may look aliased (here all are null): only real memory is checked.
  Tensor row_stats{nullptr, DType::F32, {10}}, norm_params{nullptr, DType::F32, {12}};
  ops::dropout_add_layernorm_forward(be, ctx, ctx, {0.1f, 1, 2}, norm_params, norm_params, 1e-5f, ctx, ctx, row_stats,
                                     row_stats);
  ops::layernorm_dropout_backward(be, ctx, ctx, norm_params, row_stats, row_stats, {0.1f, 1, 2}, ctx, ctx,
                                  norm_params, norm_params);
  // Shapes are still checked.
  HostTensor y_bad = filled({4, 6}, 7.0f);
  EXPECT_THROW(ops::linear_forward(be, x.t, w.t, nullptr, y_bad.t), Error);
}

}  // namespace
}  // namespace hone

namespace hone {
namespace {

// The CPU's cast rounds to bf16 and fp16 as dtype.h's host rounding does (to nearest even:
// ties, the half-way cases, and values past fp16's range), and copies to F32.
TEST(CpuCast, RoundsToHalfPrecisionAsTheHostRoundingDoes) {
  CpuBackend be;
  std::vector<float> x = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, 3.14159f, -2.7e-3f, 65504.0f, 70000.0f,
                          1e-8f, std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 1000; ++i) x.push_back(std::sin(float(i)) * std::pow(10.0f, float(i % 9 - 4)));
  Tensor src{x.data(), DType::F32, Shape{int64_t(x.size())}, Device::CPU};
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> y(x.size());
    Tensor dst{y.data(), t, Shape{int64_t(y.size())}, Device::CPU};
    ops::cast(be, src, dst);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(y[i], t == DType::BF16 ? float_to_bf16(x[i]) : float_to_f16(x[i])) << dtype_name(t) << " of " << x[i];
  }
  std::vector<float> same(x.size());
  Tensor f32{same.data(), DType::F32, Shape{int64_t(same.size())}, Device::CPU};
  ops::cast(be, src, f32);
  EXPECT_EQ(std::memcmp(same.data(), x.data(), x.size() * sizeof(float)), 0);
  std::vector<int32_t> ints(x.size());
  Tensor bad{ints.data(), DType::I32, Shape{int64_t(ints.size())}, Device::CPU};
  EXPECT_THROW(ops::cast(be, src, bad), Error);
}

// OpenBLAS picks its kernels from tables of CPU models, and a CPU newer than them gets
// generic SSE3 kernels; a CpuBackend selects the ones its vector instructions allow.
TEST(CpuBlas, KernelsMatchTheCpusVectorInstructions) {
  CpuBackend be;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "no AVX2 and FMA: OpenBLAS's generic kernels are this CPU's";
  const std::string kernels = blas_kernels();
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Unknown"}) EXPECT_NE(kernels, generic);
}

}  // namespace
}  // namespace hone
