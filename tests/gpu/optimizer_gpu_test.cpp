// Every optimizer's CUDA kernels against the library Trainer builds (tests/fixtures/optim)
// and against the CPU reference, update by update; and in bf16 runs replayed from CUDA graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "optim_fixture.h"
#include "small_bert.h"

namespace hone {
namespace {

struct GpuFixtureCase {
  const char* name;
  double vs_library;  // max error over each parameter's largest value, per update
  double vs_cpu;
};

class OptimizerGpuFixture : public ::testing::TestWithParam<GpuFixtureCase> {};

TEST_P(OptimizerGpuFixture, FollowsTheLibraryAndTheCpu) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const test::OptimFixture f(GetParam().name);
  std::unique_ptr<Backend> gpu = make_cuda_backend({});
  CpuBackend cpu;
  const auto got = test::replay_optim_fixture(f, *gpu);
  const auto ref = test::replay_optim_fixture(f, cpu);
  for (int k = 0; k < f.steps; ++k) {
    EXPECT_LE(test::worst_param_error(f, got[size_t(k)], f.after[size_t(k)]), GetParam().vs_library)
        << "update " << k + 1;
    EXPECT_LE(test::worst_param_error(f, got[size_t(k)], ref[size_t(k)]), GetParam().vs_cpu) << "update " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, OptimizerGpuFixture,
                         ::testing::Values(GpuFixtureCase{"adamw_torch", 1e-6, 1e-7},
                                           GpuFixtureCase{"adafactor", 1e-6, 1e-6}, GpuFixtureCase{"sgd", 1e-6, 0},
                                           GpuFixtureCase{"sgd_nesterov", 1e-6, 0},
                                           GpuFixtureCase{"sgd_dampening", 1e-6, 0},
                                           GpuFixtureCase{"adagrad", 1e-6, 0}, GpuFixtureCase{"lion_32bit", 1e-6, 0},
                                           GpuFixtureCase{"adamw_bnb_8bit", 5e-5, 0},
                                           GpuFixtureCase{"adamw_8bit", 5e-5, 0}, GpuFixtureCase{"lion_8bit", 5e-7, 0},
                                           GpuFixtureCase{"adamw_8bit_blockwise", 5e-5, 0},
                                           GpuFixtureCase{"lion_8bit_blockwise", 5e-7, 0}),
                         [](const auto& info) { return std::string(info.param.name); });

// The quantized path of the 8-bit optimizers on the GPU as on the CPU, bit for bit, on
// random parameters and gradients (the *_blockwise fixtures check it against bitsandbytes
// within rounding): with a wider FFN two matrices are quantized (4800 elements: the last
// block partial).
TEST(Optimizer8bitGpu, QuantizedTensorsMatchTheCpu) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (const char* name : {"adamw_8bit", "lion_8bit"}) {
    test::OptimFixture f(name);
    f.config.intermediate_size = 300;
    const size_t n = size_t(ParamLayout(f.config).count());
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    auto draw = [&](float scale) {
      std::vector<float> v(n);
      for (float& x : v) x = scale * normal(rng);
      return v;
    };
    f.init = draw(0.02f);
    for (auto& g : f.grads) g = draw(0.05f);
    std::unique_ptr<Backend> gpu = make_cuda_backend({});
    CpuBackend cpu;
    const auto got = test::replay_optim_fixture(f, *gpu);
    const auto ref = test::replay_optim_fixture(f, cpu);
    for (int k = 0; k < f.steps; ++k) EXPECT_EQ(got[size_t(k)], ref[size_t(k)]) << name << " update " << k + 1;
  }
}

}  // namespace
}  // namespace hone

namespace hone {
namespace {

// Every optimizer in a bf16 run: replayed CUDA graphs follow the eager run while the
// learning rate changes every update (each update's scalars come from memory), and the
// bf16 weights the model reads are the updated master weights rounded.
class OptimizerGpuRun : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerGpuRun, ReplaysFollowEagerStepsAndTheHalfCopyFollowsTheMasterWeights) {
  std::string why;
  if (!cuda_available(&why) || !mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision GPU: " << why;
  auto be = make_cuda_backend({});
  const ModelConfig c = test::small_bert();
  const ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 17);
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.bf16 = true;
  a.weight_decay = 0.01;
  a.optim = GetParam();
  constexpr int kUpdates = 6, kSeq = 32;
  auto run_curve = [&](bool graphs, std::vector<float>* master, std::vector<uint16_t>* half) {
    TrainingArguments args = a;
    args.cuda_graphs = graphs;
    TrainingRun run(args, c, kSeq, *be, gradient_memory_for(args));
    run.write_weights(w.data());
    std::mt19937 g(3);
    std::vector<double> losses;
    for (int k = 0; k < kUpdates; ++k) {
      test::TaskBatch h = test::task_batch(g, 4, kSeq, c.vocab_size);
      const Batch b{4, kSeq, h.ids.data(), h.mask.data(), h.types.data(), h.labels.data(), {}};
      run.micro_step(b, 1.0f, uint64_t(k));
      run.optimizer_step(1e-3 * double(k + 1) / kUpdates, k + 1);
      losses.push_back(run.take_loss_sum());
    }
    if (master) {
      master->resize(w.size());
      run.read_weights(master->data());
      half->resize(size_t(run.model().compute_weights().numel()));
      run.copy_to_host(run.model().compute_weights(), half->data());
    }
    return losses;
  };
  std::vector<float> master;
  std::vector<uint16_t> half;
  const std::vector<double> eager = run_curve(false, nullptr, nullptr), replayed = run_curve(true, &master, &half);
  for (int k = 0; k < kUpdates; ++k) {
    EXPECT_TRUE(std::isfinite(eager[size_t(k)])) << "update " << k + 1;
    EXPECT_NEAR(replayed[size_t(k)], eager[size_t(k)], 3e-3) << "update " << k + 1;
  }
  EXPECT_NE(master, w) << "the weights did not move";
  // The copy starts after the embedding tables, which forward reads from the master weights.
  ASSERT_EQ(half.size(), size_t(layout.count() - layout.tables_end()));
  size_t off = 0;
  for (size_t i = 0; i < half.size(); ++i) off += half[i] != float_to_bf16(master[i + size_t(layout.tables_end())]);
  EXPECT_EQ(off, 0u) << "bf16 copies that are not the master weights rounded";
}

INSTANTIATE_TEST_SUITE_P(Every, OptimizerGpuRun, ::testing::ValuesIn([] {
                           std::vector<std::string> names;
                           for (std::string_view n : optimizer_names()) names.emplace_back(n);
                           return names;
                         }()));

}  // namespace
}  // namespace hone
