// Checkpoints: what they hold, that resuming continues exactly where the run stopped,
// rotation, and that a process killed while saving leaves the previous checkpoint whole.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "hone/checkpoint.h"
#include "hone/cpu_backend.h"
#include "hone/optimizer.h"
#include "hone/safetensors.h"
#include "hone/weights.h"
#include "test_util.h"

extern char** environ;

namespace hone {
namespace {
namespace fs = std::filesystem;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 30522;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 16;
  return c;  // dropout 0.1 everywhere: resuming must restore the dropout streams too
}

TrainingArguments resume_args(const std::string& out) {
  TrainingArguments a;
  a.dataset = "synthetic:24x16";
  a.per_device_train_batch_size = 4;
  a.gradient_accumulation_steps = 2;  // 3 updates per epoch
  a.num_train_epochs = 4;             // 12 updates
  a.learning_rate = 1e-3;
  a.warmup_steps = 2;
  a.logging_steps = 3;
  a.save_steps = 4;  // not a multiple of logging_steps: a checkpoint falls between logs
  a.output_dir = out;
  return a;
}

struct Outcome {
  TrainerState state;
  std::vector<float> weights;
};

Outcome run_training(const TrainingArguments& a, int64_t stop_after = -1) {
  CpuBackend be;
  const ModelConfig c = tiny_config();
  TrainingRun run(a, c, 16, be, gradient_memory_for(a));
  init_weights(c, run.model().layout(), run.host_weights(), a.seed);
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
  TrainCallbacks cb;
  if (stop_after > 0) cb.should_stop = [&](int64_t step) { return step == stop_after; };
  Outcome o;
  train(run, a, TrainData{*data}, ModelFiles{c}, cb, &o.state);
  o.weights.assign(run.host_weights(), run.host_weights() + run.model().layout().count());
  return o;
}

std::vector<double> losses(const TrainerState& s) {
  std::vector<double> v;
  for (const auto& e : s.log_history)
    if (e.contains("loss")) v.push_back(e["loss"].get<double>());
  return v;
}

// Every optimizer (its state in the checkpoint) resumes bit for bit.
struct OptimizerCase {
  std::string optim, optim_args;
};

std::vector<OptimizerCase> every_optimizer() {
  std::vector<OptimizerCase> cases;
  for (std::string_view name : optimizer_names()) cases.push_back({std::string(name), ""});
  // Settings that add state the defaults do not keep.
  const std::vector<std::string_view> names = optimizer_names();
  for (OptimizerCase extra : {OptimizerCase{"sgd", "momentum=0.9,nesterov=true"}, OptimizerCase{"adafactor", "beta1=0.9"}})
    if (std::ranges::find(names, extra.optim) != names.end()) cases.push_back(extra);
  return cases;
}

class CheckpointResume : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(CheckpointResume, GivesTheUninterruptedLossCurveAndWeights) {
  auto args = [&](const std::string& out) {
    TrainingArguments a = resume_args(out);
    a.optim = GetParam().optim;
    a.optim_args = GetParam().optim_args;
    return a;
  };
  test::TempDir straight_dir, broken_dir;
  const Outcome straight = run_training(args(straight_dir.path));
  // The interrupted run dies at step 6, after checkpoint-4 and two unsaved updates.
  run_training(args(broken_dir.path), 6);
  ASSERT_EQ(list_checkpoints(broken_dir.path).size(), 1u);
  TrainingArguments resumed = args(broken_dir.path);
  resumed.resume_from_checkpoint = "last";
  const Outcome after = run_training(resumed);

  EXPECT_EQ(after.state.global_step, 12);
  const std::vector<double> a = losses(straight.state), b = losses(after.state);
  ASSERT_EQ(a.size(), 4u);  // steps 3, 6, 9, 12
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "logged loss " << i;  // bit for bit
  EXPECT_EQ(straight.state.total_loss, after.state.total_loss);
  EXPECT_EQ(straight.weights, after.weights);
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, CheckpointResume, ::testing::ValuesIn(every_optimizer()),
                         [](const auto& info) {
                           std::string n = info.param.optim + (info.param.optim_args.empty() ? "" : "_with_args");
                           return n;
                         });

TEST(Checkpoint, ResumingWithAnotherOptimizersStateIsAnError) {
  test::TempDir dir;
  TrainingArguments a = resume_args(dir.path);
  a.max_steps = 4;
  run_training(a);
  SafetensorsFile opt((fs::path(checkpoint_path(dir.path, 4)) / "optimizer.safetensors").string());
  EXPECT_EQ(opt.metadata().at("optim"), "adamw_torch");
  EXPECT_EQ(opt.metadata().at("optimizer_state"), "adamw");
  // adamw_torch_fused keeps the same state, so it resumes from it.
  a.optim = "adamw_torch_fused";
  a.max_steps = 5;
  a.resume_from_checkpoint = "last";
  EXPECT_EQ(run_training(a).state.global_step, 5);
  // The state of a kind this run's optimizer does not keep is refused, by name.
  const std::string path = (fs::path(checkpoint_path(dir.path, 4)) / "optimizer.safetensors").string();
  std::vector<float> m(size_t(ParamLayout(tiny_config()).count()));
  write_safetensors(path, {{"exp_avg", Tensor{m.data(), DType::F32, {int64_t(m.size())}, Device::CPU}}},
                    {{"format", "hone"}, {"optim", "lion_8bit"}, {"optimizer_state", "lion_8bit"}});
  a.resume_from_checkpoint = checkpoint_path(dir.path, 4);
  try {
    run_training(a);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--optim lion_8bit"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("adamw_torch_fused"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, HoldsTheModelOptimizerSchedulerRngAndTrainerState) {
  test::TempDir dir;
  TrainingArguments a = resume_args(dir.path);
  a.max_steps = 4;
  run_training(a);
  const fs::path ck = checkpoint_path(dir.path, 4);
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "scheduler.json",
                        "rng_state.json", "trainer_state.json"})
    EXPECT_TRUE(fs::exists(ck / f)) << f;
  std::ifstream in(ck / "trainer_state.json");
  const nlohmann::json st = nlohmann::json::parse(in);
  EXPECT_EQ(st["global_step"], 4);
  EXPECT_EQ(st["max_steps"], 4);
  EXPECT_TRUE(st["log_history"].is_array());
  EXPECT_EQ(st["log_history"].size(), 1u);  // the log of step 3
  // The model part is a Hugging Face model directory.
  ModelSource src = resolve_model(ck.string());
  EXPECT_EQ(src.config.hidden_size, 16);
  SafetensorsFile opt((ck / "optimizer.safetensors").string());
  EXPECT_EQ(opt.find("exp_avg")->numel(), ParamLayout(tiny_config()).count());
}

// A NaN in the saved optimizer state is refused at resume, naming the tensor and element,
// rather than carried by every later update into the weights.
TEST(Checkpoint, ResumingNonFiniteOptimizerStateIsAnError) {
  test::TempDir dir;
  TrainingArguments a = resume_args(dir.path);
  a.max_steps = 4;
  run_training(a);
  const std::string path = (fs::path(checkpoint_path(dir.path, 4)) / "optimizer.safetensors").string();
  // Rewrite the file with exp_avg[5] = NaN.
  std::vector<NamedTensor> tensors;
  std::vector<std::vector<std::byte>> bytes;
  std::map<std::string, std::string> meta;
  {
    SafetensorsFile opt(path);
    meta = opt.metadata();
    for (const SafetensorsEntry& e : opt.entries()) {
      bytes.emplace_back(e.data, e.data + e.bytes);
      if (e.name == "exp_avg") reinterpret_cast<float*>(bytes.back().data())[5] = std::nanf("");
      Shape shape;
      shape.rank = int(e.shape.size());
      for (size_t d = 0; d < e.shape.size(); ++d) shape.dims[d] = e.shape[d];
      tensors.push_back({e.name, Tensor{bytes.back().data(), e.dtype, shape, Device::CPU}});
    }
  }
  write_safetensors(path, tensors, meta);
  TrainingArguments resumed = resume_args(dir.path);
  resumed.resume_from_checkpoint = "last";
  try {
    run_training(resumed);
    ADD_FAILURE() << "a NaN in exp_avg was resumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer state 'exp_avg' is not finite at [5]"), std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, ResumingADifferentModelIsAnError) {
  test::TempDir dir;
  TrainingArguments a = resume_args(dir.path);
  a.max_steps = 4;
  run_training(a);
  CpuBackend be;
  ModelConfig other = tiny_config();
  other.hidden_size = 32;
  TrainingRun run(a, other, 16, be);
  try {
    load_checkpoint(checkpoint_path(dir.path, 4), run);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different model"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_checkpoint("last", dir.path + "/nowhere"), Error);
}

TEST(Checkpoint, RotationKeepsTheNewestAndTheBest) {
  test::TempDir dir;
  for (int s : {10, 20, 30, 40}) {
    fs::create_directories(checkpoint_path(dir.path, s));
    std::ofstream(checkpoint_path(dir.path, s) + "/trainer_state.json") << "{}";
  }
  fs::create_directories(dir.path + "/.checkpoint-50.tmp.1");  // an unfinished save is not a checkpoint
  const std::string best = checkpoint_path(dir.path, 20);
  EXPECT_EQ(rotate_checkpoints(dir.path, 1, best).size(), 2u);
  auto left = list_checkpoints(dir.path);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 20);
  EXPECT_EQ(left[1].first, 40);
  EXPECT_EQ(rotate_checkpoints(dir.path, 0, "").size(), 0u);  // 0: keep all
}

// A real `hone train` process, killed with SIGKILL while it writes a checkpoint.
TEST(Checkpoint, AKillMidSaveLeavesThePreviousCheckpointLoadable) {
  test::TempDir dir;
  const std::string out = dir.path + "/out";
  std::vector<std::string> args = {HONE_BINARY, "train", "--model_name_or_path", "bert-mini", "--dataset",
                                   "synthetic:4000x8", "--per_device_train_batch_size", "1", "--max_steps",
                                   "4000", "--save_steps", "1", "--logging_steps", "1000", "--disable_tqdm",
                                   "--device", "cpu", "--output_dir", out};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, HONE_BINARY, &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);

  // Wait for one complete checkpoint, then for a save in progress, and kill the process.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto saving = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(out, ec))
      if (e.path().filename().string().starts_with(".checkpoint-")) return true;
    return false;
  };
  bool killed = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!list_checkpoints(out).empty() && saving()) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!killed) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(killed) << "no save in progress was seen within the deadline";
  ASSERT_TRUE(WIFSIGNALED(status));

  // Every checkpoint-N directory is complete and loads; the half-written one is not among them.
  auto all = list_checkpoints(out);
  ASSERT_FALSE(all.empty());
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("checkpoint-")) {
      EXPECT_TRUE(fs::exists(e.path() / "trainer_state.json")) << name;
    }
  }
  TrainingArguments a;
  a.per_device_train_batch_size = 1;
  a.dataset = "synthetic:4000x8";
  CpuBackend be;
  TrainingRun run(a, *builtin_config("bert-mini"), 8, be);
  const TrainerState st = load_checkpoint(resolve_checkpoint("last", out), run);
  EXPECT_EQ(st.global_step, all.back().first);
}

}  // namespace
}  // namespace hone
