// Parity with transformers on the CPU reference path; the GPU suite runs the same checks
// on CUDA (tests/gpu/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "golden.h"
#include "hone/cpu_backend.h"
#include "hone/safetensors.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

using test::Golden;
using test::GoldenBatch;
using test::golden_args;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsLossAndEveryGradient) {
  CpuBackend be;
  test::check_golden_forward_backward(GetParam(), be);
}

TEST_P(GoldenTest, ThreeOptimizerStepsMatchTrainer) {
  CpuBackend be;
  test::check_golden_training(GetParam(), be);
  test::check_golden_training(GetParam(), be, {}, GradientMemory::StepScoped);
}

// Weight decay applies to exactly the parameters Trainer decays.
TEST_P(GoldenTest, DecayGroupsMatchTrainer) {
  Golden g(GetParam());
  ParamLayout layout(g.config);
  std::set<std::string> decayed;
  for (const auto& n : g.train_args["decay_parameters"]) decayed.insert(n.get<std::string>());
  for (const ParamEntry& e : layout.entries()) {
    EXPECT_EQ(e.decay, decayed.count(e.name) == 1) << e.name;
    const ParamGroup& g = layout.groups()[size_t(e.group)];
    EXPECT_EQ(e.offset < g.decayed_end, e.decay) << e.name;
    EXPECT_TRUE(g.begin <= e.offset && e.offset + e.shape.numel() <= g.end) << e.name;
  }
  std::vector<std::string> names;
  for (const ParamEntry& e : layout.entries()) names.push_back(e.name);
  EXPECT_EQ(names, g.train_args["parameters"].get<std::vector<std::string>>());  // transformers' order
}

// Central differences of the fp32 loss against hone's analytic gradients, independent of
// transformers: a check that backward is the derivative of forward.
TEST_P(GoldenTest, FiniteDifferences) {
  Golden g(GetParam());
  GoldenBatch b(g, "", "");
  CpuBackend be;
  TrainingRun run(golden_args(g, b.batch()), g.config, b.seq(), be);
  load_weights(g.dir + "/model.safetensors", g.config, run.model().layout(), run.host_weights(), 0);
  auto loss = [&] {
    run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), b.batch(), 1.0f, 0);
    return run.take_loss_sum();
  };
  loss();
  std::vector<float> grads(size_t(run.model().layout().count()));
  run.read_grads(grads.data());
  const ParamLayout& layout = run.model().layout();
  float* w = run.host_weights();
  int checked = 0;
  const ModelFamily& f = g.config.family();
  const int last = g.config.num_hidden_layers - 1;
  auto layer = [&](int l, const std::string& name) { return fmt::format("{}.{}.{}.weight", f.layer_prefix, l, name); };
  const bool pre = f.norm == NormPlacement::Pre;  // no LayerNorm before the first attention
  std::vector<std::string> names = {f.head.out + ".weight",
                                    f.head.dense + ".weight",
                                    layer(last, f.layer.ffn_down),
                                    layer(std::min(1, last), f.layer.query),
                                    layer(0, f.layer.key.empty() ? f.layer.ffn_up : f.layer.key),
                                    layer(0, pre ? f.layer.ffn_norm : f.layer.attention_norm),
                                    f.embeddings + "." + f.word_table + ".weight"};
  if (f.positions != PositionIds::Rotary) names.push_back(f.embeddings + ".position_embeddings.weight");
  for (const std::string& name : names) {
    const ParamEntry& e = layout.at(name);
    // The element of this parameter with the largest gradient: a well-conditioned difference.
    int64_t best = e.offset;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i)
      if (std::fabs(grads[size_t(i)]) > std::fabs(grads[size_t(best)])) best = i;
    // A step small enough that no ReLU (DistilBERT's head) changes side within it.
    const float keep = w[best], h = 2e-3f;
    w[best] = keep + h;
    const double up = loss();
    w[best] = keep - h;
    const double down = loss();
    w[best] = keep;
    const double numeric = (up - down) / (2.0 * double(h)), analytic = grads[size_t(best)];
    EXPECT_NEAR(numeric, analytic, 2e-2 * std::fabs(analytic) + 1e-4) << name;
    ++checked;
  }
  EXPECT_EQ(checked, int(names.size()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("bert_cls", "bert_reg", "roberta_cls", "xlm_roberta_reg", "distilbert_cls",
                                           "electra_cls", "modernbert_cls", "modernbert_mean_reg"));

}  // namespace
}  // namespace hone
