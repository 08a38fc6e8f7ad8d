// bf16 products on the CPU (`--bf16 --device cpu`, ops/cpu_bf16_products.h): F32 sums of the
// operands rounded to bf16, and in the linear layers nothing else rounded.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/cpu_bf16_products.h"
#include "test_util.h"

namespace hone {
namespace {

using test::HostTensor;
using test::random;

#define SKIP_WITHOUT_ONEDNN()                                         \
  if (std::string why; !cpu_bf16_products_available(&why)) GTEST_SKIP() << why

TEST(CpuBf16, RoundsToNearestEven) {
  EXPECT_EQ(cpu_bf16::round_to_bf16(1.0f + 0x1p-8f), 1.0f);  // halfway: to the even neighbour
  EXPECT_EQ(cpu_bf16::round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(cpu_bf16::round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(cpu_bf16::round_to_bf16(-2.5f), -2.5f);
  EXPECT_TRUE(std::isnan(cpu_bf16::round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(cpu_bf16::round_to_bf16(std::bit_cast<float>(0x7f800001u))));  // not rounded up to inf
  EXPECT_EQ(cpu_bf16::round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
}

// c = op(a) op(b) (+ c) in every layout, against sums in double of the rounded operands; and
// far enough from the unrounded operands' product that the rounding is known to happen.
TEST(CpuBf16, ProductsAreF32SumsOfTheRoundedOperands) {
  SKIP_WITHOUT_ONEDNN();
  const int m = 37, n = 29, k = 53, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool accumulate : {false, true}) {
        const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
        HostTensor a = random({a_rows, lda}, 1), b = random({b_rows, ldb}, 2), c = random({m, ldc}, 3);
        const std::vector<float> c0(c.f(), c.f() + c.n());
        cpu_bf16::product(ta, tb, m, n, k, a.f(), lda, b.f(), ldb, accumulate, c.f(), ldc);
        auto at = [&](HostTensor& t, int ld, bool trans, int r, int col) {
          return trans ? t.f()[col * ld + r] : t.f()[r * ld + col];
        };
        double worst = 0, worst_unrounded = 0;
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            double want = accumulate ? c0[size_t(i * ldc + j)] : 0, unrounded = want, scale = std::fabs(want);
            for (int p = 0; p < k; ++p) {
              const float x = at(a, lda, ta, i, p), y = at(b, ldb, tb, p, j);
              want += double(cpu_bf16::round_to_bf16(x)) * cpu_bf16::round_to_bf16(y);
              unrounded += double(x) * y;
              scale += std::fabs(double(x) * y);
            }
            const double got = c.f()[i * ldc + j];
            worst = std::max(worst, std::fabs(got - want) / scale);
            worst_unrounded = std::max(worst_unrounded, std::fabs(got - unrounded) / scale);
          }
        const std::string at_case = " (ta " + std::to_string(ta) + ", tb " + std::to_string(tb) + ", accumulate " +
                                    std::to_string(accumulate) + ")";
        EXPECT_LT(worst, 1e-6) << at_case;
        EXPECT_GT(worst_unrounded, 1e-4) << "the operands were not rounded to bf16" << at_case;
        for (int i = 0; i < m; ++i)  // the padding past n is not written
          for (int j = n; j < ldc; ++j) EXPECT_EQ(c.f()[i * ldc + j], c0[size_t(i * ldc + j)]) << at_case;
      }
}

// A linear layer forward and backward with bf16 products equals the F32 backend's on
// operands rounded beforehand: nothing but the products' operands is rounded (the bias,
// the bias gradient's column sums and the accumulations stay F32).
TEST(CpuBf16, LinearLayersRoundOnlyTheProductsOperands) {
  SKIP_WITHOUT_ONEDNN();
  const int64_t m = 24, k = 40, n = 33;
  CpuBackend bf16(true), f32;
  HostTensor x = random({m, k}, 1), w = random({n, k}, 2), b = random({n}, 3), dy = random({m, n}, 4);
  auto rounded = [](const HostTensor& t) {
    HostTensor r = test::clone(t);
    for (int64_t i = 0; i < r.n(); ++i) r.f()[i] = cpu_bf16::round_to_bf16(r.f()[i]);
    return r;
  };
  const HostTensor xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
  HostTensor y1 = test::filled({m, n}, 0), y2 = test::filled({m, n}, 0);
  ops::linear_forward(bf16, x.t, w.t, &b.t, y1.t);
  ops::linear_forward(f32, xr.t, wr.t, &b.t, y2.t);
  // The sums' order differs (AMX tiles against OpenBLAS's F32 kernels): a few F32 ulps of
  // sums of |values| up to 40. Anything else rounded to bf16 (the bias, the accumulated
  // gradients) would be off by 2^-9 of itself, 1e-3 and more.
  auto close = [](const char* what, HostTensor& got, HostTensor& want) {
    EXPECT_LT(test::norm_rel_error(got.f(), want.f(), want.n()), 1e-6) << what;
    double worst = 0;
    for (int64_t i = 0; i < want.n(); ++i) worst = std::max(worst, double(std::fabs(got.f()[i] - want.f()[i])));
    EXPECT_LT(worst, 5e-5) << what;
  };
  close("y", y1, y2);
  // Backward adds to dx (accumulate) and dw, as gradient accumulation does.
  HostTensor dx1 = random({m, k}, 5), dx2 = random({m, k}, 5), dw1 = random({n, k}, 6), dw2 = random({n, k}, 6),
             db1 = test::filled({n}, 0), db2 = test::filled({n}, 0);
  ops::linear_backward(bf16, dy.t, x.t, w.t, &dx1.t, true, dw1.t, &db1.t);
  ops::linear_backward(f32, dyr.t, xr.t, wr.t, &dx2.t, true, dw2.t, &db2.t);
  close("dx", dx1, dx2);
  close("dw", dw1, dw2);
  HostTensor db_unrounded = test::filled({n}, 0), dw_scratch = random({n, k}, 6);
  ops::linear_backward(f32, dy.t, x.t, w.t, nullptr, false, dw_scratch.t, &db_unrounded.t);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(db1.f()[i], db_unrounded.f()[i]) << "db is F32 column sums of dy";
}

}  // namespace
}  // namespace hone
