// hone's flash attention (BF16/F16 on the CUDA backend) against the CPU reference
// (src/ops/attention.cpp) on the same inputs, rounded to the half type first so that both
// sides see the same numbers: head sizes 16, 32, 64 and 128, right padding and masks with
// holes, odd lengths, rows whose every key is masked, and dropout, whose masks must be the
// CPU's element for element (another mask would move outputs by tens of percent). Each
// case runs on both of hone's kernel sets: the default (Hopper's wgmma/TMA kernels for head
// sizes 32, 64 and 128 on a 9.0 GPU) and HONE_ATTENTION=flash2 (the mma.sync ones everywhere). Sliding
// windows (ModernBERT's local attention) in the padded and the packed forward, and under
// HONE_ATTENTION=cudnn, which hands windowed calls to hone's kernels. Packed training
// against the padded batch, bit for bit. Then the time of forward and backward at
// BERT-large's shape (and at head sizes 32 and 128) against cuDNN's fused attention and a dense
// cuBLASLt product, printed only, and a windowed 8192-token sequence against full
// attention, which it must beat by far.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "device_tensor.h"
#include "hone/backend.h"
#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "cuda/flash_hopper.h"
#include "cuda/sdpa.h"
#include "hone/error.h"
#include "hone/ops.h"
#include "test_util.h"

namespace hone {
namespace {

using test::DeviceTensor;
using test::HostTensor;
using test::round_all;

const char* label(DType t) { return t == DType::BF16 ? "bf16" : "fp16"; }

// ||got - want|| / ||want|| over an output, and its worst element against the largest
// |want|. Inputs are exact on both sides, so the difference is the kernels' rounding: P and
// dS are rounded to the half type before their products, and the outputs are stored in it
// (unit roundoff 2^-9 = 2e-3 in bf16, 2^-11 = 4.9e-4 in fp16). A few such roundings of
// random sign give 2e-3 to 4e-3 in bf16 and 4 times less in fp16: the bounds leave 2.5-3x.
double tolerance(DType t) { return t == DType::BF16 ? 1e-2 : 3e-3; }

struct Case {
  int batch, seq, heads, head_dim;
  std::vector<std::vector<int32_t>> masks;  // one row of seq per sequence
  int window = -1;
  AttentionDims dims() const {
    AttentionDims d{batch, seq, heads, head_dim, 1.0f / std::sqrt(float(head_dim))};
    d.window = window;
    return d;
  }
  int64_t tokens() const { return int64_t(batch) * seq; }
  int64_t hidden() const { return int64_t(heads) * head_dim; }
};

std::vector<int32_t> right_padded(int seq, int length) {
  std::vector<int32_t> m(static_cast<size_t>(seq), 0);
  for (int j = 0; j < length; ++j) m[size_t(j)] = 1;
  return m;
}

// Random holes (about a third of the keys masked), the last key masked too.
std::vector<int32_t> with_holes(int seq, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> m(static_cast<size_t>(seq));
  for (int32_t& x : m) x = gen() % 3 != 0;
  m[0] = 1;
  m.back() = seq > 1 ? 0 : 1;
  return m;
}

std::vector<float> uniform(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(g);
  return v;
}

struct Outputs {
  std::vector<float> ctx, dqkv;
  std::vector<int32_t> keep;  // the GPU's saved mask bits, when it drops
};

// The CPU reference on the rounded inputs.
Outputs run_cpu(const Case& c, const std::vector<float>& qkv, const std::vector<float>& dctx,
                const std::vector<int32_t>& mask, const DropoutSpec& drop) {
  CpuBackend cpu;
  const AttentionDims d = c.dims();
  const int64_t T = c.tokens(), H = c.hidden();
  HostTensor q(DType::F32, Shape{T, 3 * H}), m(DType::I32, Shape{c.batch, c.seq}), g(DType::F32, Shape{T, H}),
      stats(DType::F32, Shape{c.batch, c.heads, c.seq, 2}), ctx(DType::F32, Shape{T, H}),
      dqkv(DType::F32, Shape{T, 3 * H}), work(DType::F32, Shape{cpu.attention_workspace_elems(d, DType::F32)});
  std::copy(qkv.begin(), qkv.end(), q.f());
  std::copy(dctx.begin(), dctx.end(), g.f());
  std::copy(mask.begin(), mask.end(), m.i());
  Tensor keep;  // the CPU keeps no mask bits
  cpu.attention_forward(q.t, m.t, d, drop, stats.t, keep, ctx.t, work.t);
  cpu.attention_backward(g.t, q.t, ctx.t, m.t, stats.t, keep, d, drop, dqkv.t, work.t);
  return {std::vector<float>(ctx.f(), ctx.f() + T * H), std::vector<float>(dqkv.f(), dqkv.f() + T * 3 * H), {}};
}

// The GPU in dtype t; outputs start unwritten (NaN), so an element never written shows.
Outputs run_gpu(Backend& gpu, DType t, const Case& c, const std::vector<float>& qkv, const std::vector<float>& dctx,
                const std::vector<int32_t>& mask, const DropoutSpec& drop) {
  const AttentionDims d = c.dims();
  const int64_t T = c.tokens(), H = c.hidden();
  DeviceTensor q(gpu, t, Shape{T, 3 * H}), m(gpu, DType::I32, Shape{c.batch, c.seq}), g(gpu, t, Shape{T, H}),
      stats(gpu, DType::F32, Shape{c.batch, c.heads, c.seq, 2}), ctx(gpu, t, Shape{T, H}),
      dqkv(gpu, t, Shape{T, 3 * H}), work(gpu, DType::F32, Shape{gpu.attention_workspace_elems(d, t)});
  const int words = ops::attention_keep_words(gpu, d, t, drop);
  DeviceTensor keep(gpu, DType::I32, Shape{c.batch, c.heads, c.seq, std::max(words, 1)});
  q.upload(qkv);
  g.upload(dctx);
  m.upload_bytes(mask.data());
  gpu.attention_forward(q.t, m.t, d, drop, stats.t, keep.t, ctx.t, work.t);
  gpu.attention_backward(g.t, q.t, ctx.t, m.t, stats.t, keep.t, d, drop, dqkv.t, work.t);
  gpu.synchronize();
  std::vector<int32_t> bits;
  if (words > 0) {
    bits.resize(size_t(keep.t.numel()));
    test::cuda_ok(cudaMemcpy(bits.data(), keep.t.data, keep.t.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  return {ctx.download(), dqkv.download(), bits};
}

// Columns [c0, c1) of row-major [rows, cols] outputs.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, int64_t cols,
                  int64_t c0, int64_t c1, double tol) {
  double num = 0, den = 0, worst = 0, scale = 0;
  for (size_t r = 0; r * size_t(cols) < want.size(); ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const size_t i = r * size_t(cols) + size_t(c);
      double e = std::fabs(double(got[i]) - want[i]);
      if (std::isnan(e)) e = INFINITY;
      num += e * e, den += double(want[i]) * want[i];
      worst = std::max(worst, e), scale = std::max(scale, std::fabs(double(want[i])));
    }
  const double norm = den > 0 ? std::sqrt(num / den) : std::sqrt(num), rel_worst = scale > 0 ? worst / scale : worst;
  std::printf("    %-6s rel. error %.2e, worst element %.2e of max\n", what.c_str(), norm, rel_worst);
  EXPECT_LE(norm, tol) << what;
  EXPECT_LE(rel_worst, 5 * tol) << what;  // one element may carry a few roundings of values near the largest
}

// The whole comparison of one case in one dtype. `step` (a device counter, and the same
// value on the host) is optional: with it the kernels must read the step from memory.
void check_case(Backend& gpu, DType t, const Case& c, const DropoutSpec& drop, const std::string& name) {
  SCOPED_TRACE(fmt::format("{} {} B={} S={} heads={} head_dim={} p={}", name, label(t), c.batch, c.seq, c.heads,
                           c.head_dim, drop.p));
  std::printf("  %s %s S=%d head_dim=%d p=%.2f\n", name.c_str(), label(t), c.seq, c.head_dim, drop.p);
  const int64_t T = c.tokens(), H = c.hidden();
  // Q and K in [-2, 2]: scores of standard deviation ~1.3, peaked rows that are not one-hot.
  std::vector<float> qkv = uniform(T * 3 * H, 11 + c.head_dim, -2.0f, 2.0f), dctx = uniform(T * H, 12, -1.0f, 1.0f);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t k = 2 * H; k < 3 * H; ++k) qkv[size_t(r * 3 * H + k)] *= 0.5f;  // V in [-1, 1]
  round_all(qkv, t);
  round_all(dctx, t);
  std::vector<int32_t> mask;
  for (const auto& row : c.masks) mask.insert(mask.end(), row.begin(), row.end());

  DropoutSpec cpu_drop = drop, gpu_drop = drop;
  int64_t host_step = 0;
  void* device_step = nullptr;
  if (drop.step) {  // drop.step points at the host's value
    host_step = *drop.step;
    device_step = gpu.allocate(sizeof(int64_t));
    test::cuda_ok(cudaMemcpy(device_step, &host_step, sizeof host_step, cudaMemcpyHostToDevice), "cudaMemcpy");
    cpu_drop.step = &host_step;
    gpu_drop.step = static_cast<const int64_t*>(device_step);
  }
  const Outputs want = run_cpu(c, qkv, dctx, mask, cpu_drop);
  const Outputs got = run_gpu(gpu, t, c, qkv, dctx, mask, gpu_drop);
  if (device_step) gpu.deallocate(device_step);
  if (drop.p > 0.0f) {  // the saved bits are attention_keep's, keys past S dropped
    ASSERT_FALSE(got.keep.empty()) << "the flash kernels keep their mask for backward";
    const int64_t rows = int64_t(c.batch) * c.heads * c.seq, words = int64_t(got.keep.size()) / rows;
    const uint64_t stream = dropout_stream(cpu_drop);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < 32 * words; ++j) {
        // Only the bits of keys in the window and the sequence are defined under a window.
        if (outside_window(c.window, int(r % c.seq), int(j)) || (c.window >= 0 && j >= c.seq)) continue;
        const bool bit = (uint32_t(got.keep[size_t(r * words + j / 32)]) >> (j % 32)) & 1u;
        const bool want_bit = j < c.seq && attention_keep(drop.seed, stream, uint64_t(r) * c.seq + uint64_t(j), drop.p);
        ASSERT_EQ(bit, want_bit) << "row " << r << " key " << j;
      }
  }
  const double tol = tolerance(t);
  expect_close("ctx", got.ctx, want.ctx, H, 0, H, tol);
  expect_close("dV", got.dqkv, want.dqkv, 3 * H, 2 * H, 3 * H, tol);
  if (c.window == 0) {
    // Each query weighs one key with probability 1, so dS = P (dP - rowsum(dO O)) is 0 in
    // exact arithmetic and dQ, dK are rounding on both sides: small against dV, not equal.
    double dv = 0, dqk = 0;
    for (size_t i = 0; i < got.dqkv.size(); ++i) {
      const bool value = int64_t(i) % (3 * H) >= 2 * H;
      (value ? dv : dqk) = std::max(value ? dv : dqk, std::fabs(double(value ? want.dqkv[i] : got.dqkv[i])));
    }
    EXPECT_LE(dqk, tol * dv) << "dQ and dK of a one-key window";
  } else {
    expect_close("dQ", got.dqkv, want.dqkv, 3 * H, 0, H, tol);
    expect_close("dK", got.dqkv, want.dqkv, 3 * H, H, 2 * H, tol);
  }
  // A masked key gets probability 0 in every row that attends to anything within its
  // window: if every query whose window holds the key does, dK = dV = 0 exactly.
  for (int b = 0; b < c.batch; ++b) {
    const auto& m = c.masks[size_t(b)];
    const auto sees_a_live_key = [&](int i) {
      for (int j = 0; j < c.seq; ++j)
        if (m[size_t(j)] != 0 && !outside_window(c.window, i, j)) return true;
      return false;
    };
    std::vector<bool> live_row(size_t(c.seq));
    for (int i = 0; i < c.seq; ++i) live_row[size_t(i)] = sees_a_live_key(i);
    for (int j = 0; j < c.seq; ++j) {
      if (m[size_t(j)] != 0) continue;
      bool weighed = false;  // by a query that sees only masked keys
      for (int i = 0; i < c.seq; ++i) weighed = weighed || (!outside_window(c.window, i, j) && !live_row[size_t(i)]);
      if (weighed) continue;
      for (int64_t k = H; k < 3 * H; ++k)
        ASSERT_EQ(got.dqkv[size_t((int64_t(b) * c.seq + j) * 3 * H + k)], 0.0f)
            << "masked key " << j << " of sequence " << b << ", column " << k;
    }
  }
}

using FlashAttention = test::GpuTest;

// body(choice) under HONE_ATTENTION=flash (the default) and =flash2.
void for_each_kernel_set(const std::function<void(const std::string&)>& body) {
  for (const char* choice : {"flash", "flash2"}) {
    setenv("HONE_ATTENTION", choice, 1);
    body(choice);
  }
  unsetenv("HONE_ATTENTION");
}

// HONE_ATTENTION picks among hone's kernels, their mma.sync set and cuDNN's; any other value
// is an error that lists the choices (no GPU needed).
TEST(AttentionChoice, UnknownValuesAreAnErrorListingTheChoices) {
  setenv("HONE_ATTENTION", "flash3", 1);
  try {
    (void)cuda::hopper_attention_allowed();
    ADD_FAILURE() << "HONE_ATTENTION=flash3 was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* s : {"HONE_ATTENTION=flash3", "\"flash\"", "\"flash2\"", "\"cudnn\""})
      EXPECT_NE(what.find(s), std::string::npos) << what;
  }
  setenv("HONE_ATTENTION", "flash2", 1);
  EXPECT_FALSE(cuda::hopper_attention_allowed());
  EXPECT_FALSE(cuda::cudnn_attention_selected());
  setenv("HONE_ATTENTION", "flash", 1);
  EXPECT_TRUE(cuda::hopper_attention_allowed());
  unsetenv("HONE_ATTENTION");
  EXPECT_TRUE(cuda::hopper_attention_allowed());
  EXPECT_FALSE(cuda::cudnn_attention_selected());
}

// Right padding, holes and every key masked, for each head size, an odd length (77: tail
// tiles and the per-element dropout draws) and a multiple of 8 (128: two key tiles, one
// Philox block per eight keys). Calls this small have the Hopper forward take the key
// lengths from the mask itself (mask_lengths_in_kernel); the larger padded calls of
// EveryTileIsComputedInEitherTileOrder get them from their own launch.
TEST_F(FlashAttention, MatchesCpuReference) {
  for (int head_dim : {16, 32, 64, 128})
    for (int S : {77, 128}) {
      const Case c{3, S, 2, head_dim, {right_padded(S, S - 30), with_holes(S, S + head_dim), right_padded(S, S)}};
      for_each_kernel_set([&](const std::string& k) {
        for (DType t : {DType::BF16, DType::F16}) check_case(gpu(), t, c, {}, k + ": padding and holes");
      });
    }
}

TEST_F(FlashAttention, RowsWithEveryKeyMaskedAreUniform) {
  for (int S : {77, 1}) {
    const Case c{2, S, 2, 64, {right_padded(S, 0), right_padded(S, S)}};
    for_each_kernel_set([&](const std::string& k) {
      for (DType t : {DType::BF16, DType::F16}) check_case(gpu(), t, c, {}, k + ": all masked");
    });
  }
}

// The Hopper forward sorts (sequence, query tile) pairs by their work, heaviest first, when
// there are at most 4096 of them; more keep the plain turns. Both orders must cover every
// tile once: many sequences of lengths 1..S, so that each CTA takes several tiles of
// different work, on either side of that bound.
TEST_F(FlashAttention, EveryTileIsComputedInEitherTileOrder) {
  for (const auto& [batch, S] : {std::pair{120, 200}, std::pair{4100, 24}}) {
    Case c{batch, S, 2, 64, {}};
    for (int b = 0; b < batch; ++b) c.masks.push_back(right_padded(S, 1 + (b * 37) % S));
    check_case(gpu(), DType::BF16, c, {}, fmt::format("{} sequences", batch));
  }
}

// p = 0.5 drops half of P: a mask that differed from the CPU's anywhere would move the
// outputs by tens of percent. The step counter comes from device memory, as in a replayed
// CUDA graph.
TEST_F(FlashAttention, DropoutMasksAreTheCpus) {
  const int64_t step = 7;
  for (int head_dim : {16, 32, 64, 128})
    for (int S : {77, 128}) {
      const Case c{2, S, 2, head_dim, {with_holes(S, 5), right_padded(S, S - 9)}};
      for_each_kernel_set([&](const std::string& k) {
        for (DType t : {DType::BF16, DType::F16}) {
          check_case(gpu(), t, c, {0.5f, 1234, 5}, k + ": dropout");
          check_case(gpu(), t, c, {0.1f, 99, 3, &step}, k + ": dropout, step in memory");
        }
      });
    }
}

// With dropout the forward must be given room for its mask bits; without it, an error
// that names them, before any kernel runs.
TEST_F(FlashAttention, DroppingWithoutTheMaskBitsIsAnError) {
  const AttentionDims d{1, 128, 2, 64, 0.125f};
  const int64_t T = d.seq, H = d.hidden();
  DeviceTensor q(gpu(), DType::BF16, Shape{T, 3 * H}), m(gpu(), DType::I32, Shape{1, d.seq}),
      stats(gpu(), DType::F32, Shape{1, d.heads, d.seq, 2}), ctx(gpu(), DType::BF16, Shape{T, H}),
      work(gpu(), DType::F32, Shape{gpu().attention_workspace_elems(d, DType::BF16)});
  Tensor none;
  EXPECT_EQ(ops::attention_keep_words(gpu(), d, DType::BF16, {}), 0);  // nothing to keep without dropout
  ops::attention_forward(gpu(), q.t, m.t, d, {}, stats.t, none, ctx.t, work.t);
  try {
    ops::attention_forward(gpu(), q.t, m.t, d, {0.1f, 1, 2}, stats.t, none, ctx.t, work.t);
    ADD_FAILURE() << "dropout ran without its mask bits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keep"), std::string::npos) << e.what();
  }
  gpu().synchronize();
}

// Sliding windows (ModernBERT's local layers: query i weighs key j iff |i - j| <= w): 0, 3,
// 64 and one as long as the sequence (full attention), at lengths that end inside the
// tiles (77, 200, 513), with holes and right padding (whose last queries see only padded
// keys at small windows: uniform over them), with and without dropout, every head size,
// both kernel sets.
TEST_F(FlashAttention, SlidingWindowMatchesCpuReference) {
  for (int head_dim : {16, 32, 64, 128})
    for (int S : {77, 200, 513})
      for (int window : {0, 3, 64, S}) {
        Case c{2, S, 2, head_dim, {with_holes(S, S + head_dim), right_padded(S, S - 40)}};
        c.window = window;
        const std::string name = fmt::format(": window {}", window);
        for_each_kernel_set([&](const std::string& k) {
          for (DType t : {DType::BF16, DType::F16}) {
            check_case(gpu(), t, c, {}, k + name);
            check_case(gpu(), t, c, {0.3f, 4321, 6}, k + name + ", dropout");
          }
        });
      }
}

#ifdef HONE_HAVE_CUDNN
// cuDNN's graph has no band mask: under HONE_ATTENTION=cudnn a windowed call runs hone's
// kernels (their dropout masks, kept for backward), and must still match the CPU.
TEST_F(FlashAttention, SlidingWindowUnderCudnnRunsHonesKernels) {
  setenv("HONE_ATTENTION", "cudnn", 1);
  auto cudnn = make_cuda_backend({});
  unsetenv("HONE_ATTENTION");
  for (int S : {77, 513}) {
    Case c{2, S, 2, 64, {right_padded(S, S), right_padded(S, S - 40)}, 3};
    EXPECT_GT(ops::attention_keep_words(*cudnn, c.dims(), DType::BF16, {0.1f, 1, 2}), 0);
    for (DType t : {DType::BF16, DType::F16}) {
      check_case(*cudnn, t, c, {}, "cudnn: window 3");
      check_case(*cudnn, t, c, {0.3f, 4321, 6}, "cudnn: window 3, dropout");
    }
  }
}
#endif

// The packed (varlen inference) forward with a window counts positions from each
// sequence's start: against the CPU's packed forward, with lengths that end inside and at
// the edges of the tiles, and a sequence of one token.
TEST_F(FlashAttention, PackedSlidingWindowMatchesCpuReference) {
  const std::vector<int32_t> lengths = {77, 1, 200, 128, 513, 64};
  const int B = int(lengths.size()), S = *std::max_element(lengths.begin(), lengths.end());
  std::vector<int32_t> row_start = {0};
  for (int32_t n : lengths) row_start.push_back(row_start.back() + n);
  const int64_t T = row_start.back();
  CpuBackend cpu;
  for (int head_dim : {16, 32, 64, 128})
    for (int window : {-1, 0, 3, 64, S}) {
      AttentionDims d{B, S, 2, head_dim, 1.0f / std::sqrt(float(head_dim))};
      d.window = window;
      const int64_t H = d.hidden();
      for_each_kernel_set([&](const std::string& k) {
        for (DType t : {DType::BF16, DType::F16}) {
          SCOPED_TRACE(fmt::format("{} {} head_dim={} window={}", k, label(t), head_dim, window));
          std::vector<float> qkv = uniform(T * 3 * H, 31 + head_dim, -2.0f, 2.0f);
          round_all(qkv, t);
          HostTensor q(DType::F32, Shape{T, 3 * H}), rs(DType::I32, Shape{B + 1}), want(DType::F32, Shape{T, H}),
              cpu_work(DType::F32, Shape{cpu.attention_workspace_elems(d, DType::F32)});
          std::copy(qkv.begin(), qkv.end(), q.f());
          std::copy(row_start.begin(), row_start.end(), rs.i());
          ops::attention_forward_packed(cpu, q.t, rs.t, d, want.t, cpu_work.t);
          DeviceTensor gq(gpu(), t, Shape{T, 3 * H}), grs(gpu(), DType::I32, Shape{B + 1}), ctx(gpu(), t, Shape{T, H}),
              work(gpu(), DType::F32, Shape{gpu().attention_workspace_elems(d, t)});
          gq.upload(qkv);
          grs.upload_bytes(row_start.data());
          ops::attention_forward_packed(gpu(), gq.t, grs.t, d, ctx.t, work.t);
          gpu().synchronize();
          expect_close("ctx", ctx.download(), std::vector<float>(want.f(), want.f() + T * H), H, 0, H, tolerance(t));
        }
      });
    }
}

// A padded batch whose sequences attend to their first lengths[b] tokens, and the same
// sequences packed: the padded rows past each sequence hold values of their own (and dctx
// 0 there, as the model's scatter gives), the packed rows are the attended ones.
struct PackedBatch {
  int batch, seq;
  std::vector<int32_t> mask, row_start{0}, rows;  // rows: each packed row's padded row
  PackedBatch(const std::vector<int32_t>& lengths, int seq) : batch(int(lengths.size())), seq(seq) {
    for (int b = 0; b < batch; ++b) {
      const std::vector<int32_t> m = right_padded(seq, lengths[size_t(b)]);
      mask.insert(mask.end(), m.begin(), m.end());
      for (int i = 0; i < lengths[size_t(b)]; ++i) rows.push_back(b * seq + i);
      row_start.push_back(int32_t(rows.size()));
    }
  }
  int64_t tokens() const { return int64_t(rows.size()); }
  std::vector<float> pack(const std::vector<float>& padded, int64_t cols) const {
    std::vector<float> out;
    out.reserve(rows.size() * size_t(cols));
    for (int32_t r : rows) out.insert(out.end(), padded.begin() + r * cols, padded.begin() + (r + 1) * cols);
    return out;
  }
};

struct TrainingOutputs {
  std::vector<float> ctx, dqkv, stats;
  std::vector<int32_t> keep;
};

// Forward and backward of padded (row_start null) or packed attention on the GPU.
TrainingOutputs run_training(Backend& gpu, DType t, const AttentionDims& d, const PackedBatch& pb, bool packed,
                             const std::vector<float>& qkv, const std::vector<float>& dctx, const DropoutSpec& drop) {
  const int64_t T = packed ? pb.tokens() : int64_t(d.batch) * d.seq, H = d.hidden();
  DeviceTensor q(gpu, t, Shape{T, 3 * H}), m(gpu, DType::I32, Shape{d.batch, d.seq}),
      rs(gpu, DType::I32, Shape{d.batch + 1}), g(gpu, t, Shape{T, H}),
      stats(gpu, DType::F32, Shape{d.batch, d.heads, d.seq, 2}), ctx(gpu, t, Shape{T, H}),
      dqkv(gpu, t, Shape{T, 3 * H}), work(gpu, DType::F32, Shape{gpu.attention_workspace_elems(d, t)});
  const int words = std::max(ops::attention_keep_words(gpu, d, t, drop), 1);
  DeviceTensor keep(gpu, DType::I32, Shape{d.batch, d.heads, d.seq, words});
  q.upload(qkv);
  g.upload(dctx);
  m.upload_bytes(pb.mask.data());
  rs.upload_bytes(pb.row_start.data());
  const std::vector<float> unwritten(size_t(stats.t.numel()), 7.0f);
  stats.upload(unwritten);
  if (packed) {
    ops::attention_forward_packed(gpu, q.t, rs.t, d, drop, stats.t, keep.t, ctx.t, work.t);
    ops::attention_backward_packed(gpu, g.t, q.t, ctx.t, rs.t, stats.t, keep.t, d, drop, dqkv.t, work.t);
  } else {
    ops::attention_forward(gpu, q.t, m.t, d, drop, stats.t, keep.t, ctx.t, work.t);
    ops::attention_backward(gpu, g.t, q.t, ctx.t, m.t, stats.t, keep.t, d, drop, dqkv.t, work.t);
  }
  gpu.synchronize();
  std::vector<int32_t> bits(size_t(keep.t.numel()));
  keep.download_bytes(bits.data());
  return {ctx.download(), dqkv.download(), stats.download(), bits};
}

// Packed training (the varlen forward with statistics and dropout, and its backward)
// against the padded batch on the GPU: the context, the statistics and the dropout bits of
// the attended rows (and keys) bit for bit, dK and dV too (the same products summed in the same
// order: the padded rows past a sequence add exact zeros, as the packed tiles' rows of
// the next sequence do), dQ within the order of its F32 reductions; statistics of
// positions past a sequence unwritten; and all of it against the CPU's packed reference.
// Lengths end inside and at the edges of the tiles, and S is above the longest.
TEST_F(FlashAttention, PackedTrainingIsThePaddedBatch) {
  const PackedBatch pb({77, 1, 200, 128, 513, 64}, 520);
  const int64_t T = pb.tokens();
  CpuBackend cpu;
  for (int head_dim : {16, 32, 64, 128})
    for (int window : {-1, 3})
      for (float p : {0.0f, 0.3f}) {
        AttentionDims d{pb.batch, pb.seq, 2, head_dim, 1.0f / std::sqrt(float(head_dim))};
        d.window = window;
        const DropoutSpec drop{p, 4321, 6};
        const int64_t H = d.hidden(), padded = int64_t(pb.batch) * pb.seq;
        for_each_kernel_set([&](const std::string& k) {
          for (DType t : {DType::BF16, DType::F16}) {
            SCOPED_TRACE(fmt::format("{} {} head_dim={} window={} p={}", k, label(t), head_dim, window, p));
            std::printf("  packed training: %s %s head_dim=%d window=%d p=%.1f\n", k.c_str(), label(t), head_dim,
                        window, p);
            std::vector<float> qkv = uniform(padded * 3 * H, 51 + head_dim, -2.0f, 2.0f);
            std::vector<float> dctx = uniform(padded * H, 52, -1.0f, 1.0f);
            for (int64_t r = 0; r < padded; ++r)
              if (pb.mask[size_t(r)] == 0) std::fill_n(dctx.begin() + r * H, H, 0.0f);
            round_all(qkv, t);
            round_all(dctx, t);
            const std::vector<float> packed_qkv = pb.pack(qkv, 3 * H), packed_dctx = pb.pack(dctx, H);
            const TrainingOutputs want = run_training(gpu(), t, d, pb, false, qkv, dctx, drop);
            const TrainingOutputs got = run_training(gpu(), t, d, pb, true, packed_qkv, packed_dctx, drop);
            const std::vector<float> want_ctx = pb.pack(want.ctx, H), want_dqkv = pb.pack(want.dqkv, 3 * H);
            const size_t words = got.keep.size() / (size_t(padded) * d.heads);
            for (int b = 0; b < pb.batch; ++b)
              for (int h = 0; h < d.heads; ++h)
                for (int i = 0; i < pb.seq; ++i) {
                  const size_t row = (size_t(b) * d.heads + h) * pb.seq + i, at = 2 * row;
                  const int len = pb.row_start[size_t(b) + 1] - pb.row_start[size_t(b)];
                  const bool live = i < len;
                  for (size_t e = at; e < at + 2; ++e)
                    ASSERT_EQ(got.stats[e], live ? want.stats[e] : 7.0f) << "stats of " << b << ", " << h << ", " << i;
                  // The bits of keys past a sequence (whole words) and of its rows past it are not drawn.
                  for (size_t w = 0; live && w < words && int(32 * w) < len; ++w)
                    ASSERT_EQ(got.keep[row * words + w], want.keep[row * words + w]) << "dropout bits of row " << row;
                }
            for (int64_t r = 0; r < T; ++r) {
              for (int64_t c = 0; c < H; ++c)
                ASSERT_EQ(got.ctx[size_t(r * H + c)], want_ctx[size_t(r * H + c)]) << "ctx row " << r;
              for (int64_t c = H; c < 3 * H; ++c)
                ASSERT_EQ(got.dqkv[size_t(r * 3 * H + c)], want_dqkv[size_t(r * 3 * H + c)]) << "dK, dV row " << r;
            }
            expect_close("dQ", got.dqkv, want_dqkv, 3 * H, 0, H, 1e-3);

            HostTensor q(DType::F32, Shape{T, 3 * H}), g(DType::F32, Shape{T, H}), rs(DType::I32, Shape{pb.batch + 1}),
                stats(DType::F32, Shape{d.batch, d.heads, d.seq, 2}), ctx(DType::F32, Shape{T, H}),
                dqkv(DType::F32, Shape{T, 3 * H}),
                work(DType::F32, Shape{cpu.attention_workspace_elems(d, DType::F32)});
            std::copy(packed_qkv.begin(), packed_qkv.end(), q.f());
            std::copy(packed_dctx.begin(), packed_dctx.end(), g.f());
            std::copy(pb.row_start.begin(), pb.row_start.end(), rs.i());
            Tensor no_bits;
            ops::attention_forward_packed(cpu, q.t, rs.t, d, drop, stats.t, no_bits, ctx.t, work.t);
            ops::attention_backward_packed(cpu, g.t, q.t, ctx.t, rs.t, stats.t, no_bits, d, drop, dqkv.t, work.t);
            const std::vector<float> cpu_dqkv(dqkv.f(), dqkv.f() + T * 3 * H);
            expect_close("ctx", got.ctx, std::vector<float>(ctx.f(), ctx.f() + T * H), H, 0, H, tolerance(t));
            expect_close("dQ", got.dqkv, cpu_dqkv, 3 * H, 0, H, tolerance(t));
            expect_close("dK", got.dqkv, cpu_dqkv, 3 * H, H, 2 * H, tolerance(t));
            expect_close("dV", got.dqkv, cpu_dqkv, 3 * H, 2 * H, 3 * H, tolerance(t));
          }
        });
      }
}

// Training attention at bert-large's heads on texts of varied length (B = 32, lengths
// uniform in 16..512 as bench/varlen_data.py draws them, S = the longest), bf16, p = 0.1:
// packed against the padded batch, forward + backward. Printed, never asserted.
TEST_F(FlashAttention, PackedTrainingSpeedAtVariedLengths) {
  std::mt19937_64 gen(7);
  std::vector<int32_t> lengths(32);
  for (int32_t& n : lengths) n = 16 + int32_t(gen() % 497);
  const int S = *std::max_element(lengths.begin(), lengths.end());
  const PackedBatch pb(lengths, S);
  const AttentionDims d{pb.batch, S, 16, 64, 0.125f};
  const DropoutSpec drop{0.1f, 42, 1};
  const int64_t H = d.hidden();
  for (bool packed : {false, true}) {
    const int64_t T = packed ? pb.tokens() : int64_t(d.batch) * S;
    DeviceTensor q(gpu(), DType::BF16, Shape{T, 3 * H}), m(gpu(), DType::I32, Shape{d.batch, S}),
        rs(gpu(), DType::I32, Shape{d.batch + 1}), g(gpu(), DType::BF16, Shape{T, H}),
        stats(gpu(), DType::F32, Shape{d.batch, d.heads, S, 2}), ctx(gpu(), DType::BF16, Shape{T, H}),
        dqkv(gpu(), DType::BF16, Shape{T, 3 * H}),
        work(gpu(), DType::F32, Shape{gpu().attention_workspace_elems(d, DType::BF16)}),
        keep(gpu(), DType::I32, Shape{d.batch, d.heads, S, gpu().attention_keep_words(d, DType::BF16)});
    q.upload(uniform(T * 3 * H, 1, -1.0f, 1.0f));
    g.upload(uniform(T * H, 2, -1.0f, 1.0f));
    m.upload_bytes(pb.mask.data());
    rs.upload_bytes(pb.row_start.data());
    const auto step = [&] {
      if (packed) {
        gpu().attention_forward_packed(q.t, rs.t, d, drop, stats.t, keep.t, ctx.t, work.t);
        gpu().attention_backward_packed(g.t, q.t, ctx.t, rs.t, stats.t, keep.t, d, drop, dqkv.t, work.t);
      } else {
        gpu().attention_forward(q.t, m.t, d, drop, stats.t, keep.t, ctx.t, work.t);
        gpu().attention_backward(g.t, q.t, ctx.t, m.t, stats.t, keep.t, d, drop, dqkv.t, work.t);
      }
    };
    const double ms = test::average_ms(gpu(), step);
    std::printf("  %s: %lld rows of %d x %d, forward + backward %.3f ms\n", packed ? "packed" : "padded",
                (long long)T, d.batch, S, ms);
  }
}

// The forward computes each output element in one place, in one order, so launches in a row
// on the same inputs give the same bits, and write every row (ctx cleared in between).
// An inference forward's tensors (bf16, no statistics, no dropout) for pb, padded or packed,
// qkv uniform in [-scale, scale]; run() launches it on every element marked unwritten and
// returns the context's bits.
struct InferenceForward {
  bool packed;
  int64_t H, T;
  DeviceTensor q, m, rs, ctx, work, stats;
  InferenceForward(Backend& gpu, const AttentionDims& d, const PackedBatch& pb, bool packed, uint64_t seed,
                   float scale)
      : packed(packed),
        H(d.hidden()),
        T(packed ? pb.tokens() : int64_t(d.batch) * d.seq),
        q(gpu, DType::BF16, Shape{T, 3 * H}),
        m(gpu, DType::I32, Shape{d.batch, d.seq}),
        rs(gpu, DType::I32, Shape{d.batch + 1}),
        ctx(gpu, DType::BF16, Shape{T, H}),
        work(gpu, DType::F32, Shape{gpu.attention_workspace_elems(d, DType::BF16)}),
        stats(gpu, DType::F32, Shape{int64_t(d.batch) * d.heads * d.seq * 2}) {
    q.upload(uniform(T * 3 * H, seed, -scale, scale));
    m.upload_bytes(pb.mask.data());
    rs.upload_bytes(pb.row_start.data());
  }
  std::vector<uint16_t> run(Backend& gpu, const AttentionDims& d) {
    Tensor no_stats, no_keep;
    ctx.mark_unwritten();
    if (packed)
      gpu.attention_forward_packed(q.t, rs.t, d, {}, no_stats, no_keep, ctx.t, work.t);
    else
      gpu.attention_forward(q.t, m.t, d, {}, stats.t, no_keep, ctx.t, work.t);
    return ctx.bits();
  }
};

// Before the Q fence in flash_hopper_forward.cu, the Hopper forward's launches at batch 32
// of lengths 16..512, packed and padded, differed in up to 57 Ki elements by up to 0.27
// (H200); at full length, where the producer waits on key stages rather than on Q, they
// did not.
TEST_F(FlashAttention, EveryLaunchInARowGivesTheSameOutput) {
  struct Shape3 {
    int batch, seq, shortest, heads;
  };
  for (const Shape3& sh : {Shape3{32, 512, 16, 16}, Shape3{32, 512, 512, 16}, Shape3{40, 300, 1, 4}}) {
    std::mt19937_64 gen(5);
    std::vector<int32_t> lengths(size_t(sh.batch));
    for (int32_t& n : lengths) n = sh.shortest + int32_t(gen() % uint64_t(sh.seq - sh.shortest + 1));
    const PackedBatch pb(lengths, sh.seq);
    for (bool packed : {true, false}) {
      const AttentionDims d{pb.batch, sh.seq, sh.heads, 64, 0.125f};
      const int64_t H = d.hidden();
      InferenceForward f(gpu(), d, pb, packed, 7, 1.0f);
      const std::string name = fmt::format("{} x {} (lengths from {}), {} heads, {}", sh.batch, sh.seq, sh.shortest,
                                           sh.heads, packed ? "packed" : "padded");
      std::vector<uint16_t> first;
      for (int launch = 0; launch < 6; ++launch) {
        std::vector<uint16_t> bits = f.run(gpu(), d);
        ASSERT_EQ(std::count(bits.begin(), bits.end(), test::kUnwrittenHalf), 0) << name << ", launch " << launch;
        if (launch == 0) {
          first = std::move(bits);
          continue;
        }
        int64_t differ = 0, row = -1;
        for (size_t i = 0; i < bits.size(); ++i)
          if (bits[i] != first[i] && differ++ == 0) row = int64_t(i) / H;
        EXPECT_EQ(differ, 0) << name << ", launch " << launch << ": " << differ
                             << " elements differ from the first launch's, the first in row " << row;
      }
    }
  }
}

// Inference's last layer before a first-token head asks for each sequence's first row
// alone (AttentionDims::first_rows_only): those rows are the whole forward's to the bit,
// packed and padded, every head size, both kernel sets; lengths end inside the query tiles
// and the key blocks, a block's first half (the last block's 64 keys) and its second.
TEST_F(FlashAttention, FirstRowsOnlyAreTheWholeForwardsFirstRows) {
  const std::vector<int32_t> lengths = {1, 64, 65, 77, 128, 129, 200, 256, 300, 511, 512};
  const PackedBatch pb(lengths, 512);
  for (int head_dim : {32, 64, 128})
    for (bool packed : {true, false}) {
      AttentionDims d{pb.batch, pb.seq, 2, head_dim, 1.0f / std::sqrt(float(head_dim))};
      const int64_t H = d.hidden();
      InferenceForward f(gpu(), d, pb, packed, uint64_t(11 + head_dim), 2.0f);
      for_each_kernel_set([&](const std::string& k) {
        const std::string name = fmt::format("{}, head size {}, {}", k, head_dim, packed ? "packed" : "padded");
        std::vector<uint16_t> whole;
        for (bool first_only : {false, true}) {
          d.first_rows_only = first_only;
          std::vector<uint16_t> bits = f.run(gpu(), d);
          if (!first_only) {
            whole = std::move(bits);
            continue;
          }
          for (int b = 0; b < d.batch; ++b) {
            const int64_t row = packed ? pb.row_start[size_t(b)] : int64_t(b) * d.seq;
            EXPECT_TRUE(std::equal(bits.begin() + row * H, bits.begin() + (row + 1) * H, whole.begin() + row * H))
                << name << ": sequence " << b << " (" << lengths[size_t(b)] << " tokens)";
          }
          // Hopper's kernel skips the other rows' work: the longest sequence's last row stays unwritten.
          if (k == "flash" && cuda::flash::hopper_kernels_present()) {
            EXPECT_EQ(bits[size_t((f.T - 1) * H)], test::kUnwrittenHalf) << name;
          }
        }
      });
    }
}

// The same for training: forward with statistics (and dropout), then backward, each step
// in fresh tensors whose unwritten elements read as NaN. dK and dV come from one CTA each in
// a fixed order, so their bits must repeat; dQ is summed by F32 reductions in whatever order
// the CTAs reach them, so only that every element is written.
TEST_F(FlashAttention, EveryTrainingStepInARowGivesTheSameKeyAndValueGradients) {
  std::mt19937_64 gen(9);
  std::vector<int32_t> lengths(32);
  for (int32_t& n : lengths) n = 16 + int32_t(gen() % 497);
  const PackedBatch pb(lengths, 512);
  const AttentionDims d{pb.batch, pb.seq, 16, 64, 0.125f};
  const int64_t H = d.hidden();
  const auto written = [](const std::vector<float>& v) {
    return std::none_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
  };
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const auto key_value_part = [&](const std::vector<float>& dqkv) {
    std::vector<float> kv;
    for (size_t r = 0; r < dqkv.size(); r += size_t(3 * H))
      kv.insert(kv.end(), dqkv.begin() + r + H, dqkv.begin() + r + 3 * H);
    return kv;
  };
  for (bool packed : {true, false})
    for (const DropoutSpec& drop : {DropoutSpec{}, DropoutSpec{0.1f, 42, 1}}) {
      const int64_t T = packed ? pb.tokens() : int64_t(d.batch) * d.seq;
      const std::vector<float> qkv = uniform(T * 3 * H, 11, -1.0f, 1.0f), dctx = uniform(T * H, 12, -1.0f, 1.0f);
      const std::string name = fmt::format("{}, p = {}", packed ? "packed" : "padded", drop.p);
      const TrainingOutputs first = run_training(gpu(), DType::BF16, d, pb, packed, qkv, dctx, drop);
      ASSERT_TRUE(written(first.ctx) && written(first.dqkv)) << name;
      const std::vector<float> first_kv = key_value_part(first.dqkv);
      for (int step = 1; step < 4; ++step) {
        const TrainingOutputs got = run_training(gpu(), DType::BF16, d, pb, packed, qkv, dctx, drop);
        EXPECT_TRUE(written(got.ctx) && written(got.dqkv)) << name << ", step " << step;
        EXPECT_TRUE(same_bits(got.ctx, first.ctx))
            << name << ": step " << step << "'s context differs from the first's";
        EXPECT_TRUE(same_bits(key_value_part(got.dqkv), first_kv))
            << name << ": step " << step << "'s dK, dV differ from the first's";
      }
    }
}

// The inference forward at bert-large's heads on infer_bench's varlen batch (64 texts of
// 16..512 tokens): packed rows against the padded batch and a dense 64 x 512 batch, in
// TFLOP/s of attended work (4 heads d sum len^2). Printed, never asserted.
TEST_F(FlashAttention, PackedInferenceSpeedAtVariedLengths) {
  std::mt19937_64 gen(11);
  std::vector<int32_t> lengths(64);
  for (int32_t& n : lengths) n = 16 + int32_t(gen() % 497);
  const int S = 512;
  const PackedBatch pb(lengths, S);
  double attended = 0;
  for (int32_t n : lengths) attended += double(n) * n;
  for (int mode = 0; mode < 3; ++mode) {  // packed, padded, dense
    const AttentionDims d{pb.batch, S, 16, 64, 0.125f};
    const int64_t H = d.hidden(), T = mode == 0 ? pb.tokens() : int64_t(d.batch) * S;
    DeviceTensor q(gpu(), DType::BF16, Shape{T, 3 * H}), m(gpu(), DType::I32, Shape{d.batch, S}),
        rs(gpu(), DType::I32, Shape{d.batch + 1}), ctx(gpu(), DType::BF16, Shape{T, H}),
        work(gpu(), DType::F32, Shape{gpu().attention_workspace_elems(d, DType::BF16)}),
        stats(gpu(), DType::F32, Shape{int64_t(d.batch) * d.heads * S * 2});
    Tensor no_stats, no_keep;  // inference keeps nothing for a backward
    q.upload(uniform(T * 3 * H, 1, -1.0f, 1.0f));
    if (mode == 2)
      m.upload_bytes(std::vector<int32_t>(size_t(d.batch) * S, 1).data());
    else
      m.upload_bytes(pb.mask.data());
    rs.upload_bytes(pb.row_start.data());
    const DropoutSpec none{};
    const auto step = [&] {
      if (mode == 0)
        gpu().attention_forward_packed(q.t, rs.t, d, none, no_stats, no_keep, ctx.t, work.t);
      else
        gpu().attention_forward(q.t, m.t, d, none, stats.t, no_keep, ctx.t, work.t);
    };
    const double ms = test::average_ms(gpu(), step, 50);
    const double work_flops = 4.0 * d.heads * d.head_dim * (mode == 2 ? double(d.batch) * S * S : attended);
    std::printf("  %s: forward %.3f ms, %.0f TFLOP/s of attended work\n",
                mode == 0 ? "packed" : mode == 1 ? "padded" : "dense 64 x 512", ms, work_flops / ms / 1e9);
  }
}

// Attention at B = 32, S = 512, bf16, forward and backward in TFLOP/s (4 B heads S^2 d for
// forward, 2.5 times that for backward): hone's kernels (Hopper's on a 9.0 GPU), their
// mma.sync set and cuDNN's. Printed, never asserted.
void print_attention_speed(Backend& gpu, const AttentionDims& d) {
  const int64_t T = int64_t(d.batch) * d.seq, H = d.hidden();
  const double fwd_flops = 4.0 * d.batch * d.heads * double(d.seq) * d.seq * d.head_dim, bwd_flops = 2.5 * fwd_flops;
  std::printf("  %d heads of %d:\n", d.heads, d.head_dim);
  const auto measure = [&](Backend& be, const char* name) {
    DeviceTensor q(be, DType::BF16, Shape{T, 3 * H}), m(be, DType::I32, Shape{d.batch, d.seq}),
        g(be, DType::BF16, Shape{T, H}), stats(be, DType::F32, Shape{d.batch, d.heads, d.seq, 2}),
        ctx(be, DType::BF16, Shape{T, H}), dqkv(be, DType::BF16, Shape{T, 3 * H}),
        work(be, DType::F32, Shape{be.attention_workspace_elems(d, DType::BF16)}),
        keep(be, DType::I32, Shape{d.batch, d.heads, d.seq, std::max(be.attention_keep_words(d, DType::BF16), 1)});
    q.upload(uniform(T * 3 * H, 1, -1.0f, 1.0f));
    g.upload(uniform(T * H, 2, -1.0f, 1.0f));
    const std::vector<int32_t> ones(size_t(T), 1);
    m.upload_bytes(ones.data());
    for (float p : {0.0f, 0.1f}) {
      const DropoutSpec drop{p, 42, 1};
      const double f = test::average_ms(be, [&] { be.attention_forward(q.t, m.t, d, drop, stats.t, keep.t, ctx.t, work.t); });
      const double b = test::average_ms(be, [&] {
        be.attention_backward(g.t, q.t, ctx.t, m.t, stats.t, keep.t, d, drop, dqkv.t, work.t);
      });
      std::printf("  %-6s p=%.1f: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)\n", name, p, f,
                  fwd_flops / f / 1e9, b, bwd_flops / b / 1e9);
    }
  };
  measure(gpu, "flash");
  setenv("HONE_ATTENTION", "flash2", 1);
  measure(gpu, "flash2");
  unsetenv("HONE_ATTENTION");
#ifdef HONE_HAVE_CUDNN
  setenv("HONE_ATTENTION", "cudnn", 1);
  auto cudnn = make_cuda_backend({});
  unsetenv("HONE_ATTENTION");
  measure(*cudnn, "cuDNN");
#endif
}

// The other head sizes at the same hidden size (1024): MiniLM's 32, and 128.
TEST_F(FlashAttention, HeadSizeSpeed) {
  for (int head_dim : {32, 128})
    print_attention_speed(gpu(), {32, 512, 1024 / head_dim, head_dim, 1.0f / std::sqrt(float(head_dim))});
}

// BERT-large's attention (16 heads of 64), and a dense bf16 product for the scale.
TEST_F(FlashAttention, BertLargeSpeed) {
  print_attention_speed(gpu(), {32, 512, 16, 64, 0.125f});
  constexpr int64_t N = 8192;  // y = x w^T, 2 N^3 flops
  DeviceTensor x(gpu(), DType::BF16, Shape{N, N}), w(gpu(), DType::BF16, Shape{N, N}), y(gpu(), DType::BF16, Shape{N, N});
  x.upload(uniform(N * N, 3, -1.0f, 1.0f));
  w.upload(uniform(N * N, 4, -1.0f, 1.0f));
  const double ms = test::average_ms(gpu(), [&] { gpu().linear_forward(x.t, w.t, nullptr, y.t); });
  std::printf("  dense bf16 product %lldx%lldx%lld: %.3f ms (%.0f TFLOP/s)\n", (long long)N, (long long)N,
              (long long)N, ms, 2.0 * N * N * N / ms / 1e9);
}

}  // namespace
}  // namespace hone
