// `hone launch` on the CPU: two ranks over MPI train as one process with twice the batch.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "hone/config.h"
#include "hone/distributed.h"
#include "test_util.h"

namespace hone {
namespace {

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

bool can_launch_mpi(std::string* why) {
  if (!have_mpi()) {
    *why = "this build has no MPI (install libopenmpi-dev and openmpi-bin)";
    return false;
  }
  if (test::run_command("command -v mpiexec").code != 0) {
    *why = "mpiexec is not on PATH (openmpi-bin)";
    return false;
  }
  return true;
}

// On `ranks` processes with the global batch of 8 (hone launch when ranks > 1).
test::CommandResult train_on(int ranks, const std::string& flags) {
  const std::string batch = " --per_device_train_batch_size " + std::to_string(8 / ranks);
  if (ranks == 1) return test::run_hone("train " + flags + batch);
  return test::run_command(std::string(HONE_BINARY) + " launch --nproc_per_node " + std::to_string(ranks) +
                           " train " + flags + batch);
}

TEST(Launch, TwoCpuRanksTrainAsOneProcessWithTwiceTheBatch) {
  std::string why;
  if (!can_launch_mpi(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const std::string model = test::save_dropout_free_tiny_model(tmp.path + "/model", 32, 48);
  const std::string common = "--model_name_or_path " + model +
                             " --dataset synthetic:32x16 --num_train_epochs 2 --logging_steps 1 --device cpu"
                             " --learning_rate 1e-3 --save_strategy no";
  const test::CommandResult one =
      test::run_hone("train " + common + " --per_device_train_batch_size 8 --output_dir " + tmp.path + "/one");
  ASSERT_EQ(one.code, 0) << one.out;
  const test::CommandResult two = test::run_command(std::string(HONE_BINARY) + " launch --nproc_per_node 2 train " +
                                                    common + " --per_device_train_batch_size 4 --output_dir " +
                                                    tmp.path + "/two");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("x 2 ranks (data parallel, mpi, started by mpirun)"), std::string::npos) << two.out;
  const std::vector<double> a = test::logged_losses(tmp.path + "/one"), b = test::logged_losses(tmp.path + "/two");
  ASSERT_EQ(a.size(), 8u);  // 2 epochs of 32 rows in global batches of 8
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  const nlohmann::json r = read_json(tmp.path + "/two/train_results.json");
  EXPECT_EQ(r["epoch"], 2.0);
  EXPECT_NEAR(r["train_loss"].get<double>(), read_json(tmp.path + "/one/train_results.json")["train_loss"].get<double>(),
              1e-5);
  // One log, written by rank 0 alone (a second writer would double its lines).
  EXPECT_EQ(test::logged_losses(tmp.path + "/two").size(), 8u);
}

// A checkpoint that rank 0 wrote for two ranks resumes on one process and the other way
// round, each continuing the uninterrupted run's loss curve (the same global batch).
TEST(Launch, ResumesOnAnotherNumberOfRanks) {
  std::string why;
  if (!can_launch_mpi(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const std::string model = test::save_dropout_free_tiny_model(tmp.path + "/model", 32, 48);
  const std::string common = "--model_name_or_path " + model +
                             " --dataset synthetic:32x16 --num_train_epochs 2 --logging_steps 1 --device cpu"
                             " --learning_rate 1e-3 --output_dir ";
  const test::CommandResult whole = train_on(1, common + tmp.path + "/whole --save_strategy no");
  ASSERT_EQ(whole.code, 0) << whole.out;
  const std::vector<double> expected = test::logged_losses(tmp.path + "/whole");
  ASSERT_EQ(expected.size(), 8u);
  for (const auto& [first, second] : {std::pair{2, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE(std::to_string(first) + " ranks, then " + std::to_string(second));
    const std::string first_out = tmp.path + "/first" + std::to_string(first);
    const std::string second_out = tmp.path + "/second" + std::to_string(second);
    const test::CommandResult a = train_on(first, common + first_out + " --save_strategy steps --save_steps 3");
    ASSERT_EQ(a.code, 0) << a.out;
    const test::CommandResult b = train_on(second, common + second_out + " --save_strategy no --resume_from_checkpoint " +
                                                       first_out + "/checkpoint-3");
    ASSERT_EQ(b.code, 0) << b.out;
    const std::vector<double> got = test::logged_losses(second_out);  // steps 4 to 8
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], expected[i + 3], 1e-5 * expected[i + 3]) << "step " << i + 4;
  }
}

TEST(Launch, AFailingRankStopsTheJobWithItsExitCode) {
  std::string why;
  if (!can_launch_mpi(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const test::CommandResult r = test::run_command(std::string(HONE_BINARY) +
                                                  " launch --nproc_per_node 2 train --device cpu --model_name_or_path "
                                                  "no-such-model --dataset synthetic:8x8 --output_dir " +
                                                  tmp.path + "/out");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("hone: error:"), std::string::npos) << r.out;
}

TEST(Launch, NeedsATrainCommand) {
  const test::CommandResult r = test::run_hone("launch --nproc_per_node 2 predict --device cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("hone launch runs `hone train"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hone
