// Where this process stands among the job's, from the variables its launcher set.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "hone/distributed.h"
#include "hone/error.h"

namespace hone {

namespace {

struct Reader {
  const GetEnv& get;
  const char* value(const char* name) const {
    const char* v = get(name);
    return v && *v ? v : nullptr;
  }
  int integer(const char* name, int fallback, int lowest) const {
    const char* v = value(name);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno || *end || end == v || n < lowest || n > (1 << 20))
      fail("the launcher's {}={} is not an integer of at least {}", name, v, lowest);
    return int(n);
  }
};

}  // namespace

ProcessGroup process_group_from_env(const GetEnv& get) {
  const Reader env{get};
  ProcessGroup g;
  // The launcher's own names first: torchrun's (hone launch's), then OpenMPI's, then Slurm's.
  struct Names {
    const char *launcher, *rank, *size, *local_rank, *local_size;
  };
  constexpr Names kLaunchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Names& n : kLaunchers) {
    if (!env.value(n.size)) continue;
    g.launcher = n.launcher;
    g.world_size = env.integer(n.size, 1, 1);
    g.rank = env.integer(n.rank, -1, 0);
    if (g.rank < 0) fail("the launcher set {}={} but not {}", n.size, g.world_size, n.rank);
    g.local_rank = env.integer(n.local_rank, g.rank, 0);
    // Slurm writes SLURM_NTASKS_PER_NODE as "4" or "4(x2)": the count before any '('.
    const char* ls = env.value(n.local_size);
    if (ls && g.launcher == "srun")
      g.local_world_size = std::atoi(ls) > 0 ? std::atoi(ls) : g.world_size;
    else
      g.local_world_size = env.integer(n.local_size, g.world_size, 1);
    break;
  }
  if (g.rank >= g.world_size)
    fail("the launcher gave rank {} of a world of {} processes (ranks count from 0)", g.rank, g.world_size);
  if (g.local_rank >= g.local_world_size || g.local_rank > g.rank)
    fail("the launcher gave local rank {} (of {} on this node) to global rank {}", g.local_rank, g.local_world_size,
         g.rank);
  if (const char* addr = env.value("MASTER_ADDR")) g.master_addr = addr;
  g.master_port = env.integer("MASTER_PORT", 0, 1);
  if (g.master_port > 65535) fail("MASTER_PORT={} is not a TCP port", g.master_port);
  return g;
}

ProcessGroup process_group_from_env() {
  return process_group_from_env([](const char* name) { return std::getenv(name); });
}

int collective_timeout_seconds() {
  const char* v = std::getenv("HONE_COLLECTIVE_TIMEOUT");
  if (!v || !*v) return 600;
  char* end = nullptr;
  const long s = std::strtol(v, &end, 10);
  if (*end || s < 1) fail("HONE_COLLECTIVE_TIMEOUT={} is not a number of seconds", v);
  return int(s);
}

}  // namespace hone
