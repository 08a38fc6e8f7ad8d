// Run by mpiexec with two ranks (ctest does): data-parallel training on the CPU backend
// over MPI gives the losses and weights of one process training the global batch.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "hone/cpu_backend.h"
#include "hone/data.h"
#include "hone/distributed.h"
#include "hone/trainer.h"
#include "hone/weights.h"

namespace hone {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 30522;
  c.hidden_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 40;
  c.max_position_embeddings = 32;
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;  // the same function on every rank count
  return c;
}

TrainingArguments args(int batch, int accumulation) {
  TrainingArguments a;
  a.per_device_train_batch_size = batch;
  a.gradient_accumulation_steps = accumulation;
  a.dataset = "synthetic:32x16";
  a.learning_rate = 1e-2;
  a.num_train_epochs = 2;
  a.logging_steps = 1;
  a.save_strategy = "no";
  return a;
}

struct Trained {
  std::vector<double> losses, norms;
  std::vector<float> weights;
};

Trained train_with(const TrainingArguments& a, Communicator* comm) {
  CpuBackend be;
  const ModelConfig c = tiny();
  TrainingRun run(a, c, 16, be, gradient_memory_for(a), {},
                  comm ? sharding_for(a, comm->group()) : Sharding{});
  if (comm) run.distribute(*comm);
  init_weights(c, run.model().layout(), run.host_weights(), 11);
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
  Trained t;
  TrainCallbacks cb;
  cb.on_log = [&](const nlohmann::ordered_json& e) {
    if (!e.contains("loss")) return;
    t.losses.push_back(e["loss"].get<double>());
    t.norms.push_back(e["grad_norm"].get<double>());
  };
  train(run, a, TrainData{*data}, ModelFiles{c}, cb);
  t.weights.resize(size_t(run.model().layout().count()));
  run.read_weights(t.weights.data());
  return t;
}

class DataParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ProcessGroup g = process_group_from_env();
    ASSERT_EQ(g.world_size, 2) << "run this binary with mpiexec -n 2";
    CpuBackend be;
    comm_ = make_communicator(be, g).release();
  }
  static Communicator* comm_;

  // Two ranks with batch b x accumulation ga each against one process with the global batch.
  void expect_equal_to_one_process(int b, int ga, int zero_stage = 0, const std::string& optim = "adamw_torch") {
    TrainingArguments single = args(2 * b * ga, 1), ranks = args(b, ga);
    single.optim = ranks.optim = optim;
    ranks.zero_stage = zero_stage;
    const Trained one = train_with(single, nullptr);
    const Trained two = train_with(ranks, comm_);
    ASSERT_EQ(one.losses.size(), 4u);  // 2 epochs of 32 rows in global batches of 16
    ASSERT_EQ(two.losses.size(), one.losses.size());
    for (size_t i = 0; i < one.losses.size(); ++i) {
      EXPECT_NEAR(two.losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(two.norms[i], one.norms[i], 1e-4 * one.norms[i]) << "step " << i + 1;
    }
    // Every parameter but the key biases, whose gradient is zero but for rounding (softmax
    // ignores a constant added to every score of a row): Adam and Adafactor normalise that
    // noise into steps of the learning rate's size, whichever order the sums took.
    double diff = 0, norm = 0;
    const ParamLayout layout(tiny());
    for (const ParamEntry& e : layout.entries()) {
      if (e.name.ends_with("attention.self.key.bias")) continue;
      for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
        diff += std::pow(double(two.weights[size_t(i)]) - one.weights[size_t(i)], 2);
        norm += std::pow(double(one.weights[size_t(i)]), 2);
      }
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-5);
    // The ranks hold the same weights, bit for bit: they applied the same summed gradients.
    CpuBackend be;
    std::vector<float> theirs = two.weights;
    Tensor t{theirs.data(), DType::F32, Shape{int64_t(theirs.size())}, Device::CPU};
    comm_->broadcast(be, t, 0);
    EXPECT_EQ(theirs, two.weights) << "rank " << comm_->rank() << " differs from rank 0";
  }
};
Communicator* DataParallel::comm_ = nullptr;

TEST_F(DataParallel, TwoRanksEqualOneProcessWithTheGlobalBatch) { expect_equal_to_one_process(8, 1); }

TEST_F(DataParallel, WithGradientAccumulationToo) { expect_equal_to_one_process(4, 2); }

TEST_F(DataParallel, ZeroStage1EqualsOneProcess) {
  {
    SCOPED_TRACE("batch 8");
    expect_equal_to_one_process(8, 1, 1);
  }
  {
    SCOPED_TRACE("batch 4 x accumulation 2");
    expect_equal_to_one_process(4, 2, 1);
  }
  SCOPED_TRACE("adafactor");  // per-tensor state: the shard's own tensors
  expect_equal_to_one_process(8, 1, 1, "adafactor");
}

TEST_F(DataParallel, ZeroStage2EqualsOneProcess) {
  {
    SCOPED_TRACE("batch 8");
    expect_equal_to_one_process(8, 1, 2);
  }
  // Each micro-step's gradients are reduced into their owner's accumulated ones.
  SCOPED_TRACE("batch 2 x accumulation 4");
  expect_equal_to_one_process(2, 4, 2);
}

// Each rank plans its own share: stage 1 holds part of the optimizer state; stage 2 frees
// the others' gradients early, which lowers the peak only where it falls in backward (step-
// scoped gradients already reuse the activations' memory).
TEST_F(DataParallel, ZeroShrinksEachRanksPlan) {
  CpuBackend be;
  ModelConfig c = tiny();
  c.vocab_size = 200;  // embeddings about a layer's size, so that the shards balance
  TrainingArguments a = args(8, 1);
  auto plan = [&](int stage) {
    a.zero_stage = stage;
    return TrainingRun::plan(a, c, 16, be, gradient_memory_for(a), {}, {2, comm_->rank(), stage});
  };
  const MemoryPlan zero0 = plan(0), zero1 = plan(1), zero2 = plan(2);
  const auto state = [](const MemoryPlan& p) { return double(p.category_bytes[size_t(Category::OptimizerState)]); };
  EXPECT_LT(state(zero1), 0.75 * state(zero0));
  EXPECT_GT(state(zero1), 0.25 * state(zero0));
  EXPECT_EQ(state(zero2), state(zero1));
  EXPECT_LE(zero2.total_bytes(), zero1.total_bytes());
  EXPECT_LT(zero1.total_bytes(), zero0.total_bytes());
  // With accumulation gradients persist: stage 2 keeps this rank's groups' alone, and at
  // most two of the others' on their way to their owners (so more, smaller groups here),
  // whose packing may leave a gap of a group's size where their sizes differ.
  a = args(4, 2);
  c.num_hidden_layers = 8;
  const auto grads = [](const MemoryPlan& p) { return double(p.category_bytes[size_t(Category::Gradients)]); };
  const MemoryPlan accumulating1 = plan(1), accumulating2 = plan(2);
  const ParamLayout layout(c);
  const std::vector<int> bounds = shard_bounds(layout, 2);
  const auto aligned = [](int64_t floats) { return double((floats * 4 + 255) / 256 * 256); };
  const int r = comm_->rank();
  double bound = aligned(layout.groups()[size_t(bounds[size_t(r) + 1] - 1)].end -
                         layout.groups()[size_t(bounds[size_t(r)])].begin);
  std::vector<double> others;
  for (int k = 0; k < int(layout.groups().size()); ++k)
    if (k < bounds[size_t(r)] || k >= bounds[size_t(r) + 1]) others.push_back(aligned(layout.groups()[size_t(k)].size()));
  std::sort(others.rbegin(), others.rend());
  bound += others[0] + others[1] + others[2];
  EXPECT_LE(grads(accumulating2), bound);
  EXPECT_LT(grads(accumulating2), grads(accumulating1));
  EXPECT_LT(accumulating2.total_bytes(), accumulating1.total_bytes());
}

// Under mixed precision ZeRO shards the fp32 master weights with the optimizer state (the
// CPU plans and moves bf16 weights, though it computes in F32 only): each rank plans its
// share; weights drawn, written and saved by two ranks are those of one process, bit for bit.
TEST_F(DataParallel, ZeroShardsMasterWeightsUnderMixedPrecision) {
  CpuBackend be;
  ModelConfig c = tiny();
  c.vocab_size = 200;  // embeddings about a layer's size, so that the shards balance
  TrainingArguments a = args(8, 1);
  a.bf16 = true;
  TrainingArguments sharded = a;
  sharded.zero_stage = 1;
  TrainingRun one(a, c, 16, be, gradient_memory_for(a)),
      two(sharded, c, 16, be, gradient_memory_for(sharded), {}, sharding_for(sharded, comm_->group()));
  two.distribute(*comm_);
  EXPECT_FALSE(one.master_sharded());
  ASSERT_TRUE(two.master_sharded());
  const auto master = [](TrainingRun& r) {
    return double(r.memory().plan().category_bytes[size_t(Category::MasterWeights)]);
  };
  const std::vector<ParamGroup>& groups = one.model().layout().groups();
  const std::vector<int> bounds = shard_bounds(one.model().layout(), 2);
  const int r = comm_->rank();
  const int64_t mine = groups[size_t(bounds[size_t(r) + 1] - 1)].end - groups[size_t(bounds[size_t(r)])].begin;
  const auto aligned = [](int64_t floats) { return double((floats * 4 + 255) / 256 * 256); };
  EXPECT_EQ(master(one), aligned(one.model().layout().count()));
  EXPECT_EQ(master(two), aligned(mine));
  EXPECT_LT(master(two), 0.75 * master(one));
  EXPECT_THROW(two.host_weights(), Error);

  const int64_t n = one.model().layout().count();
  auto weights = [&](TrainingRun& r) {
    auto w = std::vector<float>(size_t(n));
    r.read_weights(w.data());
    return w;
  };
  // The half copies from the end of the embedding tables: the unsharded run reads those
  // from its master weights and keeps no copy of them; the sharded one keeps every weight's.
  EXPECT_EQ(one.model().half_begin(), one.model().layout().tables_end());
  EXPECT_EQ(two.model().half_begin(), 0);
  auto half = [&](TrainingRun& r) {
    auto h = std::vector<uint16_t>(size_t(r.model().compute_weights().numel()));
    r.copy_to_host(r.model().compute_weights(), h.data());
    return std::vector<uint16_t>(h.begin() + (r.model().layout().tables_end() - r.model().half_begin()), h.end());
  };
  one.init_weights(11);
  two.init_weights(11);
  EXPECT_EQ(weights(two), weights(one)) << "rank " << comm_->rank();
  EXPECT_EQ(half(two), half(one)) << "rank " << comm_->rank();

  auto written = std::vector<float>(size_t(n));
  for (int64_t i = 0; i < n; ++i) written[size_t(i)] = 0.01f * float(i % 997) - 3.0f;
  one.write_weights(written.data());
  two.write_weights(written.data());
  EXPECT_EQ(weights(two), written);
  EXPECT_EQ(half(two), half(one));

  // Only rank 0 reads and saves; rank 1 sends its share.
  const std::string dir = "/tmp/hone_mpi_master_shards_" + std::to_string(getppid());
  if (comm_->rank() == 0) {
    auto got = std::vector<float>(size_t(n));
    two.read_weights(got.data());
    EXPECT_EQ(got, written);
    two.save_model(dir + "/two");
    one.save_model(dir + "/one");
    auto bytes = [](const std::string& path) {
      std::ifstream f(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    EXPECT_EQ(bytes(dir + "/two/model.safetensors"), bytes(dir + "/one/model.safetensors"));
    std::filesystem::remove_all(dir);
  } else {
    two.read_weights(nullptr);
    two.read_weights(nullptr);
  }
  comm_->barrier(be);
}

// A ZeRO checkpoint holds the whole optimizer state, joined by rank 0 from every rank's
// share: one process resumes from it, and so do two ranks at stage 1 and at stage 2, each
// continuing the uninterrupted run's losses.
TEST_F(DataParallel, ZeroCheckpointsResumeOnAnyNumberOfRanksAndStages) {
  const std::string dir = "/tmp/hone_mpi_zero_checkpoint_" + std::to_string(getppid());
  CpuBackend be;
  if (comm_->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  comm_->barrier(be);
  const Trained whole = train_with(args(16, 1), nullptr);
  TrainingArguments saving = args(8, 1);
  saving.zero_stage = 1;
  saving.output_dir = dir + "/zero1";
  saving.save_strategy = "steps";
  saving.save_steps = 2;
  train_with(saving, comm_);
  const std::string checkpoint = saving.output_dir + "/checkpoint-2";
  ASSERT_TRUE(std::filesystem::exists(checkpoint + "/optimizer.safetensors"));
  for (const auto& [ranks, stage] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{2, 2}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks at stage " + std::to_string(stage));
    TrainingArguments resuming = args(16 / ranks, 1);
    resuming.zero_stage = stage;
    resuming.output_dir = dir + "/resumed";
    resuming.resume_from_checkpoint = checkpoint;
    const Trained resumed = train_with(resuming, ranks == 2 ? comm_ : nullptr);
    ASSERT_EQ(resumed.losses.size(), 2u);  // steps 3 and 4
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(resumed.losses[i], whole.losses[i + 2], 1e-5 * whole.losses[i + 2]) << "step " << i + 3;
    comm_->barrier(be);
  }
  comm_->barrier(be);
  if (comm_->rank() == 0) std::filesystem::remove_all(dir);
}

// Each rank evaluates every other batch and the ranks share their logits: the metrics and
// logits of one process (with both ranks evaluating everything, the sum would double them).
TEST_F(DataParallel, EvaluationIsSharedOutAndGathered) {
  CpuBackend be;
  const ModelConfig c = tiny();
  TrainingArguments a = args(8, 1);
  a.per_device_eval_batch_size = 4;
  std::unique_ptr<Dataset> data = open_dataset("synthetic:30x16", a.seed, false);  // 8 batches, the last of 2
  TrainingRun one(a, c, 16, be, gradient_memory_for(a), RunPhases{true, 4}),
      two(a, c, 16, be, gradient_memory_for(a), RunPhases{true, 4}, sharding_for(a, comm_->group()));
  two.distribute(*comm_);
  init_weights(c, one.model().layout(), one.host_weights(), 11);
  init_weights(c, two.model().layout(), two.host_weights(), 11);
  std::vector<float> alone, shared;
  const nlohmann::ordered_json m1 = evaluate(one, *data, a, "eval", &alone);
  const nlohmann::ordered_json m2 = evaluate(two, *data, a, "eval", &shared);
  ASSERT_EQ(alone.size(), 60u);
  EXPECT_EQ(shared, alone);
  for (const char* k : {"eval_loss", "eval_accuracy", "eval_f1", "eval_matthews_correlation"})
    EXPECT_EQ(m2[k].get<double>(), m1[k].get<double>()) << k;
  EXPECT_NEAR(m2["eval_steps_per_second"].get<double>() * m2["eval_runtime"].get<double>(), 4.0, 1e-9);  // of 8
}

TEST_F(DataParallel, AllRanksStopTogetherWhenOneIsAsked) {
  CpuBackend be;
  const ModelConfig c = tiny();
  const TrainingArguments a = args(4, 1);
  TrainingRun run(a, c, 16, be, gradient_memory_for(a), {}, sharding_for(a, comm_->group()));
  run.distribute(*comm_);
  init_weights(c, run.model().layout(), run.host_weights(), 11);
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
  TrainCallbacks cb;
  cb.should_stop = [&](int64_t step) { return comm_->rank() == 1 && step == 2; };
  const TrainMetrics m = train(run, a, TrainData{*data}, ModelFiles{c}, cb);
  EXPECT_EQ(m.global_step, 2);
}

}  // namespace
}  // namespace hone
