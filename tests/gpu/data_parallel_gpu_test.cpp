// Two (and four) GPUs, a rank each over NCCL (hone launch): the losses of one GPU training
// the global batch, in fp32 (within the rounding of the reduction's order) and in bf16.
// Skips with fewer GPUs or without NCCL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hone/config.h"
#include "hone/cuda.h"
#include "hone/distributed.h"
#include "hone/safetensors.h"
#include "test_util.h"

namespace hone {
namespace {

int gpus() {
  const test::CommandResult r = test::run_command("nvidia-smi -L 2>/dev/null | grep -c '^GPU'");
  return r.code == 0 ? std::atoi(r.out.c_str()) : 0;
}

// Whether n GPUs and NCCL are here (and, with mixed, bf16); else why not.
bool enough_gpus(int n, std::string* why, bool mixed = false) {
  if (!cuda_available(why)) return false;
  if (mixed && !mixed_precision_available(why)) return false;
  if (!have_nccl()) {
    *why = "this build has no NCCL";
    return false;
  }
  if (gpus() < n) {
    *why = "fewer than " + std::to_string(n) + " GPUs (" + std::to_string(gpus()) + ")";
    return false;
  }
  return true;
}
bool two_gpus(std::string* why, bool mixed = false) { return enough_gpus(2, why, mixed); }

// ranks_flags: more flags for the ranks, which share the global batch of 16 unless they say.
void expect_ranks_equal_one(int ranks, const std::string& precision, double tolerance,
                            const std::string& ranks_flags = "") {
  std::string why;
  if (!enough_gpus(ranks, &why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const std::string model = test::save_dropout_free_tiny_model(tmp.path + "/model", 64, 96);
  const std::string common = "--model_name_or_path " + model +
                             " --dataset synthetic:64x32 --num_train_epochs 2 --logging_steps 1 --learning_rate 1e-3"
                             " --save_strategy no " + precision;
  const test::CommandResult one =
      test::run_hone("train " + common + " --per_device_train_batch_size 16 --output_dir " + tmp.path + "/one");
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string n = std::to_string(ranks);
  const test::CommandResult two = test::run_command(
      std::string(HONE_BINARY) + " launch --nproc_per_node " + n + " train " + common +
      (ranks_flags.find("--per_device_train_batch_size") == std::string::npos
           ? " --per_device_train_batch_size " + std::to_string(16 / ranks) + " "
           : " ") +
      ranks_flags + " --output_dir " + tmp.path + "/two");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("x " + n + " ranks (data parallel"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("nccl, started by torchrun)"), std::string::npos) << two.out;
  const std::vector<double> a = test::logged_losses(tmp.path + "/one"), b = test::logged_losses(tmp.path + "/two");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tolerance * std::abs(a[i])) << "step " << i + 1;
}

void expect_two_gpus_equal_one(const std::string& precision, double tolerance, const std::string& ranks_flags = "") {
  expect_ranks_equal_one(2, precision, tolerance, ranks_flags);
}

TEST(DataParallelGpu, TwoGpusEqualOneWithTheGlobalBatchInFp32) { expect_two_gpus_equal_one("", 1e-4); }

TEST(DataParallelGpu, TwoGpusEqualOneWithTheGlobalBatchInBf16) {
  std::string why;
  if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  // Each rank's half-precision activations round as one GPU's do; the sums differ in order.
  expect_two_gpus_equal_one("--bf16", 2e-2);
}

// ZeRO: each GPU updates its share of the parameters and broadcasts it; stage 2 reduces
// each layer's gradients to its owner alone.
TEST(DataParallelGpu, ZeroStage1And2EqualOneGpu) {
  {
    SCOPED_TRACE("stage 1");
    expect_two_gpus_equal_one("", 1e-4, "--zero_stage 1");
  }
  {
    SCOPED_TRACE("stage 2");
    expect_two_gpus_equal_one("", 1e-4, "--zero_stage 2");
  }
  // Each micro-step reduced in place into the owner's accumulated gradients.
  SCOPED_TRACE("stage 2 with accumulation");
  expect_two_gpus_equal_one("", 1e-4, "--zero_stage 2 --per_device_train_batch_size 4 --gradient_accumulation_steps 2");
}

// Four ranks: each owns a contiguous run of the parameter groups, a quarter of the bytes as
// near as whole groups allow; every reduction and broadcast runs over four.
TEST(DataParallelGpu, FourGpusEqualOneInPlainDataParallelAndZero) {
  for (const char* flags : {"", "--zero_stage 1", "--zero_stage 2",
                            "--zero_stage 2 --per_device_train_batch_size 2 --gradient_accumulation_steps 2"}) {
    SCOPED_TRACE(flags);
    expect_ranks_equal_one(4, "", 1e-4, flags);
  }
}

// Under bf16 ZeRO shards the fp32 master weights too; stage 1 reduces as plain data
// parallel does, so it takes the same steps and saves the same model and checkpoint (whose
// weights rank 0 gathers from the owners). One thing differs: with sharded master weights
// no rank has all of the F32 embedding tables, so ZeRO's lookup reads their bf16 copy (as
// DeepSpeed's bf16 model does) where plain data parallel reads the F32 tables (as
// autocast does). The embeddings then differ by bf16's rounding, which Adam's steps of
// about lr carry into the weights: 1-2% of each tensor after 8 steps on an H200, against
// about 100% for a misplaced shard. The key biases are left out: their gradient is zero
// in exact arithmetic, so both runs' are rounding noise. Stage 2 reduces to the owners, in
// another order: the losses of one GPU within bf16's rounding.
TEST(DataParallelGpu, ZeroInBf16ShardsMasterWeightsAndSavesPlainDataParallelsModel) {
  std::string why;
  if (!two_gpus(&why, true)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const std::string model = test::save_dropout_free_tiny_model(tmp.path + "/model", 64, 96);
  auto launch = [&](const std::string& name, const std::string& flags) {
    const test::CommandResult r = test::run_command(
        std::string(HONE_BINARY) + " launch --nproc_per_node 2 train --model_name_or_path " + model +
        " --dataset synthetic:64x32 --num_train_epochs 2 --logging_steps 1 --learning_rate 1e-3 --bf16"
        " --per_device_train_batch_size 8 --save_strategy steps --save_steps 3 --output_dir " + tmp.path + "/" +
        name + " " + flags);
    EXPECT_EQ(r.code, 0) << r.out;
    return r;
  };
  launch("plain", "");
  const test::CommandResult zero1 = launch("zero1", "--zero_stage 1");
  EXPECT_NE(zero1.out.find("ZeRO stage 1"), std::string::npos) << zero1.out;
  double worst = 0;
  auto expect_same_weights = [&](const std::string& file) {
    SCOPED_TRACE(file);
    const SafetensorsFile plain(tmp.path + "/plain/" + file), zero(tmp.path + "/zero1/" + file);
    ASSERT_EQ(zero.entries().size(), plain.entries().size());
    for (const SafetensorsEntry& e : plain.entries()) {
      const SafetensorsEntry* z = zero.find(e.name);
      ASSERT_TRUE(z) << e.name;
      std::vector<float> a(size_t(e.numel())), b(size_t(e.numel()));
      plain.read_f32(e, a.data(), e.numel());
      zero.read_f32(*z, b.data(), e.numel());
      if (e.name.find("key.bias") != std::string::npos) continue;
      const double err = test::norm_rel_error(b.data(), a.data(), e.numel());
      worst = std::max(worst, err);
      EXPECT_LT(err, 0.1) << e.name;
    }
  };
  const std::vector<double> plain = test::logged_losses(tmp.path + "/plain"), zero = test::logged_losses(tmp.path + "/zero1");
  ASSERT_EQ(plain.size(), 8u);
  ASSERT_EQ(zero.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(zero[i], plain[i], 1e-3 * plain[i]) << "step " << i + 1;
  expect_same_weights("model.safetensors");
  expect_same_weights("checkpoint-3/model.safetensors");
  std::printf("ZeRO-1 against plain data parallel in bf16: worst relative weight error %.2e\n", worst);
  SCOPED_TRACE("stage 2");
  expect_two_gpus_equal_one("--bf16", 2e-2, "--zero_stage 2");
}

// Evaluation shared out over two GPUs (each its batches, the logits summed over NCCL):
// with a learning rate of 0 the metrics of every evaluation are one GPU's.
TEST(DataParallelGpu, EvaluationOnTwoGpusIsOneGpus) {
  std::string why;
  if (!two_gpus(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::ofstream vocab(tmp.path + "/vocab.txt");
  const char* words[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good", "bad", "."};
  for (const char* w : words) vocab << w << "\n";
  vocab.close();
  const std::string model = test::save_dropout_free_tiny_model(tmp.path + "/model", 64, 96);
  auto write = [&](const std::string& name, int n) {
    std::ofstream f(tmp.path + "/" + name);
    for (int i = 0; i < n; ++i)
      f << nlohmann::json{{"text", std::string(i % 3 ? "the film was " : "the ") + (i % 2 ? "good ." : "bad .")},
                          {"label", i % 2 ? "yes" : "no"}}.dump()
        << "\n";
    return tmp.path + "/" + name;
  };
  const std::string common = "train --model_name_or_path " + model + " --tokenizer_name " + tmp.path +
                             " --train_file " + write("train.jsonl", 32) + " --validation_file " +
                             write("dev.jsonl", 22) +
                             " --text_column text --max_seq_length 16 --learning_rate 0 --num_train_epochs 2 --eval_strategy epoch"
                             " --do_eval --per_device_eval_batch_size 4 --save_strategy no --output_dir " + tmp.path;
  const test::CommandResult one = test::run_hone(common + "/one --per_device_train_batch_size 8");
  ASSERT_EQ(one.code, 0) << one.out;
  const test::CommandResult two = test::run_command(std::string(HONE_BINARY) + " launch --nproc_per_node 2 " + common +
                                                    "/two --per_device_train_batch_size 4");
  ASSERT_EQ(two.code, 0) << two.out;
  auto evals = [&](const std::string& out) {
    std::vector<nlohmann::json> e;
    for (const std::string& j : test::evaluations(tmp.path + "/" + out)) e.push_back(nlohmann::json::parse(j));
    return e;
  };
  const std::vector<nlohmann::json> a = evals("one"), b = evals("two");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"eval_loss", "eval_accuracy", "eval_f1"})
      EXPECT_NEAR(b[i][k].get<double>(), a[i][k].get<double>(), 1e-6 * std::abs(a[i][k].get<double>()))
          << k << ", evaluation " << i + 1;
}

// A ZeRO-1 checkpoint of two GPUs resumes on one, continuing the uninterrupted run.
TEST(DataParallelGpu, ZeroCheckpointResumesOnOneGpu) {
  std::string why;
  if (!two_gpus(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const std::string model = test::save_dropout_free_tiny_model(tmp.path + "/model", 64, 96);
  const std::string common = "--model_name_or_path " + model +
                             " --dataset synthetic:64x32 --num_train_epochs 2 --logging_steps 1 --learning_rate 1e-3";
  const test::CommandResult whole = test::run_hone("train " + common + " --per_device_train_batch_size 16 "
                                                   "--save_strategy no --output_dir " + tmp.path + "/whole");
  ASSERT_EQ(whole.code, 0) << whole.out;
  const test::CommandResult two = test::run_command(
      std::string(HONE_BINARY) + " launch --nproc_per_node 2 train " + common +
      " --per_device_train_batch_size 8 --zero_stage 1 --save_strategy steps --save_steps 3 --output_dir " + tmp.path +
      "/two");
  ASSERT_EQ(two.code, 0) << two.out;
  const test::CommandResult resumed = test::run_hone("train " + common + " --per_device_train_batch_size 16 "
                                                     "--save_strategy no --resume_from_checkpoint " + tmp.path +
                                                     "/two/checkpoint-3 --output_dir " + tmp.path + "/resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  const std::vector<double> expected = test::logged_losses(tmp.path + "/whole"), got = test::logged_losses(tmp.path + "/resumed");
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i + 3], 1e-4 * expected[i + 3]) << "step " << i + 4;
}

}  // namespace
}  // namespace hone
