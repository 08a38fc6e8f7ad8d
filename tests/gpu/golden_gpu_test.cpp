// The golden fixtures on CUDA, at the CPU's tolerances in fp32 and looser ones in TF32;
// CUDA against the CPU with dropout on; a checkpoint written from the GPU read on the CPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>

#include "golden.h"
#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

#define SKIP_WITHOUT_GPU()                                       \
  do {                                                           \
    std::string why;                                             \
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

class GoldenGpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenGpuTest, Fp32MatchesTransformers) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend({});
  test::check_golden_forward_backward(GetParam(), *be);
  test::check_golden_training(GetParam(), *be);
  test::check_golden_training(GetParam(), *be, {}, GradientMemory::StepScoped);
}

TEST_P(GoldenGpuTest, Tf32MatchesTransformersLoosely) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend({0, true});
  // TF32 keeps 10 mantissa bits in matrix products: about 1e-3 relative per product,
  // which three Adam steps carry into the weights (measured on an H100: 3.8e-3 for BERT).
  // Adam moves a weight by about lr whatever its gradient's size, so an element whose
  // gradient is within rounding of zero (a cancellation in a word embedding's sums) may
  // step the other way: up to 2 lr a step against weights of a few 0.01 (xlm_roberta_reg's
  // word embeddings: 1.2e-2, while its losses and gradient norms agree to 1e-5).
  test::GoldenTolerances tol{3e-3, 3e-3, 3e-2, 2e-2};
  if (GetParam() == "modernbert_cls") {
    // Its fixture scales Wqkv by 8 (so that a rotary error shows), which makes attention
    // scores 64 times the default init's: TF32's rounding of q.k moves the logits by 4.9e-3
    // (H100), while loss and gradient norms agree to 3e-4. Its word embeddings start at
    // 0.02 and near-zero gradients of popular rows step them the other way, as
    // xlm_roberta_reg's: 4.2e-2 of the largest weight after three steps.
    tol.logits = 8e-3;
    tol.steps = 6e-2;
  }
  test::check_golden_forward_backward(GetParam(), *be, tol);
  test::check_golden_training(GetParam(), *be, tol);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenGpuTest,
                         ::testing::Values("bert_cls", "bert_reg", "roberta_cls", "xlm_roberta_reg", "distilbert_cls",
                                           "electra_cls", "modernbert_cls", "modernbert_mean_reg"));

ModelConfig dropout_config() {
  ModelConfig c = *builtin_config("bert-tiny");
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.max_position_embeddings = 64;
  c.hidden_dropout_prob = 0.1f;
  c.attention_probs_dropout_prob = 0.1f;
  return c;
}

// Same seed, same Philox streams: CUDA and CPU drop the same elements, so a few
// training steps with dropout give the same losses.
TEST(GpuParity, DropoutTrainingMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto cuda = make_cuda_backend({});
  CpuBackend cpu;
  const ModelConfig c = dropout_config();
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.learning_rate = 1e-3;
  TrainingRun on_gpu(a, c, 32, *cuda), on_cpu(a, c, 32, cpu);
  std::vector<float> w(size_t(on_cpu.model().layout().count()));
  init_weights(c, on_cpu.model().layout(), w.data(), 3);
  on_gpu.write_weights(w.data());
  on_cpu.write_weights(w.data());
  SyntheticDataset data(4, 32, 5, false);
  std::vector<int32_t> ids(128), mask(128), types(128);
  std::vector<float> labels(4);
  for (int b = 0; b < 4; ++b) data.example(b, &ids[b * 32], &types[b * 32], &labels[b]);
  std::fill(mask.begin(), mask.end(), 1);
  labels = {0, 1, 1, 0};
  for (int step = 0; step < 3; ++step) {
    for (TrainingRun* r : {&on_gpu, &on_cpu}) {
      r->micro_step(ids.data(), mask.data(), types.data(), labels.data(), 4, 1.0f, uint64_t(step));
      r->optimizer_step(1e-3, step + 1);
    }
    const double lg = on_gpu.take_loss_sum(), lc = on_cpu.take_loss_sum();
    EXPECT_NEAR(lg, lc, 1e-5 * std::fabs(lc)) << "step " << step;
  }
  std::vector<float> wg(w.size()), wc(w.size());
  on_gpu.read_weights(wg.data());
  on_cpu.read_weights(wc.data());
  EXPECT_LT(test::norm_rel_error(wg.data(), wc.data(), int64_t(w.size())), 1e-5);
}

// A model trained on the GPU and saved loads on the CPU and gives the same logits.
TEST(GpuParity, CheckpointFromGpuGivesSameLogitsOnCpu) {
  SKIP_WITHOUT_GPU();
  auto cuda = make_cuda_backend({});
  CpuBackend cpu;
  ModelConfig c = dropout_config();
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  TrainingArguments a;
  a.per_device_train_batch_size = 2;
  TrainingRun on_gpu(a, c, 16, *cuda);
  std::vector<float> w(size_t(on_gpu.model().layout().count()));
  init_weights(c, on_gpu.model().layout(), w.data(), 9);
  on_gpu.write_weights(w.data());
  std::vector<int32_t> ids(32, 1000), mask(32, 1), types(32, 0);
  for (int i = 0; i < 32; ++i) ids[size_t(i)] = 1000 + 37 * i;
  std::vector<float> labels = {1, 0};
  on_gpu.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 2, 1.0f, 0);
  on_gpu.optimizer_step(1e-3, 1);
  on_gpu.read_weights(w.data());
  test::TempDir dir;
  save_pretrained(dir.path, c, on_gpu.model().layout(), w.data());

  ModelSource src = resolve_model(dir.path);
  TrainingRun on_cpu(a, src.config, 16, cpu);
  std::vector<float> back(w.size());
  load_weights(src.weights_path, src.config, on_cpu.model().layout(), back.data(), 0);
  on_cpu.write_weights(back.data());
  float lg[4], lc[4];
  on_gpu.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 2, 1.0f, 1, lg);
  on_cpu.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 2, 1.0f, 1, lc);
  EXPECT_LT(test::max_rel_error(lg, lc, 4, 1e-3), 1e-5);
}

// A small step-scoped run on the GPU (as the CLI runs without accumulation) and one
// fixed batch, for the memory and timing tests.
struct GpuSteps {
  std::unique_ptr<Backend> cuda = make_cuda_backend({});
  ModelConfig c = dropout_config();
  TrainingArguments a = batch_of(4);
  TrainingRun run{a, c, 32, *cuda, GradientMemory::StepScoped};
  std::vector<int32_t> ids = std::vector<int32_t>(128, 2000), mask = std::vector<int32_t>(128, 1),
                       types = std::vector<int32_t>(128, 0);
  std::vector<float> labels = {0, 1, 1, 0};
  GpuSteps() {
    std::vector<float> w(size_t(run.model().layout().count()));
    init_weights(c, run.model().layout(), w.data(), 3);
    run.write_weights(w.data());
  }
  static TrainingArguments batch_of(int b) {
    TrainingArguments t;
    t.per_device_train_batch_size = b;
    return t;
  }
  void step(int k) {
    run.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 4, 1.0f, uint64_t(k));
    run.optimizer_step(1e-4, k + 1);
  }
};

// After a warm-up step, steps take no memory: no arena allocation and no change in the
// device's free memory (which would catch a library allocating behind our back).
TEST(GpuMemory, StepsAllocateNothing) {
  SKIP_WITHOUT_GPU();
  GpuSteps g;
  auto step = [&](int k) {
    g.step(k);
    g.run.take_loss_sum();
  };
  step(0);
  size_t free_before = 0, free_after = 0, total = 0;
  g.cuda->synchronize();
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  const int64_t arenas = Arena::allocation_count();
  for (int k = 1; k < 4; ++k) step(k);
  g.cuda->synchronize();
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(Arena::allocation_count(), arenas);
  EXPECT_EQ(free_after, free_before);
}

// The time split reads CUDA events: every span of the steps is seen, none is negative,
// and together they take no longer than the steps did on the host's clock.
TEST(GpuTiming, SpansCoverTheSteps) {
  SKIP_WITHOUT_GPU();
  GpuSteps g;
  g.cuda->take_span_seconds();
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < 300; ++k) g.step(k);  // more marks than the event ring holds
  const SpanSeconds sp = g.cuda->take_span_seconds();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (StepSpan s : {StepSpan::Forward, StepSpan::Backward, StepSpan::Optimizer}) EXPECT_GT(sp[size_t(s)], 0);
  EXPECT_GE(sp[size_t(StepSpan::Other)], 0);
  EXPECT_LE(sp[0] + sp[1] + sp[2] + sp[3], wall * 1.01);
}

// Dynamic padding on the GPU: batches shorter than the planned sequence (and not a
// multiple of any tile), with padding inside, for training and for inference, as the
// CPU computes them; and the text loader's pinned staging buffers feeding it.
TEST(GpuParity, ShortPaddedBatchesMatchCpuInTrainingAndInference) {
  SKIP_WITHOUT_GPU();
  auto cuda = make_cuda_backend({});
  CpuBackend cpu;
  // CUDA trains the padded batch; packed, the CPU would draw its element-wise dropout masks
  // over the packed rows (docs/design/packed-inference.md).
  cpu.pack_training = false;
  ModelConfig c = dropout_config();
  TrainingArguments a;
  a.per_device_train_batch_size = 3;
  TrainingRun on_gpu(a, c, 48, *cuda, GradientMemory::StepScoped, RunPhases{true, 5});
  TrainingRun on_cpu(a, c, 48, cpu, GradientMemory::StepScoped, RunPhases{true, 5});
  std::vector<float> w(size_t(on_cpu.model().layout().count()));
  init_weights(c, on_cpu.model().layout(), w.data(), 4);
  on_gpu.write_weights(w.data());
  on_cpu.write_weights(w.data());
  int64_t step = 0;  // AdamW's step, from 1: the first update's moments are zero
  for (int seq : {24, 13, 40}) {
    ++step;
    std::vector<int32_t> ids(size_t(5 * seq)), mask(ids.size()), types(ids.size(), 0);
    std::vector<float> labels = {1, 0, 1, 0, 1};
    for (int b = 0; b < 5; ++b)
      for (int t = 0; t < seq; ++t) {
        const bool real = t < seq - 3 * b;
        ids[size_t(b * seq + t)] = real ? 1000 + 31 * t + 7 * b : 0;
        mask[size_t(b * seq + t)] = real ? 1 : 0;
      }
    Batch bt;
    bt.rows = 3;
    bt.seq = seq;
    bt.ids = ids.data();
    bt.mask = mask.data();
    bt.types = types.data();
    bt.labels = labels.data();
    for (TrainingRun* r : {&on_gpu, &on_cpu}) {
      r->micro_step(bt, 1.0f, uint64_t(seq));
      r->optimizer_step(1e-3, step);
    }
    EXPECT_NEAR(on_gpu.take_loss_sum(), on_cpu.take_loss_sum(), 1e-5) << seq;
    bt.rows = 5;
    std::vector<float> lg(10), lc(10);
    on_gpu.infer(bt, ForwardOutputs{lg.data()});
    on_cpu.infer(bt, ForwardOutputs{lc.data()});
    EXPECT_LT(test::max_rel_error(lg.data(), lc.data(), 10, 1e-3), 1e-4) << seq;
  }
}

}  // namespace
}  // namespace hone
