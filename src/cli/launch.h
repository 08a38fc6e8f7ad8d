#pragma once
// `hone launch`: one process per GPU on this machine, as torchrun starts them.
#include <string>
#include <vector>

namespace hone::cli {

struct LaunchOptions {
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port
};

// Runs `hone <command...>` as nproc_per_node ranks and returns the job's exit code: 0 when
// every rank exits 0, else the first failing rank's, after the others were stopped. On
// GPUs the ranks are this executable's children with torchrun's variables; on the CPU
// (--device cpu, or no GPU) they are started by mpiexec, since CPU ranks talk over MPI.
int launch_command(const LaunchOptions& o, const std::vector<std::string>& command);

}  // namespace hone::cli
