// Parity with transformers: fixtures made by tools/make_fixtures.py (float64 reference,
// transformers 5.17) against hone's fp32 CPU path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "hone/cpu_backend.h"
#include "hone/safetensors.h"
#include "hone/schedule.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

struct Golden {
  std::string dir;
  BertConfig config;
  SafetensorsFile file;
  nlohmann::json train_args;
  explicit Golden(const std::string& name)
      : dir(test::fixtures_dir() + "/" + name),
        config(BertConfig::load(dir + "/config.json")),
        file(dir + "/golden.safetensors") {
    std::ifstream f(dir + "/train_args.json");
    train_args = nlohmann::json::parse(f);
  }
  std::vector<float> floats(const std::string& name) const {
    const SafetensorsEntry* e = file.find(name);
    EXPECT_NE(e, nullptr) << name;
    std::vector<float> v(size_t(e->numel()));
    file.read_f32(*e, v.data(), e->numel());
    return v;
  }
  std::vector<int32_t> ints(const std::string& name) const {
    std::vector<int32_t> out;
    for (float x : floats(name)) out.push_back(int32_t(x));
    return out;
  }
};

// The batch named `prefix` + field + `suffix`, and a run over it.
struct GoldenBatch {
  std::vector<int32_t> ids, mask, types;
  std::vector<float> labels;
  GoldenBatch(const Golden& g, const std::string& prefix, const std::string& suffix)
      : ids(g.ints(prefix + "input_ids" + suffix)),
        mask(g.ints(prefix + "attention_mask" + suffix)),
        types(g.ints(prefix + "token_type_ids" + suffix)),
        labels(g.floats(prefix + "labels" + suffix)) {}
  int batch() const { return int(labels.size()); }
  int seq() const { return int(ids.size() / labels.size()); }
};

TrainingArguments golden_args(const Golden& g, int batch) {
  TrainingArguments a;
  a.per_device_train_batch_size = batch;
  a.learning_rate = g.train_args["learning_rate"];
  a.weight_decay = g.train_args["weight_decay"];
  a.warmup_steps = g.train_args["warmup_steps"];
  a.max_grad_norm = g.train_args["max_grad_norm"];
  a.adam_beta1 = g.train_args["adam_beta1"];
  a.adam_beta2 = g.train_args["adam_beta2"];
  a.adam_epsilon = g.train_args["adam_epsilon"];
  a.max_steps = g.train_args["max_steps"];
  return a;
}

double max_abs(const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(b[i])));
  return m;
}

// max |a - b| over max |b|: an error relative to the tensor's scale. `floor` stands in
// for tensors that are zero in exact arithmetic (the key bias gets no gradient, since
// softmax ignores a constant added to a row), where both sides hold only rounding.
double scaled_error(const float* a, const float* b, int64_t n, double floor = 0) {
  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::max(err, std::fabs(double(a[i]) - b[i]));
  const double scale = std::max(max_abs(b, n), floor);
  return scale > 0 ? err / scale : err;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsLossAndEveryGradient) {
  Golden g(GetParam());
  GoldenBatch b(g, "", "");
  CpuBackend be;
  TrainingRun run(golden_args(g, b.batch()), g.config, b.seq(), be);
  LoadReport r = load_weights(g.dir + "/model.safetensors", g.config, run.model().layout(), run.host_weights(), 0);
  EXPECT_TRUE(r.initialized.empty());
  EXPECT_TRUE(r.unused.empty());

  std::vector<float> logits(size_t(b.batch() * g.config.num_labels));
  run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), b.batch(), 1.0f, 0, logits.data());
  const std::vector<float> want_logits = g.floats("logits");
  const double logits_err = test::max_rel_error(logits.data(), want_logits.data(), int64_t(logits.size()), 1e-3);
  const double loss = run.take_loss_sum(), want_loss = g.floats("loss")[0];
  const double loss_err = std::fabs(loss - want_loss) / std::fabs(want_loss);
  EXPECT_LT(logits_err, 1e-5);
  EXPECT_LT(loss_err, 1e-5);

  double worst = 0, largest = 0;
  std::string worst_name;
  const float* grads = run.model().grads().f32();
  for (const ParamEntry& e : run.model().layout().entries())
    largest = std::max(largest, max_abs(g.floats("grad." + e.name).data(), e.shape.numel()));
  for (const ParamEntry& e : run.model().layout().entries()) {
    const std::vector<float> want = g.floats("grad." + e.name);
    ASSERT_EQ(int64_t(want.size()), e.shape.numel()) << e.name;
    const double err = scaled_error(grads + e.offset, want.data(), e.shape.numel(), 1e-6 * largest);
    EXPECT_LT(err, 1e-4) << e.name;
    if (err > worst) worst = err, worst_name = e.name;
  }
  std::printf("[%s] logits rel err %.2e, loss rel err %.2e, worst gradient err %.2e (%s)\n", GetParam().c_str(),
              logits_err, loss_err, worst, worst_name.c_str());
}

TEST_P(GoldenTest, ThreeOptimizerStepsMatchTrainer) {
  Golden g(GetParam());
  GoldenBatch first(g, "train.", ".0");
  const TrainingArguments a = golden_args(g, first.batch());
  CpuBackend be;
  TrainingRun run(a, g.config, first.seq(), be);
  load_weights(g.dir + "/model.safetensors", g.config, run.model().layout(), run.host_weights(), 0);
  const std::vector<float> losses = g.floats("train.loss"), norms = g.floats("train.grad_norm"),
                           lrs = g.floats("train.lr");
  double worst_loss = 0, worst_norm = 0;
  for (int k = 0; k < int(a.max_steps); ++k) {
    GoldenBatch b(g, "train.", fmt::format(".{}", k));
    run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), b.batch(), 1.0f, uint64_t(k));
    const double lr = learning_rate_at(a, k, a.max_steps);
    EXPECT_NEAR(lr, lrs[size_t(k)], 1e-9) << "step " << k;
    run.optimizer_step(lr, k + 1);
    const double loss_err = std::fabs(run.take_loss_sum() - losses[size_t(k)]) / std::fabs(losses[size_t(k)]);
    const double norm_err = std::fabs(run.last_grad_norm() - norms[size_t(k)]) / norms[size_t(k)];
    EXPECT_LT(loss_err, 1e-5) << "step " << k;
    EXPECT_LT(norm_err, 1e-5) << "step " << k;
    worst_loss = std::max(worst_loss, loss_err);
    worst_norm = std::max(worst_norm, norm_err);
  }
  double worst = 0;
  const float* w = run.host_weights();
  for (const ParamEntry& e : run.model().layout().entries()) {
    const std::vector<float> want = g.floats("final." + e.name);
    const double err = scaled_error(w + e.offset, want.data(), e.shape.numel());
    EXPECT_LT(err, 1e-5) << e.name;
    worst = std::max(worst, err);
  }
  std::printf("[%s] 3 steps: loss rel err %.2e, grad-norm rel err %.2e, worst final weight err %.2e\n",
              GetParam().c_str(), worst_loss, worst_norm, worst);
}

// Weight decay applies to exactly the parameters Trainer decays.
TEST_P(GoldenTest, DecayGroupsMatchTrainer) {
  Golden g(GetParam());
  ParamLayout layout(g.config);
  std::set<std::string> decayed;
  for (const auto& n : g.train_args["decay_parameters"]) decayed.insert(n.get<std::string>());
  for (const ParamEntry& e : layout.entries()) {
    EXPECT_EQ(e.decay, decayed.count(e.name) == 1) << e.name;
    EXPECT_EQ(e.offset < layout.decayed_count(), e.decay) << e.name;
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
  const std::vector<float> grads(run.model().grads().f32(), run.model().grads().f32() + run.model().layout().count());
  const ParamLayout& layout = run.model().layout();
  float* w = run.host_weights();
  int checked = 0;
  for (const char* name : {"classifier.weight", "bert.pooler.dense.weight", "bert.encoder.layer.2.output.dense.weight",
                           "bert.encoder.layer.1.attention.self.query.weight",
                           "bert.encoder.layer.0.attention.self.key.weight",
                           "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                           "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight"}) {
    const ParamEntry& e = layout.at(name);
    // The element of this parameter with the largest gradient: a well-conditioned difference.
    int64_t best = e.offset;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i)
      if (std::fabs(grads[size_t(i)]) > std::fabs(grads[size_t(best)])) best = i;
    const float keep = w[best], h = 1e-2f;
    w[best] = keep + h;
    const double up = loss();
    w[best] = keep - h;
    const double down = loss();
    w[best] = keep;
    const double numeric = (up - down) / (2.0 * double(h)), analytic = grads[size_t(best)];
    EXPECT_NEAR(numeric, analytic, 2e-2 * std::fabs(analytic) + 1e-4) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::Values("bert_cls", "bert_reg"));

}  // namespace
}  // namespace hone
