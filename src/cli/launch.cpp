#include "cli/launch.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "hone/cuda.h"
#include "hone/distributed.h"
#include "hone/error.h"

namespace hone::cli {

namespace {

volatile sig_atomic_t g_signal = 0;
void remember_signal(int s) { g_signal = s; }

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("hone launch: cannot find its own executable (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

// A port nothing listens on now (the kernel's pick); rank 0 binds it a moment later.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail("hone launch: cannot open a socket to find a free port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  if (!ok) fail("hone launch: cannot find a free port; pass --master_port");
  return ntohs(a.sin_port);
}

bool on_cpu(const std::vector<std::string>& command) {
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == "--device=cpu") return true;
    if (command[i] == "--device" && i + 1 < command.size() && command[i + 1] == "cpu") return true;
  }
  return !cuda_available(nullptr);
}

[[noreturn]] void exec(const std::vector<std::string>& argv) {
  std::vector<char*> p;
  for (const std::string& s : argv) p.push_back(const_cast<char*>(s.c_str()));
  p.push_back(nullptr);
  ::execvp(p[0], p.data());
  fmt::print(stderr, "hone launch: cannot run {}: {}\n", argv[0], std::strerror(errno));
  std::fflush(stderr);
  std::_Exit(127);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// CPU ranks: mpiexec starts them (and stops the job when one fails).
int launch_mpi(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (!have_mpi())
    fail("hone launch: ranks on the CPU talk over MPI, and this build of hone has none (install libopenmpi-dev "
         "and openmpi-bin, then rebuild)");
  // mpiexec refuses root unless told; a launcher's user has already chosen to run as root.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::vector<std::string> argv = {"mpiexec", "-n", std::to_string(o.nproc_per_node), "--oversubscribe",
                                   "--bind-to", "none", "-x", "OMP_NUM_THREADS", self_path()};
  argv.insert(argv.end(), command.begin(), command.end());
  std::fflush(stdout);
  exec(argv);
}

}  // namespace

int launch_command(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (o.nproc_per_node < 1) fail("hone launch: --nproc_per_node {} (at least 1)", o.nproc_per_node);
  if (command.empty() || (command[0] != "train" && command[0] != "profile"))
    fail("hone launch runs `hone train ...` (or `hone profile ...`) on several processes: give `train` and its "
         "flags after launch's own");
  // Each rank's threads: its share of this machine's cores, unless the user said otherwise
  // (torchrun sets 1; hone's CPU work and host-side updates use more).
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN) / o.nproc_per_node);
  setenv("OMP_NUM_THREADS", std::to_string(cores).c_str(), 0);
  if (on_cpu(command)) return launch_mpi(o, command);
  const int port = o.master_port > 0 ? o.master_port : free_port();
  const std::string self = self_path();
  std::vector<pid_t> ranks;
  struct sigaction sa {};
  sa.sa_handler = remember_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fflush(stdout);
  for (int r = 0; r < o.nproc_per_node; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) fail("hone launch: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      // A group of its own, so that Ctrl-C reaches a rank once (forwarded by the launcher),
      // and an end with the launcher, should it be killed.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      const std::string n = std::to_string(o.nproc_per_node), rank = std::to_string(r);
      setenv("RANK", rank.c_str(), 1);
      setenv("LOCAL_RANK", rank.c_str(), 1);
      setenv("WORLD_SIZE", n.c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", n.c_str(), 1);
      setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 0);
      std::vector<std::string> argv = {self};
      argv.insert(argv.end(), command.begin(), command.end());
      exec(argv);
    }
    ranks.push_back(pid);
  }
  // Wait for every rank; the first that fails stops the others (SIGTERM, then SIGKILL).
  int result = 0, live = int(ranks.size());
  bool stopping = false;
  auto stop_all = [&](int sig) {
    for (pid_t p : ranks)
      if (p > 0) ::kill(p, sig);
  };
  auto since = std::chrono::steady_clock::now();
  while (live > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const auto it = std::find(ranks.begin(), ranks.end(), pid);
      if (it == ranks.end()) continue;
      const int r = int(it - ranks.begin());
      *it = -1;
      --live;
      if (status != 0 && !stopping) {
        fmt::print(stderr, "hone launch: rank {} failed ({}); stopping the other ranks\n", r, describe(status));
        std::fflush(stderr);
        result = exit_code(status);
        stopping = true;
        since = std::chrono::steady_clock::now();
        stop_all(SIGTERM);
      }
      continue;
    }
    if (g_signal && !stopping) {  // Ctrl-C: each rank stops after its update in progress
      stop_all(g_signal);
      stopping = true;
      result = 128 + g_signal;
      since = std::chrono::steady_clock::now();
    }
    if (stopping && std::chrono::steady_clock::now() - since > std::chrono::seconds(30)) stop_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace hone::cli
