// One process's side of several: the launcher's environment, the rendezvous, the steps a
// rank counts. (Ranks training together: tests/mpi/ and tests/gpu/.)
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>

#include "dist/rendezvous.h"
#include "dist/watchdog.h"
#include "hone/distributed.h"
#include "hone/trainer.h"

namespace hone {
namespace {

ProcessGroup from(const std::map<std::string, std::string>& env) {
  return process_group_from_env([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ProcessGroupEnv, NoLauncherIsOneProcess) {
  const ProcessGroup g = from({});
  EXPECT_EQ(g.world_size, 1);
  EXPECT_EQ(g.rank, 0);
  EXPECT_FALSE(g.distributed());
  EXPECT_EQ(g.launcher, "none");
}

TEST(ProcessGroupEnv, ReadsTorchrunMpirunAndSrun) {
  ProcessGroup g = from({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(g.launcher, "torchrun");
  EXPECT_EQ(g.rank, 3);
  EXPECT_EQ(g.world_size, 8);
  EXPECT_EQ(g.local_rank, 1);
  EXPECT_EQ(g.local_world_size, 2);
  EXPECT_EQ(g.master_addr, "node0");
  EXPECT_EQ(g.master_port, 29500);
  g = from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(g.launcher, "mpirun");
  EXPECT_EQ(g.rank, 1);
  EXPECT_EQ(g.world_size, 2);
  EXPECT_TRUE(g.master_addr.empty());
  g = from({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}});
  EXPECT_EQ(g.launcher, "srun");
  EXPECT_EQ(g.rank, 5);
  EXPECT_EQ(g.local_rank, 1);
  EXPECT_EQ(g.local_world_size, 4);
  // torchrun's names win where a job script exports both.
  g = from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(g.launcher, "torchrun");
  EXPECT_EQ(g.world_size, 2);
}

TEST(ProcessGroupEnv, InconsistentValuesAreErrors) {
  EXPECT_THROW(from({{"WORLD_SIZE", "2"}}), Error);                    // no RANK
  EXPECT_THROW(from({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), Error);     // rank past the world
  EXPECT_THROW(from({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), Error);     // not a number
  EXPECT_THROW(from({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), Error);     // an empty world
  EXPECT_THROW(from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}), Error);
  EXPECT_THROW(from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), Error);
}

TEST(Rendezvous, EveryRankGetsRankZerosBytes) {
  const int world = 4;
  ProcessGroup g;
  g.world_size = world;
  g.master_addr = "127.0.0.1";
  // A port of the kernel's choosing for rank 0 to listen on.
  g.master_port = 0;
  for (int port = 29650; port < 29700 && g.master_port == 0; ++port) {
    ProcessGroup probe = g;
    probe.world_size = 1;  // rank 0 alone: binds and returns at once
    probe.master_port = port;
    try {
      rendezvous_share(probe, {});
      g.master_port = port;
    } catch (const Error&) {
    }
  }
  ASSERT_NE(g.master_port, 0);
  const std::vector<char> blob = {'h', 'o', 'n', 'e', '\0', '\x7f'};
  std::vector<std::vector<char>> got(world);
  std::vector<std::thread> ranks;
  for (int r = world - 1; r >= 0; --r)  // the others knock before rank 0 listens
    ranks.emplace_back([&, r] {
      ProcessGroup mine = g;
      mine.rank = r;
      got[size_t(r)] = rendezvous_share(mine, r == 0 ? blob : std::vector<char>{});
    });
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[size_t(r)], blob) << "rank " << r;
}

TEST(Rendezvous, NoAddressIsAnErrorThatSaysSo) {
  ProcessGroup g;
  g.world_size = 2;
  g.rank = 1;
  try {
    rendezvous_share(g, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, AMissingRankTimesOutWithAMessage) {
  setenv("HONE_COLLECTIVE_TIMEOUT", "1", 1);
  ProcessGroup g;
  g.world_size = 3;
  g.master_addr = "127.0.0.1";
  g.master_port = 29720;
  try {
    rendezvous_share(g, {'x'});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 1 of 3 ranks"), std::string::npos) << e.what();
  }
  unsetenv("HONE_COLLECTIVE_TIMEOUT");
}

// A collective that waits past the timeout stops the process with a message naming the
// rank and the collective (a death test: the watchdog ends the process it guards).
TEST(CollectiveWatchdogDeathTest, AStalledCollectiveStopsTheJobNamingTheRank) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        bool aborted = false;
        CollectiveWatchdog w(
            3, 1,
            [](std::string* what, std::chrono::steady_clock::time_point* since) {
              *what = "ncclAllReduce";
              *since = std::chrono::steady_clock::now() - std::chrono::seconds(2);
              return true;
            },
            [&] { aborted = true; });
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::exit(aborted ? 2 : 3);  // not reached: the watchdog exits first
      },
      ::testing::ExitedWithCode(1), "rank 3: ncclAllReduce has waited 2 s .*another rank has died or hung");
}

TEST(CollectiveWatchdog, CollectivesThatFinishInTimeAreLeftAlone) {
  int polls = 0;
  {
    CollectiveWatchdog w(
        0, 1,
        [&](std::string*, std::chrono::steady_clock::time_point*) {
          ++polls;
          return false;  // nothing in flight
        },
        [] { FAIL() << "aborted"; });
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  EXPECT_GE(polls, 1);
}

TEST(DataParallelSteps, EachMicroStepTakesABatchPerRank) {
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.num_train_epochs = 1;
  StepCounts s = count_steps(a, 512, 2);
  EXPECT_EQ(s.micro_per_epoch, 64);
  EXPECT_EQ(s.total_updates, 64);
  EXPECT_EQ(s.num_train_samples, 512);
  s = count_steps(a, 500, 3);  // 42 micro-steps, the last rows wrapping to the start
  EXPECT_EQ(s.micro_per_epoch, 42);
  a.max_steps = 10;
  a.gradient_accumulation_steps = 2;
  s = count_steps(a, 512, 4);
  EXPECT_EQ(s.num_train_samples, 10 * 4 * 2 * 4);
}

TEST(DataParallelSteps, ASingleProcessCommunicatorIsTheIdentity) {
  std::unique_ptr<Communicator> c = make_single_communicator();
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->rank(), 0);
}

}  // namespace
}  // namespace hone
