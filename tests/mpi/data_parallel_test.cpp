// Run by mpiexec with two ranks (ctest does): data-parallel training on the CPU backend
// over MPI gives the losses and weights of one process training the global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "hone/cpu_backend.h"
#include "hone/data.h"
#include "hone/distributed.h"
#include "hone/trainer.h"
#include "hone/weights.h"

namespace hone {
namespace {

BertConfig tiny() {
  BertConfig c;
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
  const BertConfig c = tiny();
  TrainingRun run(a, c, 16, be, gradient_memory_for(a));
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
  void expect_equal_to_one_process(int b, int ga) {
    const Trained one = train_with(args(2 * b * ga, 1), nullptr);
    const Trained two = train_with(args(b, ga), comm_);
    ASSERT_EQ(one.losses.size(), 4u);  // 2 epochs of 32 rows in global batches of 16
    ASSERT_EQ(two.losses.size(), one.losses.size());
    for (size_t i = 0; i < one.losses.size(); ++i) {
      EXPECT_NEAR(two.losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(two.norms[i], one.norms[i], 1e-4 * one.norms[i]) << "step " << i + 1;
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < one.weights.size(); ++i) {
      diff += double(two.weights[i] - one.weights[i]) * (two.weights[i] - one.weights[i]);
      norm += double(one.weights[i]) * one.weights[i];
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

TEST_F(DataParallel, AllRanksStopTogetherWhenOneIsAsked) {
  CpuBackend be;
  const BertConfig c = tiny();
  const TrainingArguments a = args(4, 1);
  TrainingRun run(a, c, 16, be);
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
