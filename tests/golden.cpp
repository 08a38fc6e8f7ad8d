// Parity checks against the fixtures of tools/make_fixtures.py (float64 reference,
// transformers 5.17), for any backend.
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
#include "golden.h"
#include "test_util.h"

namespace hone::test {
namespace {

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

void load_golden_weights(const Golden& g, TrainingRun& run) {
  std::vector<float> host(size_t(run.model().layout().count()));
  LoadReport r = load_weights(g.dir + "/model.safetensors", g.config, run.model().layout(), host.data(), 0);
  EXPECT_TRUE(r.initialized.empty());
  EXPECT_TRUE(r.unused.empty());
  run.write_weights(host.data());
}

}  // namespace

void check_golden_forward_backward(const std::string& fixture, Backend& be, const GoldenTolerances& tol,
                                   const GoldenHooks& hooks) {
  Golden g(fixture);
  GoldenBatch b(g, "", "");
  TrainingArguments a = golden_args(g, b.batch());
  if (hooks.args) hooks.args(a);
  TrainingRun run(a, g.config, b.seq(), be);
  load_golden_weights(g, run);
  if (hooks.run) hooks.run(run);

  std::vector<float> logits(size_t(b.batch() * g.config.num_labels));
  run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), b.batch(), 1.0f, 0, logits.data());
  const std::vector<float> want_logits = g.floats("logits");
  const double logits_err = test::max_rel_error(logits.data(), want_logits.data(), int64_t(logits.size()), 1e-3);
  const double loss = run.take_loss_sum(), want_loss = g.floats("loss")[0];
  const double loss_err = std::fabs(loss - want_loss) / std::fabs(want_loss);
  EXPECT_LT(logits_err, tol.logits);
  EXPECT_LT(loss_err, tol.loss);

  double worst = 0, largest = 0;
  std::string worst_name;
  std::vector<float> grad_buffer(size_t(run.model().layout().count()));
  run.read_grads(grad_buffer.data());
  const float* grads = grad_buffer.data();
  for (const ParamEntry& e : run.model().layout().entries())
    largest = std::max(largest, max_abs(g.floats("grad." + e.name).data(), e.shape.numel()));
  for (const ParamEntry& e : run.model().layout().entries()) {
    const std::vector<float> want = g.floats("grad." + e.name);
    ASSERT_EQ(int64_t(want.size()), e.shape.numel()) << e.name;
    const double err = scaled_error(grads + e.offset, want.data(), e.shape.numel(), tol.zero_floor * largest);
    EXPECT_LT(err, tol.grads) << e.name;
    if (err > worst) worst = err, worst_name = e.name;
  }
  std::printf("[%s on %s, %s] logits rel err %.2e, loss rel err %.2e, worst gradient err %.2e (%s)\n",
              fixture.c_str(), be.name().c_str(), dtype_name(compute_dtype(a)).data(), logits_err, loss_err, worst,
              worst_name.c_str());
}

void check_golden_training(const std::string& fixture, Backend& be, const GoldenTolerances& tol,
                           GradientMemory grads, const GoldenHooks& hooks) {
  Golden g(fixture);
  GoldenBatch first(g, "train.", ".0");
  TrainingArguments a = golden_args(g, first.batch());
  if (hooks.args) hooks.args(a);
  TrainingRun run(a, g.config, first.seq(), be, grads);
  load_golden_weights(g, run);
  if (hooks.run) hooks.run(run);
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
    EXPECT_LT(loss_err, tol.steps) << "step " << k;
    EXPECT_LT(norm_err, tol.steps) << "step " << k;
    worst_loss = std::max(worst_loss, loss_err);
    worst_norm = std::max(worst_norm, norm_err);
  }
  EXPECT_EQ(run.skipped_steps(), 0) << "an fp16 step was skipped: the fixture's steps no longer apply";
  double worst = 0;
  std::vector<float> weight_buffer(size_t(run.model().layout().count()));
  run.read_weights(weight_buffer.data());
  const float* w = weight_buffer.data();
  for (const ParamEntry& e : run.model().layout().entries()) {
    const std::vector<float> want = g.floats("final." + e.name);
    const double err = scaled_error(w + e.offset, want.data(), e.shape.numel());
    EXPECT_LT(err, tol.steps) << e.name;
    worst = std::max(worst, err);
  }
  std::printf("[%s on %s, %s] 3 steps: loss rel err %.2e, grad-norm rel err %.2e, worst final weight err %.2e\n",
              fixture.c_str(), be.name().c_str(), dtype_name(compute_dtype(a)).data(), worst_loss, worst_norm, worst);
}

}  // namespace hone::test
