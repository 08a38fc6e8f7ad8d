// Training steps replayed from CUDA graphs (--cuda_graphs) against the same steps run
// eagerly: with dropout on, a learning rate that changes every update and batches of
// several shapes, the replayed run's losses and gradient norms follow the eager run's, so
// the replays read each step's batch, dropout step and AdamW scalars rather than the
// recorded step's. A run with other dropout masks shows that the comparison can tell.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "gpu/small_bert.h"

namespace hone {
namespace {

using test::random_batch;
using test::small_bert;

struct Curve {
  std::vector<double> loss, grad_norm;
  int64_t replayed = 0;
  SpanSeconds spans{};
};

constexpr int kUpdates = 9;
constexpr int kSeq = 64;
// Cycled per micro-step, so that each shape is recorded and replayed while the others are too.
constexpr std::pair<int, int> kShapes[] = {{4, 64}, {4, 64}, {3, 48}};

const char* precision_name(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

class CudaGraphs : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(CudaGraphs, ReplayedStepsFollowTheEagerRun) {
  const auto [dtype, accumulation] = GetParam();
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  if (dtype != DType::F32 && !mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  auto be = make_cuda_backend({});
  ModelConfig c = small_bert(0.2);
  // The accumulating runs use the tanh GELU, so that recordings also hold the feed-forward
  // products with their GELU epilogues.
  if (accumulation > 1) c.hidden_act = "gelu_pytorch_tanh";
  const ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 17);
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.gradient_accumulation_steps = accumulation;
  a.bf16 = dtype == DType::BF16;
  a.fp16 = dtype == DType::F16;
  a.weight_decay = 0.01;
  const GradientMemory grads = gradient_memory_for(a);

  auto run_curve = [&](bool graphs, uint64_t seed) {
    TrainingArguments args = a;
    args.cuda_graphs = graphs;
    args.seed = seed;
    TrainingRun run(args, c, kSeq, *be, grads);
    run.write_weights(w.data());
    if (args.fp16) run.set_scaler_state({1024.0, 0, 0});  // no overflow at the first steps
    std::mt19937 g(3);
    Curve out;
    be->take_span_seconds();
    const int64_t allocations = Arena::allocation_count();
    uint64_t micro = 0;
    for (int k = 0; k < kUpdates; ++k) {
      for (int m = 0; m < accumulation; ++m) {
        const auto [rows, seq] = kShapes[micro % std::size(kShapes)];
        test::TaskBatch h = random_batch(g, rows, seq, c.vocab_size);
        const Batch b{rows, seq, h.ids.data(), h.mask.data(), h.types.data(), h.labels.data(), {}};
        run.micro_step(b, 1.0f / float(accumulation), micro++);
      }
      // A schedule that changes every update: a replay that kept the recorded step's
      // AdamW scalars would drift from the eager run.
      const int64_t applied = k - run.skipped_steps();
      run.optimizer_step(1e-3 * double(k + 1) / kUpdates, applied + 1);
      out.loss.push_back(run.take_loss_sum());
      out.grad_norm.push_back(run.last_grad_norm());
    }
    EXPECT_EQ(Arena::allocation_count(), allocations) << "a step allocated device memory";
    out.replayed = run.replayed_steps();
    out.spans = be->take_span_seconds();
    return out;
  };

  const Curve eager = run_curve(false, 42), replayed = run_curve(true, 42), other_masks = run_curve(false, 43);

  // What the replayed run should have replayed: each micro-step shape runs eagerly once,
  // is recorded once, then replays; so does the optimizer step, with its micro-step's
  // shape when gradients are step-scoped, on its own when they accumulate.
  std::map<std::pair<int, int>, int> seen;
  for (int i = 0; i < kUpdates * accumulation; ++i) ++seen[kShapes[size_t(i) % std::size(kShapes)]];
  int64_t expected = 0;
  for (const auto& [shape, n] : seen) expected += std::max(0, n - 2);
  expected += grads == GradientMemory::StepScoped ? expected : std::max(0, kUpdates - 2);
  EXPECT_EQ(eager.replayed, 0);
  EXPECT_EQ(replayed.replayed, expected);

  // Atomic float sums (embedding and LayerNorm gradients) make two runs differ in their
  // last bits, and Adam and the half-precision roundings carry that on: the tolerance is
  // the drift of a few ulps, far below what other masks, batches or learning rates give.
  const double tol = dtype == DType::F32 ? 1e-4 : 3e-3;
  double worst = 0, control = 0;
  for (int k = 0; k < kUpdates; ++k) {
    const double d = std::fabs(replayed.loss[size_t(k)] - eager.loss[size_t(k)]);
    const double n = std::fabs(replayed.grad_norm[size_t(k)] - eager.grad_norm[size_t(k)]) /
                     std::max(1e-12, eager.grad_norm[size_t(k)]);
    worst = std::max({worst, d, n});
    control = std::max(control, std::fabs(other_masks.loss[size_t(k)] - eager.loss[size_t(k)]));
    std::printf("[%s GA %d] update %d: loss eager %.6f replayed %.6f other masks %.6f; grad norm %.5f %.5f\n",
                precision_name(dtype), accumulation, k + 1, eager.loss[size_t(k)], replayed.loss[size_t(k)],
                other_masks.loss[size_t(k)], eager.grad_norm[size_t(k)], replayed.grad_norm[size_t(k)]);
  }
  EXPECT_LT(worst, tol);
  EXPECT_GT(control, 5 * tol) << "other dropout masks must differ by more than the tolerance";

  // Replays mark their segments: the time split still sees every span.
  for (StepSpan s : {StepSpan::Forward, StepSpan::Backward, StepSpan::Optimizer})
    EXPECT_GT(replayed.spans[size_t(s)], 0.0) << "span " << int(s);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGraphs,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::string(precision_name(std::get<0>(info.param))) + "_accumulation_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Dynamic padding makes many shapes: each is chosen, recorded and replayed on its own, up
// to the cap on recorded shapes, past which steps run eagerly; evaluation batches of new
// shapes between steps take nothing away from the recordings (their products' algorithms
// stay chosen).
TEST(CudaGraphShapes, ManyShapesWithEvaluationBetweenSteps) {
  std::string why;
  if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  auto be = make_cuda_backend({});
  const ModelConfig c = small_bert(0.2);
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.bf16 = true;
  TrainingRun run(a, c, kSeq, *be, GradientMemory::StepScoped, RunPhases{true, 4});
  std::vector<float> w(size_t(run.model().layout().count()));
  init_weights(c, run.model().layout(), w.data(), 5);
  run.write_weights(w.data());
  std::vector<std::pair<int, int>> shapes;
  for (int rows : {2, 3, 4})
    for (int seq : {24, 32, 40, 48, 56, 64}) shapes.emplace_back(rows, seq);
  ASSERT_GT(shapes.size(), size_t(16)) << "the test must pass the cap on recorded shapes";
  std::mt19937 g(9);
  uint64_t micro = 0;
  std::vector<float> logits(size_t(4 * c.num_labels));
  for (int round = 0; round < 3; ++round) {
    for (auto [rows, seq] : shapes) {
      test::TaskBatch h = random_batch(g, rows, seq, c.vocab_size);
      const Batch b{rows, seq, h.ids.data(), h.mask.data(), h.types.data(), h.labels.data(), {}};
      run.micro_step(b, 1.0f, micro++);
      run.optimizer_step(1e-4, int64_t(micro));
      if (round == 1) {  // an evaluation batch of a shape no training step has
        const int seq_e = 8 + int(micro % 3) * 8;
        test::TaskBatch e = random_batch(g, 1, seq_e, c.vocab_size);
        run.infer(Batch{1, seq_e, e.ids.data(), e.mask.data(), e.types.data(), nullptr, {}}, {logits.data()});
      }
    }
    const double loss = run.take_loss_sum();
    EXPECT_TRUE(std::isfinite(loss)) << "round " << round;
  }
  // Round 0 runs every shape eagerly, round 1 records the first 16, round 2 replays them
  // (micro-step and optimizer step each).
  EXPECT_EQ(run.replayed_steps(), 2 * 16);
}

// Dense inference batches replay a recording of their shape from its second sighting: the
// replays read each call's batch and give the logits an eager run gives, in every dtype, for
// a small batch (256 tokens) and a larger one (2048).
TEST(CudaGraphInference, ReplaysGiveTheEagerLogits) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const ModelConfig c = small_bert();
  const ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 31);
  for (DType dtype : {DType::F32, DType::BF16}) {
    if (dtype != DType::F32 && !mixed_precision_available(&why)) continue;
    auto be = make_cuda_backend({});
    auto logits_of = [&](bool graphs, int64_t* replayed) {
      TrainingArguments a;
      a.bf16 = dtype == DType::BF16;
      a.cuda_graphs = graphs;
      TrainingRun run(a, c, kSeq, *be, GradientMemory::Persistent, RunPhases{false, 32});
      run.write_weights(w.data());
      std::mt19937 g(5);
      std::vector<float> all;
      for (const int rows : {4, 32})
        for (int call = 0; call < 4; ++call) {
          test::TaskBatch h = random_batch(g, rows, kSeq, c.vocab_size);
          std::fill(h.mask.begin(), h.mask.end(), 1);  // dense: the padded path, which records
          std::vector<float> logits(size_t(rows * c.num_labels));
          run.infer(Batch{rows, kSeq, h.ids.data(), h.mask.data(), h.types.data(), nullptr, {}}, {logits.data()});
          all.insert(all.end(), logits.begin(), logits.end());
        }
      *replayed = run.replayed_inferences();
      return all;
    };
    int64_t replayed = 0, eager_replayed = 0;
    const std::vector<float> replayed_logits = logits_of(true, &replayed);
    const std::vector<float> eager_logits = logits_of(false, &eager_replayed);
    EXPECT_EQ(replayed, 4) << precision_name(dtype);  // per shape: eager, recorded, replayed, replayed
    EXPECT_EQ(eager_replayed, 0);
    EXPECT_EQ(replayed_logits, eager_logits) << precision_name(dtype);
  }
}

}  // namespace
}  // namespace hone
