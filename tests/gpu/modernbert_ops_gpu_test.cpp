// ModernBERT's ops on the CUDA backend against the CPU reference: rotary embeddings,
// gated activations, mean pooling, LayerNorm without bias and embeddings without a
// position table, in F32 and (where the model runs them so) BF16 and F16. Half inputs
// are the rounded values the CPU also starts from; outputs within the half's rounding.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "device_tensor.h"
#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "test_util.h"

namespace hone {
namespace {

using test::DeviceTensor;
using test::HostTensor;
using test::random;

constexpr double kFp32Tol = 1e-5;

// Each dtype with the tolerance of its stored results against the CPU's F32.
struct Precision {
  DType dtype;
  double tol;
};
constexpr Precision kPrecisions[] = {{DType::F32, kFp32Tol}, {DType::BF16, 8e-3}, {DType::F16, 1e-3}};

// The values a device tensor of dtype d holds for h, as an F32 host tensor.
HostTensor as_stored(Backend& g, DType d, const HostTensor& h) {
  DeviceTensor dev(g, d, h);
  const std::vector<float> v = dev.download();
  HostTensor out(DType::F32, h.t.shape);
  std::copy(v.begin(), v.end(), out.f());
  return out;
}

HostTensor mask_with_lengths(int batch, int seq, const std::vector<int>& lengths) {
  HostTensor m(DType::I32, {batch, seq});
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s) m.i()[b * seq + s] = s < lengths[size_t(b)] ? 1 : 0;
  return m;
}

using ModernBertOps = test::GpuTest;

TEST_F(ModernBertOps, RotaryMatchesCpuAndItsInverseUndoesIt) {
  Backend& g = gpu();
  CpuBackend cpu;
  // Positions up to 600: an ulp of the angle (pos * inv_freq, whose powf may differ by an
  // ulp between the host's libm and CUDA's) stays below 1e-4 rad.
  const int seq = 600, batch = 2, T = seq * batch;
  for (auto [heads, d] : {std::pair<int, int>{3, 16}, {2, 64}, {1, 128}})
    for (const Precision& p : kPrecisions)
      for (bool packed : {false, true}) {
        const int W = 3 * heads * d;
        const float theta = 160000.0f;
        HostTensor ref = as_stored(g, p.dtype, random({T, W}, 1)), rows(DType::I32, {T});
        for (int t = 0; t < T; ++t) rows.i()[t] = (t * 7 + 3) % T;  // a padded-layout row per packed token
        const Tensor cpu_rows = packed ? rows.t : Tensor{};
        DeviceTensor dev(g, p.dtype, ref), dev_rows(g, rows);
        const Tensor gpu_rows = packed ? dev_rows.t : Tensor{};
        HostTensor orig = test::clone(ref);
        ops::rotary(cpu, ref.t, cpu_rows, seq, heads, d, theta, false);
        ops::rotary(g, dev.t, gpu_rows, seq, heads, d, theta, false);
        const std::string at = fmt::format(" ({} heads of {}, {}{})", heads, d, dtype_name(p.dtype), packed ? ", packed" : "");
        test::expect_close("rotated" + at, dev.download(), ref, std::max(p.tol, 2e-4));
        ops::rotary(g, dev.t, gpu_rows, seq, heads, d, theta, true);
        test::expect_close("turned back" + at, dev.download(), orig, std::max(2 * p.tol, 4e-4));
      }
}

TEST_F(ModernBertOps, GatedActivationMatchesCpu) {
  Backend& g = gpu();
  CpuBackend cpu;
  for (auto [R, I] : {std::pair<int, int>{7, 13}, {1024, 2624}})
    for (const Precision& p : kPrecisions)
      for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
        HostTensor x = as_stored(g, p.dtype, random({R, 2 * I}, 1, -3.0f, 3.0f));
        HostTensor dy = as_stored(g, p.dtype, random({R, I}, 2)), y(DType::F32, {R, I}), dx(DType::F32, {R, 2 * I});
        ops::gated_activation_forward(cpu, a, x.t, y.t);
        ops::gated_activation_backward(cpu, a, dy.t, x.t, dx.t);
        DeviceTensor gx(g, p.dtype, x), gdy(g, p.dtype, dy), gy(g, p.dtype, Shape{R, I}), gdx(g, p.dtype, Shape{R, 2 * I});
        ops::gated_activation_forward(g, a, gx.t, gy.t);
        ops::gated_activation_backward(g, a, gdy.t, gx.t, gdx.t);
        const std::string at = fmt::format(" ({} x {}, activation {}, {})", R, I, int(a), dtype_name(p.dtype));
        test::expect_close("y" + at, gy.download(), y, p.tol);
        test::expect_close("dx" + at, gdx.download(), dx, p.tol);
      }
}

TEST_F(ModernBertOps, MeanPoolMatchesCpu) {
  Backend& g = gpu();
  CpuBackend cpu;
  const int B = 3, S = 1000, H = 96;
  HostTensor mask = mask_with_lengths(B, S, {1000, 17, 1});
  for (const Precision& p : kPrecisions) {
    HostTensor hidden = as_stored(g, p.dtype, random({B * S, H}, 1)), dout = as_stored(g, p.dtype, random({B, H}, 2));
    HostTensor out(DType::F32, {B, H}), dhidden(DType::F32, {B * S, H});
    ops::mean_pool_forward(cpu, hidden.t, mask.t, out.t);
    ops::mean_pool_backward(cpu, dout.t, mask.t, dhidden.t);
    DeviceTensor gh(g, p.dtype, hidden), gm(g, mask), gd(g, p.dtype, dout);
    DeviceTensor gout(g, p.dtype, Shape{B, H}), gdh(g, p.dtype, Shape{B * S, H});
    ops::mean_pool_forward(g, gh.t, gm.t, gout.t);
    ops::mean_pool_backward(g, gd.t, gm.t, gdh.t);
    const std::string at = fmt::format(" ({})", dtype_name(p.dtype));
    test::expect_close("pooled" + at, gout.download(), out, p.tol);
    test::expect_close("dhidden" + at, gdh.download(), dhidden, p.tol);
    // Packed inference: each sequence's rows, back to back.
    HostTensor row_start(DType::I32, {B + 1}), packed(DType::F32, {1000 + 17 + 1, H});
    row_start.i()[0] = 0;
    int64_t rows = 0;
    for (int b = 0; b < B; ++b) {
      for (int s = 0; s < S; ++s)
        if (mask.i()[b * S + s])
          std::copy(hidden.f() + (b * S + s) * H, hidden.f() + (b * S + s + 1) * H, packed.f() + H * rows++);
      row_start.i()[b + 1] = int32_t(rows);
    }
    DeviceTensor gpacked(g, p.dtype, packed), grs(g, row_start), gpout(g, p.dtype, Shape{B, H});
    ops::mean_pool_packed(g, gpacked.t, grs.t, gpout.t);
    test::expect_close("packed pooled" + at, gpout.download(), out, p.tol);
  }
}

TEST_F(ModernBertOps, LayerNormWithoutBiasMatchesCpu) {
  Backend& g = gpu();
  CpuBackend cpu;
  for (auto [R, C] : {std::pair<int, int>{7, 13}, {2048, 1024}}) {
    HostTensor x = random({R, C}, 1, -1.0f, 3.0f), gamma = random({C}, 2, 0.5f, 1.5f), dy = random({R, C}, 3);
    HostTensor y(DType::F32, {R, C}), mean(DType::F32, {R}), rstd(DType::F32, {R}), dx(DType::F32, {R, C});
    HostTensor dgamma = test::filled({C}, 0.0f);
    Tensor none;
    ops::layernorm_forward(cpu, x.t, gamma.t, none, 1e-5f, y.t, mean.t, rstd.t);
    ops::layernorm_backward(cpu, dy.t, x.t, gamma.t, mean.t, rstd.t, dx.t, dgamma.t, none);
    DeviceTensor gx(g, x), ggamma(g, gamma), gdy(g, dy), gy(g, DType::F32, Shape{R, C});
    DeviceTensor gmean(g, DType::F32, Shape{R}), grstd(g, DType::F32, Shape{R}), gdx(g, DType::F32, Shape{R, C});
    DeviceTensor gdgamma(g, test::filled({C}, 0.0f));
    ops::layernorm_forward(g, gx.t, ggamma.t, none, 1e-5f, gy.t, gmean.t, grstd.t);
    ops::layernorm_backward(g, gdy.t, gx.t, ggamma.t, gmean.t, grstd.t, gdx.t, gdgamma.t, none);
    const std::string at = fmt::format(" ({} x {})", R, C);
    test::expect_close("y" + at, gy.download(), y, kFp32Tol);
    test::expect_close("dx" + at, gdx.download(), dx, kFp32Tol);
    test::expect_close("dgamma" + at, gdgamma.download(), dgamma, kFp32Tol);
  }
}

TEST_F(ModernBertOps, EmbeddingWithoutPositionTableMatchesCpu) {
  Backend& g = gpu();
  CpuBackend cpu;
  const int T = 3 * 77, H = 48, V = 300;
  HostTensor ids(DType::I32, {T});
  std::mt19937 rng(5);
  for (int t = 0; t < T; ++t) ids.i()[t] = int(rng() % V);
  HostTensor word = random({V, H}, 1), dout = random({T, H}, 2), out(DType::F32, {T, H});
  HostTensor dword = test::filled({V, H}, 0.0f);
  Tensor none;
  ops::embedding_forward(cpu, ids.t, none, none, word.t, none, none, 77, out.t);
  ops::embedding_backward(cpu, dout.t, ids.t, none, none, 77, dword.t, none, none);
  DeviceTensor gids(g, ids), gword(g, word), gdout(g, dout), gout(g, DType::F32, Shape{T, H});
  DeviceTensor gdword(g, test::filled({V, H}, 0.0f));
  ops::embedding_forward(g, gids.t, none, none, gword.t, none, none, 77, gout.t);
  ops::embedding_backward(g, gdout.t, gids.t, none, none, 77, gdword.t, none, none);
  test::expect_close("out", gout.download(), out, kFp32Tol);
  test::expect_close("dword", gdword.download(), dword, kFp32Tol);
}

}  // namespace
}  // namespace hone
