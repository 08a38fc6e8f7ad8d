// Weight initialisation's normal draws (hone/normal.h): close to the exact Box-Muller
// values, normally distributed, and the same whether the host writes the weights or a
// backend draws them into its own memory.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/normal.h"
#include "hone/ops.h"
#include "hone/trainer.h"
#include "hone/weights.h"

namespace hone {
namespace {

TEST(NormalDraws, WithinAFewUlpOfBoxMullerInDouble) {
  double worst = 0;
  for (uint64_t k = 0; k < 200000; ++k) {
    const Philox4 r = philox_block(3, 5, k);
    const double u1 = double((r.v[0] >> 8) + 1) / 16777216.0, u2 = double(r.v[1] >> 8) / 16777216.0;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double want[2] = {radius * std::cos(2 * M_PI * u2), radius * std::sin(2 * M_PI * u2)};
    const NormalPair got = normal_pair(3, 5, k, 1.0f);
    // Relative to the radius: an angle's error shows as absolute error of cos and sin.
    worst = std::max({worst, std::abs(got.a - want[0]) / radius, std::abs(got.b - want[1]) / radius});
  }
  EXPECT_LT(worst, 1e-6);  // float's epsilon is 1.2e-7: a few ulp
}

TEST(NormalDraws, HaveTheMomentsOfAStandardNormal) {
  const int pairs = 500000;
  double sum = 0, sq = 0, fourth = 0;
  for (int k = 0; k < pairs; ++k) {
    const NormalPair v = normal_pair(11, 0, uint64_t(k), 2.0f);
    for (double x : {double(v.a) / 2, double(v.b) / 2}) {
      sum += x;
      sq += x * x;
      fourth += x * x * x * x;
    }
  }
  const double n = 2.0 * pairs;
  EXPECT_NEAR(sum / n, 0.0, 5 * std::sqrt(1.0 / n));
  EXPECT_NEAR(sq / n, 1.0, 5 * std::sqrt(2.0 / n));
  EXPECT_NEAR(fourth / n, 3.0, 5 * std::sqrt(96.0 / n));
}

TEST(NormalDraws, BackendFillEqualsThePairs) {
  CpuBackend be;
  std::vector<float> x(1001);
  Tensor t{x.data(), DType::F32, Shape{int64_t(x.size())}, Device::CPU};
  ops::fill_normal(be, t, 0.5f, 7, 9);
  for (size_t k = 0; 2 * k < x.size(); ++k) {
    const NormalPair v = normal_pair(7, 9, k, 0.5f);
    ASSERT_EQ(x[2 * k], v.a) << k;
    if (2 * k + 1 < x.size()) {
      ASSERT_EQ(x[2 * k + 1], v.b) << k;
    }
  }
}

TEST(NormalDraws, RunInitialisesAsTheHostDoes) {
  CpuBackend be;
  ModelConfig c = *builtin_config("bert-tiny");
  c.pad_token_id = 3;
  TrainingArguments a;
  a.per_device_train_batch_size = 2;
  TrainingRun run(a, c, 16, be);
  const ParamLayout& layout = run.model().layout();
  std::vector<float> want(size_t(layout.count())), got(want.size());
  init_weights(c, layout, want.data(), 42);
  run.init_weights(42);
  run.read_weights(got.data());
  ASSERT_EQ(got, want);
  const ParamEntry& word = layout.at("bert.embeddings.word_embeddings.weight");
  for (int j = 0; j < c.hidden_size; ++j) EXPECT_EQ(got[size_t(word.offset + 3 * c.hidden_size + j)], 0.0f);
  EXPECT_NE(got[size_t(word.offset + 2 * c.hidden_size)], 0.0f);
}

}  // namespace
}  // namespace hone
