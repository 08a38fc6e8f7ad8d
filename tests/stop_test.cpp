// Stopping and leftovers, with real `hone train` processes: Ctrl-C (and SIGTERM) stop after
// the update in progress with a checkpoint and exit 128 + the signal, a second one stops at
// once; an interrupted save's temporaries are removed by the next run in that directory,
// and an earlier run's log is kept.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hone/checkpoint.h"
#include "test_util.h"

extern char** environ;

namespace hone {
namespace {
namespace fs = std::filesystem;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string read(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

// A training process long enough to be interrupted (thousands of small updates on the
// CPU), its output into `log`.
pid_t spawn_training(const std::string& out, const std::string& log) {
  std::vector<std::string> args = {HONE_BINARY, "train", "--model_name_or_path", "bert-mini", "--dataset",
                                   "synthetic:4000x32", "--per_device_train_batch_size", "1", "--max_steps", "4000",
                                   "--save_steps", "100000", "--logging_steps", "1", "--disable_tqdm", "--device",
                                   "cpu", "--output_dir", out};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, HONE_BINARY, &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// Waits (bounded) until the run has logged `lines` updates.
bool wait_for_updates(const std::string& out, int lines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string log = read(out + "/trainer_log.jsonl");
    if (std::count(log.begin(), log.end(), '\n') >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignal, CtrlCStopsAfterTheUpdateSavesACheckpointAndExits130) {
  for (int sig : {SIGINT, SIGTERM}) {
    test::TempDir dir;
    const std::string out = dir.path + "/out", log = dir.path + "/log.txt";
    const pid_t pid = spawn_training(out, log);
    const bool started = wait_for_updates(out, 3);
    kill(pid, sig);
    const int status = wait_exit(pid);
    ASSERT_TRUE(started) << read(log);
    ASSERT_TRUE(WIFEXITED(status)) << read(log);
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << read(log);
    const std::string text = read(log);
    EXPECT_TRUE(has(text, sig == SIGINT ? "hone: interrupted by SIGINT after update " : "by SIGTERM after update"))
        << text;
    // The checkpoint of the step it stopped after is complete, holds the arguments, and is
    // where the message says; no finished run's results are written.
    const auto all = list_checkpoints(out);
    ASSERT_EQ(all.size(), 1u) << text;
    EXPECT_TRUE(has(text, "checkpoint saved to " + all[0].second)) << text;
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "training_args.json"})
      EXPECT_TRUE(fs::exists(fs::path(all[0].second) / f)) << f;
    EXPECT_GE(all[0].first, 3);
    EXPECT_FALSE(fs::exists(out + "/train_results.json"));
    EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  }
}

TEST(StopSignal, ASecondCtrlCStopsAtOnce) {
  test::TempDir dir;
  const std::string out = dir.path + "/out", log = dir.path + "/log.txt";
  const pid_t pid = spawn_training(out, log);
  const bool started = wait_for_updates(out, 2);
  kill(pid, SIGINT);
  // Once the first is handled (signals sent together merge into one), while the update in
  // progress and the checkpoint after it still run.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!has(read(log), "stopping after the update in progress") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  kill(pid, SIGINT);
  const int status = wait_exit(pid);
  ASSERT_TRUE(started) << read(log);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status) << "\n" << read(log);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

// A save killed midway leaves `.checkpoint-N.tmp.PID`; the next run in that directory
// removes it and says so, and leaves a live process's temporaries alone.
TEST(Leftovers, AnInterruptedSavesTemporariesAreRemovedByTheNextRun) {
  test::TempDir dir;
  const std::string out = dir.path + "/out";
  fs::create_directories(out);
  // The pid of a process that has exited, and this test's own (alive).
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  wait_exit(gone);
  const std::string stale_dir = out + "/.checkpoint-4.tmp." + std::to_string(gone);
  const std::string stale_file = out + "/.model.safetensors.tmp." + std::to_string(gone);
  const std::string live = out + "/.model.safetensors.tmp." + std::to_string(getpid());
  fs::create_directories(stale_dir);
  std::ofstream(stale_dir + "/model.safetensors") << std::string(2'000'000, 'x');
  std::ofstream(stale_file) << "partial";
  std::ofstream(live) << "being written";
  std::ofstream(out + "/.notes.tmp") << "not hone's";
  test::CommandResult r = test::run_hone("train --model_name_or_path bert-tiny --dataset synthetic:8x8 --max_steps 1 "
                                         "--save_strategy no --device cpu --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(stale_dir));
  EXPECT_FALSE(fs::exists(stale_file));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(out + "/.notes.tmp"));
  EXPECT_TRUE(has(r.out, "notice: removed " + stale_dir + " (2.0 MB), left by an interrupted save")) << r.out;
  EXPECT_TRUE(has(r.out, "notice: removed " + stale_file)) << r.out;
}

// A save killed between its two renames leaves the step's previous checkpoint as
// `.checkpoint-N.old.PID` and no checkpoint-N: the next run puts it back, not away.
TEST(Leftovers, TheOnlyCompleteCopyOfACheckpointIsRestored) {
  test::TempDir dir;
  const std::string out = dir.path + "/out";
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  wait_exit(gone);
  const std::string old = out + "/.checkpoint-4.old." + std::to_string(gone);
  const std::string replaced = out + "/.checkpoint-6.old." + std::to_string(gone);  // checkpoint-6 exists
  fs::create_directories(old);
  fs::create_directories(replaced);
  fs::create_directories(out + "/checkpoint-6");
  std::ofstream(old + "/trainer_state.json") << "{}";
  std::vector<StaleTemporary> done = remove_stale_temporaries(out);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_TRUE(fs::exists(out + "/checkpoint-4/trainer_state.json"));
  EXPECT_FALSE(fs::exists(old));
  EXPECT_FALSE(fs::exists(replaced));
  for (const StaleTemporary& t : done) {
    if (t.path == old) {
      EXPECT_EQ(t.describe(), "restored " + old + " as " + out + "/checkpoint-4: a save was interrupted before its new "
                                                                "checkpoint took that name");
    }
  }
}

// Signals a launcher set to be ignored (nohup for SIGINT in a background job) stay ignored.
TEST(StopSignal, AnIgnoredSignalStaysIgnored) {
  test::TempDir dir;
  const std::string out = dir.path + "/out", log = dir.path + "/log.txt";
  struct sigaction ignore{}, before{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &before);  // inherited by the child across exec
  const pid_t pid = spawn_training(out, log);
  sigaction(SIGINT, &before, nullptr);
  const bool started = wait_for_updates(out, 2);
  kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string seen = read(log);
  kill(pid, SIGKILL);
  wait_exit(pid);
  ASSERT_TRUE(started) << seen;
  EXPECT_FALSE(has(seen, "stopping after the update in progress")) << seen;
  EXPECT_FALSE(has(seen, "interrupted")) << seen;
}

// A new run in a directory keeps the earlier run's trainer_log.jsonl under a numbered name
// (or replaces it with --overwrite_output_dir); a resumed run continues it.
TEST(Leftovers, AnEarlierRunsLogIsKept) {
  test::TempDir dir;
  const std::string out = dir.path + "/out";
  const std::string run = "train --model_name_or_path bert-tiny --dataset synthetic:8x8 --per_device_train_batch_size 4 "
                          "--num_train_epochs 1 --logging_steps 1 --save_strategy no --device cpu --output_dir " + out;
  ASSERT_EQ(test::run_hone(run).code, 0);
  const std::string first = read(out + "/trainer_log.jsonl");
  ASSERT_FALSE(first.empty());
  test::CommandResult again = test::run_hone(run);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(read(out + "/trainer_log.1.jsonl"), first);
  EXPECT_TRUE(has(again.out, "kept the earlier run's log as " + out + "/trainer_log.1.jsonl")) << again.out;
  EXPECT_FALSE(read(out + "/trainer_log.jsonl").empty());
  test::CommandResult third = test::run_hone(run);
  EXPECT_TRUE(fs::exists(out + "/trainer_log.2.jsonl")) << third.out;
  test::CommandResult overwrite = test::run_hone(run + " --overwrite_output_dir");
  ASSERT_EQ(overwrite.code, 0) << overwrite.out;
  EXPECT_FALSE(fs::exists(out + "/trainer_log.3.jsonl"));
  EXPECT_TRUE(has(overwrite.out, "replacing the earlier run's")) << overwrite.out;
}

}  // namespace
}  // namespace hone
