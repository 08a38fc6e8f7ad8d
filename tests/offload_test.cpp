// --offload_optimizer: the update on the host over page-locked buffers equals the update on
// the device, and the plan puts master weights, gradients and optimizer state on the host.
// On the CPU backend the host is the device, so the two runs must agree bit for bit.
#include <gtest/gtest.h>

#include <fstream>

#include "hone/cpu_backend.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

ModelConfig tiny() {
  ModelConfig c = *builtin_config("bert-tiny");
  c.hidden_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 40;
  c.max_position_embeddings = 32;
  return c;
}

TrainingArguments args(const std::string& optim, bool offload, int accumulation = 2) {
  TrainingArguments a;
  a.per_device_train_batch_size = 2;
  a.gradient_accumulation_steps = accumulation;
  a.learning_rate = 1e-3;
  a.weight_decay = 0.01;
  a.max_grad_norm = 0.5;  // clips: the coefficient must reach the host
  a.optim = optim;
  if (optim == "sgd") a.optim_args = "momentum=0.9,nesterov=True";
  a.offload_optimizer = offload;
  return a;
}

// Three updates of accumulation micro-steps each, or of `windows` micro-steps; returns the
// weights and the optimizer's state.
std::pair<std::vector<float>, std::vector<std::vector<float>>> train(const TrainingArguments& a,
                                                                     std::vector<int> windows = {}) {
  if (windows.empty()) windows.assign(3, a.gradient_accumulation_steps);
  CpuBackend be;
  const ModelConfig c = tiny();
  TrainingRun run(a, c, 16, be, gradient_memory_for(a));
  std::vector<float> w(size_t(run.model().layout().count()));
  init_weights(c, run.model().layout(), w.data(), 3);
  run.write_weights(w.data());
  SyntheticDataset data(16, 16, 5, false);
  std::vector<int32_t> ids(32), mask(32, 1), types(32);
  std::vector<float> labels(2);
  for (int update = 1; update <= int(windows.size()); ++update) {
    const int ga = windows[size_t(update - 1)];
    for (int micro = 0; micro < ga; ++micro) {
      for (int b = 0; b < 2; ++b)
        data.example(4 * update + 2 * micro + b, &ids[size_t(16 * b)], &types[size_t(16 * b)], &labels[size_t(b)]);
      run.micro_step(ids.data(), mask.data(), types.data(), labels.data(), 2, 1.0f / float(ga),
                     uint64_t(2 * update + micro));
    }
    run.optimizer_step(1e-3 * update, update);
  }
  run.read_weights(w.data());
  std::vector<std::vector<float>> state;
  for (const StateTensor& s : run.optimizer().state()) {
    std::vector<float> host(s.tensor.bytes() / sizeof(float));
    run.copy_to_host(s.tensor, host.data());
    state.push_back(std::move(host));
  }
  return {w, state};
}

// With accumulation the gradients stay on the device until the update; without, each
// layer group's leave as backward finishes it (step-scoped, their norm summed on the way).
TEST(OffloadRun, EqualsTheUpdateOnTheDeviceBitForBit) {
  for (int accumulation : {1, 2})
  for (const char* optim : {"adamw_torch", "adafactor", "sgd", "adamw_8bit"}) {
    SCOPED_TRACE(::testing::Message() << optim << ", accumulation " << accumulation);
    const auto on_device = train(args(optim, false, accumulation));
    const auto offloaded = train(args(optim, true, accumulation));
    EXPECT_EQ(offloaded.first, on_device.first) << optim;
    ASSERT_EQ(offloaded.second.size(), on_device.second.size()) << optim;
    for (size_t i = 0; i < on_device.second.size(); ++i) EXPECT_EQ(offloaded.second[i], on_device.second[i]) << optim;
    // The weights moved: the comparison is not of two untouched copies.
    std::vector<float> w0(on_device.first.size());
    init_weights(tiny(), SequenceClassifier(tiny()).layout(), w0.data(), 3);
    EXPECT_NE(on_device.first, w0) << optim;
  }
}

// Accumulated gradients leave for the host during the window's last micro-step: a window
// shorter than --gradient_accumulation_steps sends none (the update fetches them), one
// longer sends them too early (the next micro-step drops what was sent).
TEST(OffloadRun, WindowsOfOtherLengthsEqualTheDevice) {
  const std::vector<int> windows = {1, 3, 2, 2};
  const auto on_device = train(args("adamw_torch", false, 2), windows);
  const auto offloaded = train(args("adamw_torch", true, 2), windows);
  EXPECT_EQ(offloaded.first, on_device.first);
  EXPECT_EQ(offloaded.second, on_device.second);
}

// A checkpoint of an offloaded run holds the host's optimizer state: resumed offloaded or
// not, the run ends where the uninterrupted run on the device does, bit for bit.
TEST(OffloadRun, ResumesBitForBitWithOrWithoutOffloading) {
  auto run_training = [](TrainingArguments a, int64_t stop_after, TrainerState* state) {
    CpuBackend be;
    const ModelConfig c = tiny();
    TrainingRun run(a, c, 16, be, gradient_memory_for(a));
    std::vector<float> w(size_t(run.model().layout().count()));
    init_weights(c, run.model().layout(), w.data(), a.seed);
    run.write_weights(w.data());
    std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
    TrainCallbacks cb;
    if (stop_after > 0) cb.should_stop = [&](int64_t step) { return step == stop_after; };
    train(run, a, TrainData{*data}, ModelFiles{c}, cb, state);
    run.read_weights(w.data());
    return w;
  };
  auto args = [](const std::string& out, bool offload) {
    TrainingArguments a;
    a.dataset = "synthetic:24x16";
    a.per_device_train_batch_size = 4;
    a.gradient_accumulation_steps = 2;
    a.num_train_epochs = 3;  // 9 updates
    a.learning_rate = 1e-3;
    a.save_steps = 4;
    a.logging_steps = 3;
    a.output_dir = out;
    a.offload_optimizer = offload;
    return a;
  };
  test::TempDir straight_dir;
  TrainerState straight_state;
  const std::vector<float> straight = run_training(args(straight_dir.path, false), -1, &straight_state);
  for (bool resume_offloaded : {true, false}) {
    SCOPED_TRACE(resume_offloaded ? "resumed offloaded" : "resumed on the device");
    test::TempDir dir;
    run_training(args(dir.path, true), 6, nullptr);  // dies after checkpoint-4 and two more updates
    TrainingArguments resumed = args(dir.path, resume_offloaded);
    resumed.resume_from_checkpoint = "last";
    TrainerState state;
    EXPECT_EQ(run_training(resumed, -1, &state), straight);
    EXPECT_EQ(state.total_loss, straight_state.total_loss);
  }
}

TEST(OffloadPlan, PutsMasterWeightsGradientsAndStateOnTheHost) {
  CpuBackend be;
  const ModelConfig c = tiny();
  const int64_t n = SequenceClassifier(c).layout().count();
  auto bytes = [](const MemoryPlan& p, Category k) { return p.category_bytes[size_t(k)]; };
  const size_t f32 = (size_t(n) * 4 + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;

  TrainingArguments a = args("adamw_torch", true);
  const MemoryPlan fp32 = TrainingRun::plan(a, c, 16, be, gradient_memory_for(a));
  EXPECT_EQ(bytes(fp32, Category::OptimizerState), 0u);
  EXPECT_EQ(bytes(fp32, Category::HostOptimizerState), 2 * f32);  // both moments
  EXPECT_EQ(bytes(fp32, Category::HostGradients), f32);
  EXPECT_EQ(bytes(fp32, Category::HostMasterWeights), f32);      // the master copy of the device's weights
  EXPECT_EQ(bytes(fp32, Category::Weights), f32);
  EXPECT_EQ(fp32.host_bytes(), 4 * f32 + bytes(fp32, Category::HostWorkspace));
  size_t device = 0;
  for (int k = 0; k < kNumCategories; ++k)
    if (!on_host(Category(k))) device += fp32.category_bytes[size_t(k)];
  EXPECT_EQ(fp32.total_bytes(), device);

  // Under bf16 the device keeps the bf16 weights alone; the host the master weights and
  // the rounded copy the update writes. Neither copy has the embedding tables: forward
  // reads those from the master weights, on the host.
  a.bf16 = true;
  const MemoryPlan bf16 = TrainingRun::plan(a, c, 16, be, gradient_memory_for(a));
  const int64_t tables = ParamLayout(c).tables_end();
  ASSERT_GT(tables, 0);
  const size_t half = (size_t(n - tables) * 2 + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  EXPECT_EQ(bytes(bf16, Category::MasterWeights), 0u);
  EXPECT_EQ(bytes(bf16, Category::Weights), half);
  EXPECT_EQ(bytes(bf16, Category::HostMasterWeights), f32 + half);
  EXPECT_EQ(bytes(bf16, Category::HostOptimizerState), 2 * f32);

  // Without offload nothing is on the host.
  const MemoryPlan plain = TrainingRun::plan(args("adamw_torch", false), c, 16, be);
  EXPECT_EQ(plain.host_bytes(), 0u);

  // With the master weights on the device, the same bf16 copy.
  TrainingArguments on_device = args("adamw_torch", false);
  on_device.bf16 = true;
  const MemoryPlan mixed = TrainingRun::plan(on_device, c, 16, be, gradient_memory_for(on_device));
  EXPECT_EQ(bytes(mixed, Category::MasterWeights), f32);
  EXPECT_EQ(bytes(mixed, Category::Weights), half);
}

}  // namespace
}  // namespace hone

namespace hone {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// `hone train --deepspeed` with the fields users write: offload to the CPU, "auto" batch
// sizes, DeepSpeed's optimizer and scheduler blocks; the run says what it does.
TEST(OffloadCli, DeepSpeedFileTrainsOffloadedAndSaysSo) {
  test::TempDir tmp;
  const std::string ds = tmp.path + "/ds_config.json";
  std::ofstream(ds) << R"({
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "overlap_comm": true, "contiguous_gradients": true, "reduce_bucket_size": "auto"}})";
  const std::string out = tmp.path + "/out";
  test::CommandResult r = test::run_hone("train --model_name_or_path bert-tiny --dataset synthetic:16x16 --device cpu "
                                         "--per_device_train_batch_size 4 --gradient_accumulation_steps 2 "
                                         "--num_train_epochs 1 --save_strategy no --logging_steps 1 --deepspeed " +
                                         ds + " --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "DeepSpeed " + ds + ": ZeRO stage 2, its AdamW over all parameters in one group, its "
                         "WarmupDecayLR schedule; no effect on one GPU: zero_optimization.contiguous_gradients, "
                         "zero_optimization.reduce_bucket_size"))
      << r.out;
  EXPECT_TRUE(has(r.out, "optimizer offloaded")) << r.out;
  // DeepSpeed's log warmup over ceil(0 x 2) = 0 -> 2 steps: the first two updates at lr 0.
  EXPECT_TRUE(has(r.out, "'learning_rate': 0.0")) << r.out;

  // A stage hone lacks and a value that disagrees with the flags: errors before training.
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 3}})";
  r = test::run_hone("train --model_name_or_path bert-tiny --dataset synthetic:16x16 --device cpu --deepspeed " + ds +
                     " --output_dir " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r.out, "zero_optimization.stage: stage 3")) << r.out;
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 16})";
  r = test::run_hone("train --model_name_or_path bert-tiny --dataset synthetic:16x16 --device cpu --deepspeed " + ds +
                     " --output_dir " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r.out, "train_micro_batch_size_per_gpu=16 vs hone per_device_train_batch_size=8")) << r.out;
}

TEST(OffloadCli, EstimatePrintsTheHostsBytesBesideTheDevices) {
  test::CommandResult r = test::run_hone(
      "estimate --model_name_or_path bert-large-uncased --per_device_train_batch_size 4 --device cpu --bf16 "
      "--offload_optimizer");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* part : {"host master weights", "host gradients", "host optimizer state", "host total (page-locked)",
                           "2,681,152,000"})  // both AdamW moments of 335,143,938 parameters
    EXPECT_TRUE(has(r.out, part)) << part << "\n" << r.out;
  EXPECT_FALSE(has(r.out, "\n  optimizer state")) << r.out;
}

}  // namespace
}  // namespace hone
