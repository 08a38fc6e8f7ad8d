// The fused (flash) BF16/F16 attention of the CUDA backend against its unfused F32 path on
// the same inputs, which are representable in the half type so that both sides see the same
// numbers: outputs and gradients with padding, then the dropout contract (same DropoutSpec,
// same mask; forward and backward agree on it; another stream or seed, another mask; the
// mask is unbiased). flash_attention_gpu_test.cpp checks it against the CPU reference,
// masks included. Skips, saying why, without a GPU or on a GPU older than SM 8.0; in a build
// without cuDNN it checks that HONE_ATTENTION=cudnn fails clearly.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "hone/backend.h"
#include "hone/cuda.h"
#include "hone/dtype.h"
#include "hone/error.h"
#include "hone/trainer.h"
#include "device_tensor.h"
#include "gpu/small_bert.h"
#include "test_util.h"

namespace hone {
namespace {

// Tolerances, as ||fused - fp32|| / ||fp32|| over a whole output. Inputs are exact in both
// paths, so the difference is the fused path's rounding: its outputs are stored in the half
// type (unit roundoff 2^-9 = 2e-3 in bf16, 2^-11 = 4.9e-4 in fp16), and so are the
// probabilities and dS before their products. A few such roundings, random in sign, give
// 2e-3 to 4e-3 in bf16 and 4 times less in fp16; the bounds leave a factor of 2.5 to 3.
double tolerance(DType t) { return t == DType::BF16 ? 1e-2 : 3e-3; }
const char* label(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

using test::DeviceTensor;
using test::round_all;
using test::round_to;

std::vector<float> uniform(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(g);
  return v;
}

struct Problem {
  AttentionDims d;
  std::vector<int> lengths;  // valid (unpadded) keys of each sequence: a right-padded mask
  int64_t tokens() const { return int64_t(d.batch) * d.seq; }
  int64_t hidden() const { return d.hidden(); }
  std::string str() const {
    return fmt::format("B={} S={} heads={} head_dim={} lengths={}", d.batch, d.seq, d.heads, d.head_dim,
                       fmt::join(lengths, ","));
  }
};

Problem problem(int batch, int seq, int heads, int head_dim, std::vector<int> lengths) {
  return {{batch, seq, heads, head_dim, 1.0f / std::sqrt(float(head_dim))}, std::move(lengths)};
}

// qkv [B*S, 3H]: Q and K uniform in [-qk, qk], V in [v_lo, v_hi].
std::vector<float> make_qkv(const Problem& p, uint64_t seed, float qk, float v_lo, float v_hi) {
  const int64_t T = p.tokens(), H = p.hidden();
  const std::vector<float> a = uniform(T * 2 * H, seed, -qk, qk), b = uniform(T * H, seed + 1, v_lo, v_hi);
  std::vector<float> qkv(size_t(T * 3 * H));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(a.begin() + t * 2 * H, 2 * H, qkv.begin() + t * 3 * H);
    std::copy_n(b.begin() + t * H, H, qkv.begin() + t * 3 * H + 2 * H);
  }
  return qkv;
}

// One attention call site on the device, in one compute dtype: F32 runs the unfused path,
// BF16/F16 the fused one. Outputs start as NaN, so an element never written shows.
class Attention {
 public:
  Attention(Backend& be, DType t, const Problem& p)
      : be_(be),
        t_(t),
        p_(p),
        qkv_(be, t, Shape{p.tokens(), 3 * p.hidden()}),
        mask_(be, DType::I32, Shape{p.d.batch, p.d.seq}),
        dctx_(be, t, Shape{p.tokens(), p.hidden()}),
        stats_(be, DType::F32, Shape{p.d.batch, p.d.heads, p.d.seq, 2}),
        ctx_(be, t, Shape{p.tokens(), p.hidden()}),
        dqkv_(be, t, Shape{p.tokens(), 3 * p.hidden()}),
        work_(be, DType::F32, Shape{be.attention_workspace_elems(p.d, t)}),
        keep_(be, DType::I32, Shape{p.d.batch, p.d.heads, p.d.seq, std::max(be.attention_keep_words(p.d, t), 1)}) {
    std::vector<int32_t> mask(size_t(p.tokens()));
    for (int b = 0; b < p.d.batch; ++b)
      for (int j = 0; j < p.d.seq; ++j) mask[size_t(b) * p.d.seq + j] = j < p.lengths[size_t(b)];
    mask_.upload_bytes(mask.data());
    for (DeviceTensor* x : {&stats_, &ctx_, &dqkv_, &work_}) x->mark_unwritten();
  }

  void forward(const std::vector<float>& qkv, const DropoutSpec& drop) {
    qkv_.upload(qkv);
    run_forward(drop);
  }
  // With the qkv of the last forward, and its stats.
  void backward(const std::vector<float>& dctx, const DropoutSpec& drop) {
    dctx_.upload(dctx);
    run_backward(drop);
  }
  // The backend calls alone, on the inputs already uploaded (for timing).
  void run_forward(const DropoutSpec& drop) {
    be_.attention_forward(qkv_.t, mask_.t, p_.d, drop, stats_.t, keep_.t, ctx_.t, work_.t);
  }
  void run_backward(const DropoutSpec& drop) {
    be_.attention_backward(dctx_.t, qkv_.t, ctx_.t, mask_.t, stats_.t, keep_.t, p_.d, drop, dqkv_.t, work_.t);
  }
  std::vector<float> ctx() const { return ctx_.download(); }
  std::vector<float> dqkv() const { return dqkv_.download(); }
  // The log-sum-exp of each query row's scores, from the {max, 1 / sum} both paths keep
  // (the fused path's max in base-2 units).
  std::vector<float> lse() const {
    const std::vector<float> s = stats_.download();
    const size_t rows = s.size() / 2;
    std::vector<float> out(rows);
    for (size_t r = 0; r < rows; ++r)
      out[r] = t_ == DType::F32 ? float(double(s[2 * r]) - std::log(double(s[2 * r + 1])))
                                : float((double(s[2 * r]) - std::log2(double(s[2 * r + 1]))) * std::log(2.0));
    return out;
  }

 private:
  Backend& be_;
  DType t_;
  Problem p_;
  DeviceTensor qkv_, mask_, dctx_, stats_, ctx_, dqkv_, work_, keep_;  // keep_: the flash kernels' mask bits (unused by cuDNN)
};

// Columns [c0, c1) of row-major [rows, cols] matrices: ||got - want|| / ||want||, and the
// largest element error relative to the largest |want| (catches a few bad rows that a norm
// hides). NaN counts as infinitely wrong.
struct Diff {
  double norm = 0, worst = 0;
};

Diff compare(const std::vector<float>& got, const std::vector<float>& want, int64_t cols, int64_t c0, int64_t c1) {
  double num = 0, den = 0, worst = 0, scale = 0;
  for (size_t r = 0; r * size_t(cols) < want.size(); ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const size_t i = r * size_t(cols) + size_t(c);
      double e = std::fabs(double(got[i]) - want[i]);
      if (std::isnan(e)) e = INFINITY;
      num += e * e, den += double(want[i]) * want[i];
      worst = std::max(worst, e), scale = std::max(scale, std::fabs(double(want[i])));
    }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), scale > 0 ? worst / scale : worst};
}

void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                  int64_t cols, int64_t c0, int64_t c1, double tol) {
  const Diff e = compare(got, want, cols, c0, c1);
  std::printf("  %-48s rel. error %.2e, worst element %.2e of max\n", what.c_str(), e.norm, e.worst);
  EXPECT_LE(e.norm, tol) << what;
  // One element may carry a few roundings of values near the largest: 5 tolerances.
  EXPECT_LE(e.worst, 5 * tol) << what;
}

double dot(const std::vector<float>& a, const std::vector<float>& b, int64_t cols, int64_t c0, int64_t c1) {
  double s = 0;
  for (size_t r = 0; r * size_t(cols) < a.size(); ++r)
    for (int64_t c = c0; c < c1; ++c) s += double(a[r * size_t(cols) + size_t(c)]) * b[r * size_t(cols) + size_t(c)];
  return s;
}

// The CUDA backend needs SM 8.0 or newer, as the fused path does.
using GpuBackend = test::GpuTest;
using FusedAttention = GpuBackend;

// --------------------------------------------------------------------- without cuDNN

TEST(CudnnAttentionWithoutCudnn, FailsClearly) {
#ifdef HONE_HAVE_CUDNN
  GTEST_SKIP() << "this build has cuDNN";
#else
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  setenv("HONE_ATTENTION", "cudnn", 1);
  auto gpu = make_cuda_backend({});
  unsetenv("HONE_ATTENTION");
  const Problem p = problem(2, 16, 2, 64, {16, 9});
  Attention a(*gpu, DType::BF16, p);
  try {
    a.forward(make_qkv(p, 1, 1.0f, -1.0f, 1.0f), {});
    FAIL() << "HONE_ATTENTION=cudnn ran without cuDNN";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuDNN"), std::string::npos) << e.what();
    std::printf("  without cuDNN: %s\n", e.what());
  }
#endif
}

// cuDNN's attention reads lengths: a bf16 run on it refuses a mask padded at the start,
// naming the row, where hone's own attention takes it.
TEST(CudnnAttention, RunRefusesMasksNotPaddedAtTheEnd) {
#ifndef HONE_HAVE_CUDNN
  GTEST_SKIP() << "this build has no cuDNN";
#endif
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  TrainingArguments a;
  a.per_device_train_batch_size = 2;
  a.bf16 = true;
  const ModelConfig c = test::small_bert();
  std::vector<int32_t> ids(16, 5), mask(16, 1), types(16, 0);
  std::vector<float> labels{0, 1};
  mask[8] = 0;  // row 1 starts with padding
  {
    auto flash = make_cuda_backend({});
    TrainingRun run(a, c, 8, *flash);
    run.init_weights(1);
    run.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 2, 1.0f, 0);
  }
  setenv("HONE_ATTENTION", "cudnn", 1);
  auto cudnn = make_cuda_backend({});
  unsetenv("HONE_ATTENTION");
  TrainingRun run(a, c, 8, *cudnn);
  try {
    run.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 2, 1.0f, 0);
    FAIL() << "cuDNN's attention took a mask padded at the start";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch row 1: the attention mask is not right-padded"), std::string::npos)
        << e.what();
  }
}

// --------------------------------------------------------------------- without dropout

// B = 3 with lengths {S, S - 37, 1}: a full sequence, a padded one, and one with a single
// valid key (whose probabilities are exactly 1). S = 72 is not a multiple of 64.
TEST_F(FusedAttention, MatchesUnfusedFp32WithPadding) {
  for (int S : {128, 72}) {
    const Problem p = problem(3, S, 4, 64, {S, S - 37, 1});
    const int64_t H = p.hidden(), T = p.tokens();
    for (DType t : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(fmt::format("{} {}", label(t), p.str()));
      std::printf("%s %s\n", label(t), p.str().c_str());
      // Q and K in [-2, 2] give scores of standard deviation 1.3: peaked, not one-hot, rows.
      std::vector<float> qkv = make_qkv(p, 11, 2.0f, -1.0f, 1.0f), dctx = uniform(T * H, 12, -1.0f, 1.0f);
      round_all(qkv, t);
      round_all(dctx, t);
      Attention ref(gpu(), DType::F32, p), fused(gpu(), t, p);
      for (Attention* a : {&ref, &fused}) {
        a->forward(qkv, {});
        a->backward(dctx, {});
      }
      const std::vector<float> ctx_r = ref.ctx(), ctx_f = fused.ctx(), dq_r = ref.dqkv(), dq_f = fused.dqkv();
      const std::vector<float> lse_r = ref.lse(), lse_f = fused.lse();
      const double tol = tolerance(t);
      expect_close("ctx", ctx_f, ctx_r, H, 0, H, tol);
      expect_close("dQ", dq_f, dq_r, 3 * H, 0, H, tol);
      expect_close("dK", dq_f, dq_r, 3 * H, H, 2 * H, tol);
      expect_close("dV", dq_f, dq_r, 3 * H, 2 * H, 3 * H, tol);
      // Both compute the log-sum-exp in F32 from the same products.
      for (size_t r = 0; r < lse_r.size(); ++r)
        ASSERT_NEAR(lse_f[r], lse_r[r], 1e-3 * std::max(1.0f, std::fabs(lse_r[r]))) << "log-sum-exp of row " << r;
      // Padded keys get no probability: their dK and dV are exactly 0.
      for (int b = 0; b < p.d.batch; ++b)
        for (int j = p.lengths[size_t(b)]; j < S; ++j)
          for (int64_t c = H; c < 3 * H; ++c)
            ASSERT_EQ(dq_f[size_t((int64_t(b) * S + j) * 3 * H + c)], 0.0f)
                << "padded key " << j << " of sequence " << b << ", column " << c;
    }
  }
}

// --------------------------------------------------------------------- dropout

// The same DropoutSpec gives the same output; another stream or seed another one; and the
// mask is unbiased (kept probabilities are scaled by 1 / (1 - p)), so averaged over many
// elements the output is the one without dropout.
TEST_F(FusedAttention, DropoutIsReproducibleVariesWithStreamAndSeedAndIsUnbiased) {
  const Problem p = problem(2, 128, 4, 64, {128, 91});
  const int64_t H = p.hidden(), T = p.tokens();
  const DropoutSpec drop{0.1f, 1234, 5}, other_stream{0.1f, 1234, 6}, other_seed{0.1f, 1235, 5};
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(label(t));
    // V in [0.5, 1.5]: outputs near 1, so that their mean is a sharp statistic.
    std::vector<float> qkv = make_qkv(p, 21, 2.0f, 0.5f, 1.5f), dctx = uniform(T * H, 22, -1.0f, 1.0f);
    round_all(qkv, t);
    round_all(dctx, t);
    Attention a(gpu(), t, p), b(gpu(), t, p);
    a.forward(qkv, drop);
    a.backward(dctx, drop);
    b.forward(qkv, drop);
    b.backward(dctx, drop);
    const std::vector<float> ctx1 = a.ctx(), ctx2 = b.ctx(), g1 = a.dqkv(), g2 = b.dqkv();
    EXPECT_EQ(std::memcmp(ctx1.data(), ctx2.data(), ctx1.size() * sizeof(float)), 0) << "same spec, another ctx";
    // dQ may be summed in another order (cuDNN accumulates it in F32 across key blocks): the
    // same up to a last-place rounding, far below what another mask changes.
    const bool same_grads = std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)) == 0;
    const double grad_diff = compare(g2, g1, 3 * H, 0, 3 * H).norm;
    std::printf("  %s: same spec twice: ctx identical; dqkv %s (rel. difference %.2e)\n", label(t),
                same_grads ? "identical" : "not bitwise identical", grad_diff);
    EXPECT_LE(grad_diff, 1e-3);

    for (const DropoutSpec& o : {other_stream, other_seed}) {
      b.forward(qkv, o);
      const double diff = compare(b.ctx(), ctx1, H, 0, H).norm;
      std::printf("  %s: stream %llu seed %llu: ctx differs by %.3f (relative)\n", label(t),
                  (unsigned long long)o.stream, (unsigned long long)o.seed, diff);
      // Another mask moves each output by ~0.11 of its size here (P's squares sum to ~0.05
      // per row, 18% of the terms flip); the same mask by nothing.
      EXPECT_GT(diff, 0.02) << "another stream or seed should give another mask";
    }

    b.forward(qkv, {});
    const std::vector<float> ctx0 = b.ctx();
    double mean1 = 0, mean0 = 0;
    for (size_t i = 0; i < ctx0.size(); ++i) mean1 += ctx1[i], mean0 += ctx0[i];
    mean1 /= double(ctx0.size()), mean0 /= double(ctx0.size());
    std::printf("  %s: mean of ctx with dropout %.5f, without %.5f\n", label(t), mean1, mean0);
    // Each output row's dropout noise is ~0.11 of the mean, and the B*heads*S = 1024
    // independent rows bring the mean's to ~0.003.
    EXPECT_NEAR(mean1, mean0, 2e-2 * std::fabs(mean0));
  }
}

// The backward must regenerate the forward's mask. O is linear in V for a fixed mask M:
// O(V + D) - O(V) = (P o M / (1 - p)) D, and backward gives dV = (P o M / (1 - p))^T dO, so
// <dO, O(V + D) - O(V)> = <dV, D> whatever dO is. With dO = O(V + D) - O(V) the left side
// is a large positive sum; a backward that drew another mask would miss it by about
// p / (1 - p) / (1 + p / (1 - p)) = 10%, rounding by less than 1e-4.
TEST_F(FusedAttention, DropoutMaskOfBackwardIsTheForwardsLinearityInV) {
  const Problem p = problem(2, 128, 4, 64, {128, 100});
  const int64_t H = p.hidden(), T = p.tokens();
  const DropoutSpec drop{0.1f, 77, 3};
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(label(t));
    std::vector<float> qkv = make_qkv(p, 31, 2.0f, -1.0f, 1.0f);
    round_all(qkv, t);
    std::vector<float> qkv2 = qkv;  // V + D, D uniform in [-1, 1], rounded: D = what the device sees
    const std::vector<float> noise = uniform(T * H, 32, -1.0f, 1.0f);
    std::vector<float> delta(size_t(T * H));
    for (int64_t r = 0; r < T; ++r)
      for (int64_t c = 0; c < H; ++c) {
        float& v2 = qkv2[size_t(r * 3 * H + 2 * H + c)];
        const float v = v2;
        v2 = round_to(v + noise[size_t(r * H + c)], t);
        delta[size_t(r * H + c)] = v2 - v;  // exact in F32
      }
    Attention a(gpu(), t, p);
    a.forward(qkv2, drop);
    const std::vector<float> o2 = a.ctx();
    a.forward(qkv, drop);
    const std::vector<float> o1 = a.ctx();
    std::vector<float> dout(size_t(T * H));
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = o2[i] - o1[i];
    round_all(dout, t);
    a.backward(dout, drop);
    const std::vector<float> g = a.dqkv();
    std::vector<float> dv(size_t(T * H));
    for (int64_t r = 0; r < T; ++r) std::copy_n(g.begin() + r * 3 * H + 2 * H, H, dv.begin() + r * H);
    std::vector<float> diff(size_t(T * H));
    for (size_t i = 0; i < diff.size(); ++i) diff[i] = o2[i] - o1[i];
    const double lhs = dot(dout, diff, H, 0, H), rhs = dot(dv, delta, H, 0, H);
    std::printf("  %s: <dO, O(V+D) - O(V)> = %.6g, <dV, D> = %.6g, relative difference %.2e\n", label(t), lhs, rhs,
                std::fabs(lhs - rhs) / std::fabs(lhs));
    EXPECT_GT(lhs, 0.0);
    EXPECT_LE(std::fabs(lhs - rhs), 1e-2 * std::fabs(lhs));
  }
}

// The mask element by element: with V one-hot over the first head_dim keys (V[j, d] = [j ==
// d]), the forward's ctx[i, d] is the dropped probability P'[i, d]; with dO one-hot over the
// first head_dim queries, the backward's dV[j, d] is P'[d, j]. Both must drop exactly the
// same (query, key) pairs, about a fraction p of them, and agree on the kept values up to the
// half type's rounding of two different computations of P.
TEST_F(FusedAttention, DropoutMaskOfBackwardIsTheForwardsElementByElement) {
  const Problem p = problem(2, 128, 4, 64, {128, 100});
  const int64_t H = p.hidden(), T = p.tokens(), D = p.d.head_dim, S = p.d.seq;
  const DropoutSpec drop{0.1f, 4242, 9};
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(label(t));
    // Q and K in [-1, 1]: probabilities within a small factor of 1 / S, far from underflow in fp16.
    std::vector<float> qkv = make_qkv(p, 41, 1.0f, -1.0f, 1.0f);
    round_all(qkv, t);
    for (int64_t r = 0; r < T; ++r) std::fill_n(qkv.begin() + r * 3 * H + 2 * H, H, 0.0f);  // V = 0 ...
    std::vector<float> dout(size_t(T * H), 0.0f);
    for (int b = 0; b < p.d.batch; ++b)
      for (int h = 0; h < p.d.heads; ++h)
        for (int64_t k = 0; k < D; ++k) {
          const int64_t row = b * S + k;
          qkv[size_t(row * 3 * H + 2 * H + h * D + k)] = 1.0f;  // ... but V[key k, dim k] = 1
          dout[size_t(row * H + h * D + k)] = 1.0f;             // dO[query k, dim k] = 1
        }
    Attention a(gpu(), t, p);
    a.forward(qkv, drop);
    a.backward(dout, drop);
    const std::vector<float> ctx = a.ctx(), g = a.dqkv();
    int64_t valid = 0, dropped = 0, worst_i = -1;
    double worst = 0;
    for (int b = 0; b < p.d.batch; ++b)
      for (int h = 0; h < p.d.heads; ++h)
        for (int64_t i = 0; i < D; ++i)
          for (int64_t j = 0; j < D; ++j) {
            const float fwd = ctx[size_t((b * S + i) * H + h * D + j)];  // P'[i, j] from the forward
            const float bwd = g[size_t((b * S + j) * 3 * H + 2 * H + h * D + i)];  // and from the backward
            if (j >= p.lengths[size_t(b)]) {
              ASSERT_EQ(fwd, 0.0f) << "padded key " << j;
              ASSERT_EQ(bwd, 0.0f) << "padded key " << j;
              continue;
            }
            ++valid;
            ASSERT_EQ(fwd == 0.0f, bwd == 0.0f) << fmt::format(
                "sequence {} head {} query {} key {}: the forward {} it ({}), the backward {} it ({})", b, h, i, j,
                fwd == 0.0f ? "dropped" : "kept", fwd, bwd == 0.0f ? "dropped" : "kept", bwd);
            if (fwd == 0.0f) {
              ++dropped;
              continue;
            }
            const double e = std::fabs(double(fwd) - bwd) / std::fabs(double(fwd));
            if (e > worst) worst = e, worst_i = ((b * p.d.heads + h) * D + i) * D + j;
          }
    const double fraction = double(dropped) / double(valid);
    std::printf("  %s: %lld (query, key) pairs, %.4f dropped (p = %.2f); kept values agree within %.2e (pair %lld)\n",
                label(t), (long long)valid, fraction, drop.p, worst, (long long)worst_i);
    // valid is ~30000: the fraction's standard deviation is 0.0017.
    EXPECT_NEAR(fraction, drop.p, 0.03);
    // The forward rounds exp(s - max) before its product and divides after; the backward
    // rounds exp(s - lse) / (1 - p): a few units in the last place of the half type.
    EXPECT_LE(worst, t == DType::BF16 ? 3e-2 : 1e-2);
  }
}

// --------------------------------------------------------------------- checks and shapes

TEST_F(FusedAttention, RejectsHeadSizesOtherThan16_32_64Or128) {
  for (int head_dim : {12, 96, 136}) {
    const Problem p = problem(1, 16, 2, head_dim, {16});
    Attention a(gpu(), DType::BF16, p);
    try {
      a.forward(make_qkv(p, 1, 1.0f, -1.0f, 1.0f), {});
      gpu().synchronize();
      FAIL() << "head_dim " << head_dim << " ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("head size"), std::string::npos) << e.what();
    }
  }
}

// BERT-large's attention at S = 512 (the design note's shape) against the unfused F32 path,
// and the time of a forward and of a backward of each, with and without dropout, for the
// record (flash_attention_gpu_test.cpp measures BERT-large's full batch against cuDNN).
TEST_F(FusedAttention, BertLargeShapeMatchesAndReportsTime) {
  const Problem p = problem(4, 512, 16, 64, {512, 300, 137, 1});
  const int64_t H = p.hidden(), T = p.tokens();
  const std::vector<float> qkv = make_qkv(p, 51, 2.0f, -1.0f, 1.0f), dctx = uniform(T * H, 52, -1.0f, 1.0f);
  std::printf("%s\n", p.str().c_str());
  auto report_time = [&](Attention& a, DType t, const DropoutSpec& d) {
    a.run_forward(d);  // plans are built on first use
    a.run_backward(d);
    gpu().synchronize();
    constexpr int kReps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r) a.run_forward(d);
    gpu().synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r) a.run_backward(d);
    gpu().synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count() / kReps; };
    std::printf("  time %s p=%.1f: forward %.3f ms, backward %.3f ms\n", label(t), d.p, ms(t0, t1), ms(t1, t2));
  };
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(label(t));
    std::vector<float> q = qkv, g = dctx;
    round_all(q, t);
    round_all(g, t);
    Attention ref(gpu(), DType::F32, p), fused(gpu(), t, p);
    for (Attention* a : {&ref, &fused}) {
      a->forward(q, {});
      a->backward(g, {});
    }
    const std::vector<float> ctx_r = ref.ctx(), ctx_f = fused.ctx(), dq_r = ref.dqkv(), dq_f = fused.dqkv();
    std::printf(" %s\n", label(t));
    expect_close("ctx", ctx_f, ctx_r, H, 0, H, tolerance(t));
    expect_close("dqkv", dq_f, dq_r, 3 * H, 0, 3 * H, tolerance(t));
    for (float pr : {0.0f, 0.1f}) {
      const DropoutSpec d{pr, 99, 1};
      report_time(fused, t, d);
      if (t == DType::BF16) report_time(ref, DType::F32, d);
    }
  }
}

}  // namespace
}  // namespace hone
