// The feed-forward block's product and activation together (linear_activation_forward,
// activation_linear_backward) on the GPU against the CPU reference, which runs the unfused
// ops in sequence. The tanh GELU runs in cuBLASLt's epilogues, the erf GELU's forward in
// hone's Hopper product (hopper_gemm.h) where it runs; elsewhere the erf GELU, ReLU and
// widths cuBLASLt's aux matrix cannot take (not a multiple of 8) run unfused, and must agree
// too.
// Inputs are rounded to bf16, so every dtype holds the same numbers as the F32 reference,
// and TF32 (10 explicit mantissa bits) multiplies them exactly, as F32 does.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda/hopper_gemm.h"
#include "hone/cpu_backend.h"
#include "hone/error.h"
#include "hone/cuda.h"
#include "hone/ops.h"
#include "device_tensor.h"
#include "test_util.h"

namespace hone {
namespace {

using test::clone;
using test::DeviceTensor;
using test::expect_close;
using test::HostTensor;
using test::random;
using test::round_to;

// The GPU's multiprocessors, as the backend counts them for the Hopper product.
int multiprocessors() {
  int device = 0, sms = 0;
  test::cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  test::cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

class GpuLinearActivation : public test::GpuTest {
 protected:
  CpuBackend cpu;
};

HostTensor representable(Shape s, uint64_t seed, float lo, float hi) {
  HostTensor h = random(s, seed, lo, hi);
  for (int64_t i = 0; i < h.n(); ++i) h.f()[i] = round_to(h.f()[i], DType::BF16);
  return h;
}

// Roundings of a half output allowed against the exact value: pre and dx-like outputs are
// rounded once; the activation's output is the GELU of the unrounded product (epilogue) or
// of the rounded pre (unfused), so one more. The F32 products are exact up to summation
// order (inputs with 8 significant bits, K <= 256), so F32 holds 1e-5, which also tells the
// erf GELU from the tanh one (they differ by up to 4.7e-4 where |y| is about 2.7, 1e-4 of
// the largest |y| here).
double tolerance(DType t, int roundings) {
  if (t == DType::F32) return 1e-5;
  return roundings * (t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11)) + 1e-4;
}

TEST_F(GpuLinearActivation, MatchesTheUnfusedCpuOpsInEveryDtype) {
  std::unique_ptr<Backend> tf32 = make_cuda_backend({.tf32 = true});
  struct Variant {
    DType t;
    Backend* be;
    const char* name;
  };
  const Variant variants[] = {{DType::F32, &gpu(), "F32"}, {DType::F32, tf32.get(), "TF32"},
                              {DType::BF16, &gpu(), "BF16"}, {DType::F16, &gpu(), "F16"}};
  struct Case {
    int m, k, n;
  };
  // The second and third run the tanh GELU in the epilogue; the first's widths (13 inputs,
  // 20 features) cannot, forward or backward. The fourth runs the erf GELU's forward
  // in the Hopper product where it runs (at least two tiles of 128 x 128 an SM), with
  // a last tile of rows past the end and two slices of k a tile, so that the producer's
  // ring of four stages turns over between the consumers within each pass.
  for (const Case& c : {Case{7, 13, 20}, Case{64, 96, 128}, Case{512, 256, 1024}, Case{2100, 128, 2048}}) {
    for (Activation a : {Activation::GeluTanh, Activation::Gelu, Activation::Relu}) {
      for (const Variant& v : variants) {
        Backend& g = *v.be;
        const DType t = v.t;
        const int M = c.m, K = c.k, N = c.n;
        const std::string at = fmt::format(" M={} K={} N={} activation {} {}", M, K, N, int(a), v.name);
        // Forward: pre = x w^T + b spans about [-4, 4], where the GELUs bend.
        HostTensor x = representable({M, K}, 1, -1.0f, 1.0f), w = representable({N, K}, 2, -0.6f, 0.6f),
                   b = representable({N}, 3, -1.0f, 1.0f);
        HostTensor pre = test::filled({M, N}, 0), y = test::filled({M, N}, 0);
        cpu.linear_activation_forward(a, x.t, w.t, &b.t, pre.t, y.t);
        DeviceTensor gx(g, t, x), gw(g, t, w), gb(g, t, b), gpre(g, t, Shape{M, N}), gy(g, t, Shape{M, N});
        ops::linear_activation_forward(g, a, gx.t, gw.t, &gb.t, gpre.t, gy.t);
        expect_close("pre" + at, gpre.download(), pre, tolerance(t, 1));
        expect_close("y" + at, gy.download(), y, tolerance(t, 2));
        // Inference keeps no pre: y alone (the erf GELU in the Hopper product where it runs).
        DeviceTensor gy_alone(g, t, Shape{M, N});
        Tensor no_pre;
        ops::linear_activation_forward(g, a, gx.t, gw.t, &gb.t, no_pre, gy_alone.t);
        expect_close("y without pre" + at, gy_alone.download(), y, tolerance(t, 2));

        // Backward: the product after the activation reads act(pre) [M, N] with weights
        // w2 [K, N], and its output gradient is dy [M, K]; act(pre) is recomputed.
        HostTensor dy = representable({M, K}, 4, -1.0f, 1.0f), pre_b = representable({M, N}, 6, -4.0f, 4.0f),
                   w2 = representable({K, N}, 7, -0.6f, 0.6f);
        // Accumulated into: dw, db and db_pre (the bias gradient of the product that made pre).
        HostTensor dw0 = random({K, N}, 8), db0 = random({K}, 9), dbp0 = random({N}, 10);
        HostTensor act = test::filled({M, N}, 0), dpre = test::filled({M, N}, 0), dw = clone(dw0), db = clone(db0),
                   dbp = clone(dbp0);
        cpu.activation_linear_backward(a, dy.t, pre_b.t, w2.t, act.t, dpre.t, dw.t, &db.t, &dbp.t);
        DeviceTensor gdy(g, t, dy), gpre_b(g, t, pre_b), gw2(g, t, w2), gact(g, t, Shape{M, N}),
            gdpre(g, t, Shape{M, N});
        DeviceTensor gdw(g, DType::F32, dw0), gdb(g, DType::F32, db0), gdbp(g, DType::F32, dbp0);
        ops::activation_linear_backward(g, a, gdy.t, gpre_b.t, gw2.t, gact.t, gdpre.t, gdw.t, &gdb.t, &gdbp.t);
        expect_close("recomputed act" + at, gact.download(), act, tolerance(t, 1));
        // The unfused path rounds dy w to the dtype before multiplying by act'(pre). In F32,
        // cuBLASLt's GELU gradient is off by up to 1.1e-5 of the largest |dpre| (H200, 512 x
        // 256 x 1024), so 3e-5 there: still far below the 8.7e-4 by which the erf GELU's
        // gradient differs from the tanh one's.
        expect_close("dpre" + at, gdpre.download(), dpre, t == DType::F32 ? 3e-5 : tolerance(t, 2));
        // dw reads the recomputed act, rounded to the dtype (the CPU's is exact), and TF32
        // rounds it again to 10 bits in the product (2^-11 = 4.9e-4).
        expect_close("dw (F32, accumulated)" + at, gdw.download(), dw, v.be == tf32.get() ? 1e-3 : tolerance(t, 1));
        expect_close("db (F32, accumulated)" + at, gdb.download(), db, 1e-5);
        // Sums over M rows of dpre, each within its tolerance above: twice it.
        expect_close("db_pre (F32, accumulated)" + at, gdbp.download(), dbp,
                     t == DType::F32 ? 3e-5 : tolerance(t, 4));
      }
    }
  }
}

// Whether the activation ran in the product's epilogue shows in bf16: the epilogue applies
// it to the unrounded F32 product, the unfused ops to the product rounded to bf16. So the
// tanh GELU's outputs (forward y, backward dpre) differ from "the unfused ops on the rounded
// values" in many elements (H200: 36% and 26%), and the erf GELU's run unfused in few:
// those where 1 + erf(x) cancels (x below about -3) and the GPU's erff and the CPU's
// std::erf, a few F32 ulps apart there, round to neighbouring bf16 values (1.5% and 0.4%).
// The erf GELU's forward runs in hone's Hopper product where it runs, pre kept or not; that
// epilogue rounds the pre-activation to bf16 before the GELU, as the unfused ops do, so it
// matches them in all but a few elements too.
TEST_F(GpuLinearActivation, TheGeluEpiloguesRunWhereTheyShould) {
  Backend& g = gpu();
  const DType t = DType::BF16;
  const int M = 2176, K = 256, N = 2048;  // 272 tiles of 128 x 128: the Hopper product takes it
  auto host = [&](const std::vector<float>& v) {  // an [M, N] download as an F32 host tensor
    HostTensor h = test::filled({M, N}, 0);
    std::copy(v.begin(), v.end(), h.f());
    return h;
  };
  auto differing = [&](const std::vector<float>& got, const HostTensor& unfused) {
    const float* u = unfused.t.f32();
    int64_t n = 0;
    for (int64_t i = 0; i < unfused.t.numel(); ++i) n += got[size_t(i)] != round_to(u[i], t);
    return double(n) / double(unfused.t.numel());
  };
  HostTensor x = representable({M, K}, 1, -1.0f, 1.0f), w = representable({N, K}, 2, -0.6f, 0.6f);
  HostTensor dy = representable({M, N}, 3, -1.0f, 1.0f);
  for (Activation a : {Activation::GeluTanh, Activation::Gelu}) {
    DeviceTensor gx(g, t, x), gw(g, t, w), gpre(g, t, Shape{M, N}), gy(g, t, Shape{M, N});
    ops::linear_activation_forward(g, a, gx.t, gw.t, nullptr, gpre.t, gy.t);
    HostTensor pre = host(gpre.download()), y_unfused = test::filled({M, N}, 0);
    cpu.activation_forward(a, pre.t, y_unfused.t);
    const double forward = differing(gy.download(), y_unfused);
    DeviceTensor gy_alone(g, t, Shape{M, N});  // inference: no pre kept
    Tensor no_pre;
    ops::linear_activation_forward(g, a, gx.t, gw.t, nullptr, no_pre, gy_alone.t);
    const double alone = differing(gy_alone.download(), y_unfused);

    // Backward: the product after the activation maps its N features to K (weights [K, N]).
    HostTensor w2 = representable({K, N}, 4, -0.6f, 0.6f), dout = representable({M, K}, 5, -1.0f, 1.0f);
    DeviceTensor gdout(g, t, dout), gw2(g, t, w2), gact(g, t, Shape{M, N}), gdpre(g, t, Shape{M, N});
    DeviceTensor gdw(g, DType::F32, Shape{K, N});
    ops::fill(g, gdw.t, 0.0f);
    ops::activation_linear_backward(g, a, gdout.t, gpre.t, gw2.t, gact.t, gdpre.t, gdw.t, nullptr);
    // The unfused ops on bf16 values: d_act = dout w2 rounded to bf16, then times act'(pre).
    HostTensor d_act = test::filled({M, N}, 0), w2_t = test::filled({N, K}, 0), dpre_unfused = test::filled({M, N}, 0);
    for (int r = 0; r < K; ++r)
      for (int c = 0; c < N; ++c) w2_t.f()[c * K + r] = w2.f()[r * N + c];
    cpu.linear_forward(dout.t, w2_t.t, nullptr, d_act.t);  // dout w2 = dout (w2^T)^T
    for (int64_t i = 0; i < d_act.n(); ++i) d_act.f()[i] = round_to(d_act.f()[i], t);
    cpu.activation_backward(a, d_act.t, pre.t, dpre_unfused.t);
    const double backward = differing(gdpre.download(), dpre_unfused);
    std::printf("[activation %d] bf16 outputs unlike the unfused ops': forward %.2f%% (without pre %.2f%%), "
                "backward %.2f%%\n", int(a), 100 * forward, 100 * alone, 100 * backward);
    if (a == Activation::GeluTanh) {
      EXPECT_GT(forward, 0.1) << "the tanh GELU forward did not run in the epilogue";
      EXPECT_GT(alone, 0.1) << "the tanh GELU forward without pre did not run in the epilogue";
      EXPECT_GT(backward, 0.1) << "the tanh GELU gradient did not run in the epilogue";
    } else {
      EXPECT_LT(forward, 0.05) << "the erf GELU forward keeping pre is not the unfused ops";
      // The Hopper product's epilogue too takes the GELU of the rounded pre-activation, as
      // the unfused ops do; only its sums' order differs from cuBLASLt's.
      EXPECT_LT(alone, 0.05) << "the erf GELU forward without pre is not the unfused ops";
      EXPECT_LT(backward, 0.05) << "the erf GELU gradient is not the unfused ops";
    }
  }
}

// Where the products' sums are exact (inputs on coarse grids, K = 64), the Hopper product's
// pre-activations are cuBLASLt's to the bit, so its GELU (a table of the bf16 values for
// magnitudes in [2^-24, 16), erff for the rest) must equal the GPU's GELU pass on them bit
// for bit, signs of zeros included, with pre written (training) or not (inference). The
// bias spreads the pre-activations past +-16 and the rows end in a part tile.
TEST_F(GpuLinearActivation, TheHopperGeluProductIsTheGeluPassBitForBit) {
  Backend& g = gpu();
  const int64_t M = 2200, K = 64, N = 2048;  // 18 x 16 tiles, the last row of tiles 24 rows
  if (!cuda::hopper_gelu_product_runs(DType::BF16, M, N, K, multiprocessors(), {}))
    GTEST_SKIP() << "hone's Hopper GELU product does not run here (needs sm_90a machine code and an SM 9.0 GPU)";
  auto grid = [](HostTensor h, float step) {
    for (int64_t i = 0; i < h.n(); ++i) h.f()[i] = std::round(h.f()[i] / step) * step;
    return h;
  };
  // Products are multiples of 2^-5 and at most 1, so fp32 sums of 64 are exact in any order.
  HostTensor x = grid(random({M, K}, 11, -1.0f, 1.0f), 0.25f), w = grid(random({N, K}, 12, -1.0f, 1.0f), 0.125f);
  HostTensor b = grid(random({N}, 13, -14.0f, 14.0f), 0.5f);
  DeviceTensor gx(g, DType::BF16, x), gw(g, DType::BF16, w), gb(g, DType::BF16, b);
  DeviceTensor pre(g, DType::BF16, Shape{M, N}), unfused(g, DType::BF16, Shape{M, N}), fused(g, DType::BF16, Shape{M, N});
  ops::linear_forward(g, gx.t, gw.t, &gb.t, pre.t);
  g.activation_forward(Activation::Gelu, pre.t, unfused.t);
  Tensor no_pre;
  ops::linear_activation_forward(g, Activation::Gelu, gx.t, gw.t, &gb.t, no_pre, fused.t);
  // Training keeps pre for backward: the same kernel writes it too.
  DeviceTensor kept_pre(g, DType::BF16, Shape{M, N}), kept_y(g, DType::BF16, Shape{M, N});
  ops::linear_activation_forward(g, Activation::Gelu, gx.t, gw.t, &gb.t, kept_pre.t, kept_y.t);
  auto bits = [&](const DeviceTensor& d) {
    std::vector<uint16_t> v(size_t(M * N));
    d.download_bytes(v.data());
    return v;
  };
  auto differing = [](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    int64_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };
  const std::vector<uint16_t> want = bits(unfused);
  EXPECT_EQ(differing(bits(fused), want), 0) << "GELUs without pre, of " << want.size();
  EXPECT_EQ(differing(bits(kept_y), want), 0) << "GELUs keeping pre, of " << want.size();
  EXPECT_EQ(differing(bits(kept_pre), bits(pre)), 0) << "pre-activations, of " << want.size();
  const std::vector<float> p = pre.download();
  const int64_t outside = std::count_if(p.begin(), p.end(), [](float v) { return !(std::fabs(v) >= 0x1p-24f && std::fabs(v) < 16.0f); });
  EXPECT_GT(outside, int64_t(p.size()) / 100) << "too few pre-activations outside the table to test the erff path";
}

// Every bf16 pre-activation, through the Hopper product's epilogue: x's rows are (1, 0, ..., 0)
// and w's row j is (v_j, 0, ..., 0) for the 65536 bf16 bit patterns v_j, so that pre = v (but
// zeros and subnormals), and each GELU (looked up in the table, or by erff outside it) must be
// the GPU's GELU pass's to the bit (NaNs as NaNs).
TEST_F(GpuLinearActivation, TheHopperGeluProductIsTheGeluPassForEveryBf16Value) {
  Backend& g = gpu();
  const int64_t M = 256, K = 64, N = 65536;
  if (!cuda::hopper_gelu_product_runs(DType::BF16, M, N, K, multiprocessors(), {}))
    GTEST_SKIP() << "hone's Hopper GELU product does not run here (needs sm_90a machine code and an SM 9.0 GPU)";
  std::vector<uint16_t> x(size_t(M * K), 0), w(size_t(N * K), 0);
  for (int64_t i = 0; i < M; ++i) x[size_t(i * K)] = 0x3f80;  // 1.0
  for (int64_t j = 0; j < N; ++j) w[size_t(j * K)] = uint16_t(j);
  DeviceTensor gx(g, DType::BF16, Shape{M, K}), gw(g, DType::BF16, Shape{N, K});
  gx.upload_bytes(x.data());
  gw.upload_bytes(w.data());
  DeviceTensor pre(g, DType::BF16, Shape{M, N}), fused(g, DType::BF16, Shape{M, N}), want(g, DType::BF16, Shape{M, N});
  Tensor no_pre;
  ops::linear_activation_forward(g, Activation::Gelu, gx.t, gw.t, nullptr, no_pre, fused.t);
  ops::linear_forward(g, gx.t, gw.t, nullptr, pre.t);
  g.activation_forward(Activation::Gelu, pre.t, want.t);
  const std::vector<uint16_t> got = fused.bits(), expected = want.bits(), p = pre.bits();
  auto is_nan = [](uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; };
  int64_t wrong = 0, pre_wrong = 0;
  std::string first;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const size_t at = size_t(i * N + j);
      // Zeros sum to +0, and subnormals may be flushed: the rest are v itself.
      const bool plain = (j & 0x7f80) != 0 && !is_nan(uint16_t(j));
      pre_wrong += plain && p[at] != uint16_t(j);
      const bool same = got[at] == expected[at] || (is_nan(got[at]) && is_nan(expected[at]));
      if (!same && wrong++ == 0) first = fmt::format("pre {:#06x}: {:#06x}, the pass {:#06x}", j, got[at], expected[at]);
    }
  EXPECT_EQ(pre_wrong, 0) << "the product did not give pre = v";
  EXPECT_EQ(wrong, 0) << "GELUs unlike the pass's, of " << M * N << "; the first: " << first;
}

// bert-large's feed-forward up-projection with the erf GELU at 16384 tokens, bf16, in
// TFLOP/s: the op keeping pre (training) and without it (inference), each the Hopper
// product where it runs (else cuBLASLt's product, then the GELU pass), and the product
// alone for the scale.
// Printed, never asserted.
TEST_F(GpuLinearActivation, GeluProductSpeed) {
  Backend& g = gpu();
  const int64_t M = 16384, K = 1024, N = 4096;
  DeviceTensor x(g, DType::BF16, representable({M, K}, 1, -1.0f, 1.0f)),
      w(g, DType::BF16, representable({N, K}, 2, -0.05f, 0.05f)), b(g, DType::BF16, representable({N}, 3, -1.0f, 1.0f)),
      pre(g, DType::BF16, Shape{M, N}), y(g, DType::BF16, Shape{M, N});
  const double flops = 2.0 * double(M) * double(N) * double(K);
  Tensor no_pre;
  const double kept = test::average_ms(g, [&] { ops::linear_activation_forward(g, Activation::Gelu, x.t, w.t, &b.t, pre.t, y.t); });
  const double alone = test::average_ms(g, [&] { ops::linear_activation_forward(g, Activation::Gelu, x.t, w.t, &b.t, no_pre, y.t); });
  const double product = test::average_ms(g, [&] { ops::linear_forward(g, x.t, w.t, &b.t, pre.t); });
  std::printf("  keeping pre %.3f ms (%.0f TFLOP/s); without pre%s %.3f ms (%.0f); the product alone %.3f ms (%.0f)\n",
              kept, flops / kept / 1e9, cuda::hopper_gelu_product_runs(DType::BF16, M, N, K, multiprocessors(), {}) ? " (Hopper product)" : "",
              alone, flops / alone / 1e9, product, flops / product / 1e9);
}

// HONE_GELU_EPILOGUE is "on" (or unset) or "off"; any other value is an error that lists the
// choices (no GPU needed).
TEST(GeluEpilogueChoice, UnknownValuesAreAnErrorListingTheChoices) {
  setenv("HONE_GELU_EPILOGUE", "of", 1);
  try {
    (void)cuda::gelu_epilogue_allowed();
    ADD_FAILURE() << "HONE_GELU_EPILOGUE=of was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* s : {"HONE_GELU_EPILOGUE=of", "\"on\"", "\"off\""})
      EXPECT_NE(what.find(s), std::string::npos) << what;
  }
  setenv("HONE_GELU_EPILOGUE", "off", 1);
  EXPECT_FALSE(cuda::gelu_epilogue_allowed());
  EXPECT_FALSE(cuda::hopper_gelu_product_runs(DType::BF16, 16384, 4096, 1024, 132, {}));
  setenv("HONE_GELU_EPILOGUE", "on", 1);
  EXPECT_TRUE(cuda::gelu_epilogue_allowed());
  unsetenv("HONE_GELU_EPILOGUE");
  EXPECT_TRUE(cuda::gelu_epilogue_allowed());
}

}  // namespace
}  // namespace hone
