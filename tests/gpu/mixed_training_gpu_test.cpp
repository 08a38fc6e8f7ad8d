// Mixed precision end to end: bf16 and fp16 against the golden fixtures and against the
// fp32 CUDA path, fp16 loss scaling (an overflow skips the step and backs the scale off),
// a 200-step learnable task whose bf16 and fp32 loss curves agree, and the plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "golden.h"
#include "gpu/small_bert.h"
#include "hone/checkpoint.h"
#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

using test::random_batch;
using test::small_bert;
using test::task_batch;
using test::TaskBatch;

// Mixed precision needs a GPU (and a build with cuDNN when HONE_ATTENTION=cudnn).
#define SKIP_WITHOUT_MIXED_PRECISION()                                        \
  do {                                                                        \
    std::string why;                                                          \
    if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why; \
  } while (0)

TrainingArguments with_precision(TrainingArguments a, DType t) {
  a.bf16 = t == DType::BF16;
  a.fp16 = t == DType::F16;
  return a;
}

const char* name_of(DType t) { return t == DType::BF16 ? "bf16" : "fp16"; }

class MixedGolden : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// Tolerances from the formats: bf16 keeps 8 significant bits (relative rounding 2^-9 =
// 2e-3 per stored value), fp16 11 (2^-12 = 2.4e-4). Each of the fixtures' 3 layers
// rounds its activations a handful of times, and the gradients pass through them twice,
// so the errors are tens of roundings: a few 1e-2 for bf16 and a few 1e-3 for fp16.
// Optimizer steps start from fp32 master weights, so their error stays that of the
// gradients; Adam divides by sqrt(v), which turns a relative error of a tiny gradient
// into the same relative error of a step of lr, small against the weights.
// The key bias, zero in exact arithmetic, holds rounding noise of the other gradients'
// size times the format's precision: zero_floor measures it against that.
// Two things widen this for the other families' fixtures: DistilBERT's ReLU head, where a
// pre-activation rounded across zero changes a logit by its whole value (bf16 logits 4.2e-2);
// and Adam's steps of about lr whatever a gradient's size, which send an element whose
// gradient is within rounding of zero the other way (fp16 word embeddings: xlm_roberta_reg's
// 1.8e-2 on an H100, while losses and gradient norms agree to 1e-4).
test::GoldenTolerances tolerances(DType t) {
  return t == DType::BF16 ? test::GoldenTolerances{5e-2, 2e-2, 8e-2, 5e-2, 1e-2}
                          : test::GoldenTolerances{6e-3, 3e-3, 1.5e-2, 2.5e-2, 1e-3};
}

TEST_P(MixedGolden, MatchesTransformersAtItsPrecision) {
  SKIP_WITHOUT_MIXED_PRECISION();
  const auto [fixture, dtype] = GetParam();
  auto be = make_cuda_backend({});
  test::GoldenHooks hooks;
  hooks.args = [dtype](TrainingArguments& a) { a = with_precision(a, dtype); };
  // At GradScaler's initial 2^16 the regression fixture's first gradients overflow fp16,
  // and the step is skipped (as torch would skip it), after which the fp32 fixture's steps
  // no longer apply; 2^8 still scales every gradient, without the overflow.
  if (dtype == DType::F16) hooks.run = [](TrainingRun& run) { run.set_scaler_state({256.0, 0, 0}); };
  test::check_golden_forward_backward(fixture, *be, tolerances(dtype), hooks);
  test::check_golden_training(fixture, *be, tolerances(dtype), GradientMemory::Persistent, hooks);
  test::check_golden_training(fixture, *be, tolerances(dtype), GradientMemory::StepScoped, hooks);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MixedGolden,
                         ::testing::Combine(::testing::Values("bert_cls", "bert_reg", "roberta_cls", "xlm_roberta_reg",
                                                              "distilbert_cls", "electra_cls"),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + name_of(std::get<1>(info.param));
                         });

double rel_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// One padded batch of random tokens and labels through the head-size-64 model: logits and
// the encoder's weight gradients against the fp32 CUDA path, in relative Frobenius error
// (for a sum of many roundings, about sqrt(#roundings) x 2^-9 in bf16). Biases and
// embedding tables are sums over every token whose terms nearly cancel at random init (the
// key bias's exactly), so their relative error measures the cancellation, not the
// arithmetic (on a batch of the learnable task below, where the two classes' gradients
// oppose, even layer 0's weights do: the error was 8x smaller in fp16 than in bf16, as
// rounding is). The golden fixtures check every gradient at their scale.
TEST(MixedPrecision, MatchesFp32OnPaddedBatch) {
  SKIP_WITHOUT_MIXED_PRECISION();
  auto be = make_cuda_backend({});
  // The erf GELU runs unfused; the tanh GELU in the feed-forward products' epilogues.
  for (const char* act : {"gelu", "gelu_pytorch_tanh"}) {
    ModelConfig c = small_bert();
    c.hidden_act = act;
    TrainingArguments a;
    a.per_device_train_batch_size = 4;
    const ParamLayout layout(c);
    std::vector<float> w(size_t(layout.count()));
    init_weights(c, layout, w.data(), 11);
    std::mt19937 g(5);
    const TaskBatch b = random_batch(g, 4, 64, c.vocab_size);
    auto run_with = [&](DType t, std::vector<float>& logits, std::vector<float>& grads) {
      TrainingRun run(with_precision(a, t), c, 64, *be);
      run.write_weights(w.data());
      logits.resize(8);
      run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), 4, 1.0f, 0, logits.data());
      grads.resize(w.size());
      run.read_grads(grads.data());
    };
    std::vector<float> ref_logits, ref_grads;
    run_with(DType::F32, ref_logits, ref_grads);
    for (DType t : {DType::BF16, DType::F16}) {
      std::vector<float> logits, grads;
      run_with(t, logits, grads);
      const double logit_err = rel_frobenius(logits, ref_logits);
      double worst = 0;
      std::string worst_name;
      for (const ParamEntry& e : layout.entries()) {
        if (e.shape.rank != 2 || e.name.find("encoder.layer") == std::string::npos) continue;
        const std::vector<float> got(grads.begin() + e.offset, grads.begin() + e.offset + e.shape.numel()),
            want(ref_grads.begin() + e.offset, ref_grads.begin() + e.offset + e.shape.numel());
        const double err = rel_frobenius(got, want);
        if (err > worst) worst = err, worst_name = e.name;
      }
      std::printf("[%s vs fp32, %s] logits rel err %.2e, worst encoder weight gradient rel err %.2e (%s)\n",
                  name_of(t), act, logit_err, worst, worst_name.c_str());
      EXPECT_LT(logit_err, t == DType::BF16 ? 2e-2 : 3e-3) << act;
      EXPECT_LT(worst, t == DType::BF16 ? 5e-2 : 8e-3) << act << " " << worst_name;
    }
  }
}

// An fp16 run of the small model, its weights written, for the loss scaler's tests.
struct Fp16Run {
  std::unique_ptr<Backend> be = make_cuda_backend({});
  ModelConfig config = small_bert();
  TrainingArguments args = [] {
    TrainingArguments a;
    a.per_device_train_batch_size = 4;
    a.fp16 = true;
    return a;
  }();
  std::unique_ptr<TrainingRun> run = std::make_unique<TrainingRun>(args, config, 32, *be);
  std::vector<float> weights;
  Fp16Run() : weights(size_t(run->model().layout().count())) {
    init_weights(config, run->model().layout(), weights.data(), 3);
    run->write_weights(weights.data());
  }
};

// GradScaler's contract: an overflow skips the step (weights and moments untouched) and
// halves the scale; growth_interval clean steps double it; AdamW's step count and the
// schedule advance on applied steps only.
TEST(MixedPrecision, Fp16LossScalerSkipsOverflowAndBacksOff) {
  SKIP_WITHOUT_MIXED_PRECISION();
  Fp16Run f;
  TrainingRun& run = *f.run;
  const ModelConfig& c = f.config;
  const std::vector<float>& w = f.weights;
  std::mt19937 g(1);
  const TaskBatch b = task_batch(g, 4, 32, c.vocab_size);
  auto step = [&](int64_t k) {
    run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), 4, 1.0f, uint64_t(k));
    run.optimizer_step(1e-3, k - run.skipped_steps());
  };
  EXPECT_EQ(run.loss_scale(), 65536.0);

  // A scale of 2^100 overflows fp16 (max 65504) in the first gradient it multiplies.
  run.set_scaler_state({std::ldexp(1.0, 100), 0, 0});
  step(1);
  EXPECT_EQ(run.skipped_steps(), 1);
  EXPECT_EQ(run.loss_scale(), std::ldexp(1.0, 99));
  std::vector<float> after(w.size()), m(w.size());
  run.read_weights(after.data());
  EXPECT_EQ(after, w) << "a skipped step changed the weights";
  run.copy_to_host(run.optimizer().state().at(0).tensor, m.data());
  EXPECT_EQ(m, std::vector<float>(w.size(), 0.0f)) << "a skipped step changed the moments";
  EXPECT_EQ(run.scaler_state()[1], 0.0);

  // One clean step short of the growth interval: applied, then the scale doubles.
  run.set_scaler_state({1024.0, 1999, 1});
  step(2);
  EXPECT_EQ(run.skipped_steps(), 1);
  EXPECT_EQ(run.loss_scale(), 2048.0);
  EXPECT_EQ(run.scaler_state()[1], 0.0);
  run.read_weights(after.data());
  EXPECT_NE(after, w) << "a clean step left the weights unchanged";
  step(3);
  EXPECT_EQ(run.loss_scale(), 2048.0);
  EXPECT_EQ(run.scaler_state()[1], 1.0);
  // The gradient norm is reported unscaled: the same as a bf16 run's within fp16 rounding.
  EXPECT_TRUE(std::isfinite(run.last_grad_norm()));
  EXPECT_LT(run.last_grad_norm(), 100.0);
}

// A checkpoint of an fp16 run keeps GradScaler's state (scaler.json), and resuming restores
// it: the scale, the clean-step count and the skipped steps that hold the schedule.
TEST(MixedPrecision, Fp16CheckpointKeepsTheLossScaler) {
  SKIP_WITHOUT_MIXED_PRECISION();
  Fp16Run f;
  TrainingRun& run = *f.run;
  const ModelConfig& c = f.config;
  run.set_scaler_state({1024.0, 7, 3});
  test::TempDir tmp;
  const std::string dir = tmp.path + "/checkpoint-5";
  TrainerState st;
  st.global_step = 5;
  save_checkpoint(dir, run, ModelFiles{c, nullptr}, st, f.args, count_steps(f.args, 64));
  TrainingRun resumed(f.args, c, 32, *f.be);
  EXPECT_EQ(resumed.scaler_state()[0], 65536.0);
  load_checkpoint(dir, resumed);
  const std::array<double, 3> got = resumed.scaler_state();
  EXPECT_EQ(got[0], 1024.0);
  EXPECT_EQ(got[1], 7.0);
  EXPECT_EQ(got[2], 3.0);
  EXPECT_EQ(resumed.skipped_steps(), 3);
}

// 200 updates of a learnable task with dropout off: bf16 and fp32 learn it alike. Windows
// of 20 steps average out the single-step noise (each step's loss differs by the
// precision of its logits, and the trajectories drift apart slowly).
TEST(MixedPrecision, Bf16LossCurveFollowsFp32) {
  SKIP_WITHOUT_MIXED_PRECISION();
  auto be = make_cuda_backend({});
  const ModelConfig c = small_bert();
  TrainingArguments a;
  a.per_device_train_batch_size = 16;
  a.learning_rate = 1e-3;
  constexpr int kSteps = 200, kWindow = 20, kSeq = 32;
  const ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 7);
  auto curve = [&](DType t) {
    TrainingRun run(with_precision(a, t), c, kSeq, *be, GradientMemory::StepScoped);
    run.write_weights(w.data());
    std::mt19937 g(42);
    std::vector<double> losses;
    for (int k = 0; k < kSteps; ++k) {
      const TaskBatch b = task_batch(g, 16, kSeq, c.vocab_size);
      run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), 16, 1.0f, uint64_t(k));
      run.optimizer_step(a.learning_rate * (1.0 - double(k) / kSteps), k + 1);
      losses.push_back(run.take_loss_sum());
    }
    return losses;
  };
  const std::vector<double> fp32 = curve(DType::F32), bf16 = curve(DType::BF16);
  double worst = 0;
  for (int s = 0; s + kWindow <= kSteps; s += kWindow) {
    double x = 0, y = 0;
    for (int k = s; k < s + kWindow; ++k) x += fp32[size_t(k)], y += bf16[size_t(k)];
    x /= kWindow, y /= kWindow;
    std::printf("steps %3d-%3d: fp32 %.4f bf16 %.4f\n", s, s + kWindow - 1, x, y);
    worst = std::max(worst, std::fabs(x - y));
  }
  double last32 = 0, last16 = 0;
  for (int k = kSteps - kWindow; k < kSteps; ++k) last32 += fp32[size_t(k)] / kWindow, last16 += bf16[size_t(k)] / kWindow;
  EXPECT_LT(last32, 0.3) << "the task was not learned in fp32: the comparison would be vacuous";
  EXPECT_LT(last16, 0.3);
  EXPECT_LT(worst, 0.05);
}

// The plan of a bf16 run on the GPU: the master weights are F32, the copy the model reads
// half that, less the embedding tables (read from the master weights), and each arena is
// allocated exactly as planned.
TEST(MixedPrecision, PlanSeparatesMasterWeightsAndIsAllocatedExactly) {
  SKIP_WITHOUT_MIXED_PRECISION();
  auto be = make_cuda_backend({});
  const ModelConfig c = small_bert();
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.bf16 = true;
  TrainingRun run(a, c, 64, *be, GradientMemory::StepScoped);
  const MemoryPlan& plan = run.memory().plan();
  const size_t n = size_t(run.model().layout().count()), tables = size_t(run.model().layout().tables_end());
  EXPECT_GE(plan.category_bytes[size_t(Category::MasterWeights)], 4 * n);
  EXPECT_LT(plan.category_bytes[size_t(Category::MasterWeights)], 4 * n + kBufferAlignment);
  EXPECT_GE(plan.category_bytes[size_t(Category::Weights)], 2 * (n - tables));
  EXPECT_LT(plan.category_bytes[size_t(Category::Weights)], 2 * (n - tables) + kBufferAlignment);
  for (int k = 0; k < kNumCategories; ++k)
    EXPECT_EQ(run.memory().arena_bytes(Category(k)), plan.category_bytes[size_t(k)]) << category_name(Category(k));
}

// A run planned only for inference keeps its weights in the compute dtype alone, rounded
// from the F32 weights on the host as the training run's cast rounds them, without the
// master copy. Its logits are the training run's but for the embeddings: training sums the
// F32 tables and rounds once, inference sums rounded tables, which moves the logits by
// about one step of the format at their scale (the largest's: the hidden states' rounding,
// not each logit's own, which can be near 0).
TEST(MixedPrecision, InferenceOnlyKeepsHalfWeightsAndTheSameLogits) {
  SKIP_WITHOUT_MIXED_PRECISION();
  auto be = make_cuda_backend({});
  const ModelConfig c = small_bert();
  std::vector<float> w0(size_t(ParamLayout(c).count()));
  init_weights(c, ParamLayout(c), w0.data(), 13);
  std::mt19937 g(3);
  const TaskBatch tb = random_batch(g, 4, 64, c.vocab_size);
  Batch b;
  b.rows = 4;
  b.seq = 64;
  b.ids = const_cast<int32_t*>(tb.ids.data());
  b.mask = const_cast<int32_t*>(tb.mask.data());
  b.types = const_cast<int32_t*>(tb.types.data());
  for (DType t : {DType::BF16, DType::F16}) {
    TrainingArguments a;
    a.per_device_train_batch_size = 4;
    a = with_precision(a, t);
    std::vector<float> trained(8), inferred(8);
    TrainingRun train(a, c, 64, *be, GradientMemory::StepScoped, RunPhases{true, 4});
    train.write_weights(w0.data());
    train.infer(b, ForwardOutputs{trained.data()});
    TrainingRun infer(a, c, 64, *be, GradientMemory::Persistent, RunPhases{false, 4});
    EXPECT_EQ(infer.memory().arena_bytes(Category::MasterWeights), 0u) << name_of(t);
    EXPECT_LT(infer.memory().arena_bytes(Category::Weights), 2 * w0.size() + kBufferAlignment) << name_of(t);
    infer.write_weights(w0.data());
    infer.infer(b, ForwardOutputs{inferred.data()});
    const float step = t == DType::BF16 ? 0x1p-8f : 0x1p-11f;  // relative spacing of the format
    float scale = 0.0f;
    for (float v : trained) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < trained.size(); ++i)
      EXPECT_NEAR(inferred[i], trained[i], 2 * step * scale) << name_of(t) << " logit " << i;
    EXPECT_THROW(infer.read_weights(w0.data()), Error) << name_of(t);
  }
}

}  // namespace
}  // namespace hone
