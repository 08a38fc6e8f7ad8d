#pragma once
// Several processes training one model: where this process stands among them (read from
// the launcher's environment, as torchrun, mpirun and srun set it), and the collectives
// they train with, behind one interface: NCCL between GPUs, MPI between CPU processes.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "hone/backend.h"

namespace hone {

// This process's place in the job.
struct ProcessGroup {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;  // torchrun's rendezvous (NCCL's id goes through it); empty: none
  int master_port = 0;
  std::string launcher = "none";  // "torchrun" (also hone launch), "mpirun", "srun" or "none"
  bool distributed() const { return world_size > 1; }
};

// Reads RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun, hone
// launch), else OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (mpirun), else
// SLURM_PROCID/NTASKS/LOCALID (srun, with MASTER_ADDR and MASTER_PORT from the job script,
// as Slurm users set them for torchrun). Inconsistent values are an error naming them.
using GetEnv = std::function<const char*(const char*)>;
ProcessGroup process_group_from_env(const GetEnv& get);
ProcessGroup process_group_from_env();  // of this process

// Collectives over F32 tensors of one backend. Each is queued after the work queued on the
// backend so far (on a GPU, on a stream of its own, so that backward goes on meanwhile;
// on the CPU it is done when the call returns); the backend's work queued after
// wait_collectives() sees its result. Every rank must make the same calls in the same
// order. A rank that does not answer within the timeout fails the job with a message.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "nccl", "mpi" or "single process"
  int rank() const { return group_.rank; }
  int world_size() const { return group_.world_size; }
  const ProcessGroup& group() const { return group_; }

  // t = the sum of every rank's t.
  virtual void all_reduce_sum(Backend& be, Tensor& t) = 0;
  // root's t = the sum of every rank's t (the others' t is left as it was).
  virtual void reduce_sum(Backend& be, Tensor& t, int root) = 0;
  // t = root's t on every rank.
  virtual void broadcast(Backend& be, Tensor& t, int root) = 0;
  // The backend's later work waits for the collectives queued so far.
  virtual void wait_collectives(Backend& be) {}
  // Blocks until every rank has called it (the host waits for its queued work first).
  virtual void barrier(Backend& be) = 0;
  // Device memory the communicator's library took for its own buffers (outside the memory
  // plan), measured as it started and over its first collectives; 0 where it takes none.
  virtual size_t device_bytes() const { return 0; }

 protected:
  explicit Communicator(ProcessGroup g) : group_(std::move(g)) {}
  ProcessGroup group_;
};

// One process: every collective is the identity.
std::unique_ptr<Communicator> make_single_communicator();
// The communicator this backend's ranks share: NCCL for the CUDA backend (its unique id
// passed through MPI when the job was started by mpirun and hone has MPI, else through
// MASTER_ADDR:MASTER_PORT), MPI for the CPU backend. Errors name what is missing (a build
// without NCCL or MPI, a launcher that set no rendezvous).
std::unique_ptr<Communicator> make_communicator(Backend& be, const ProcessGroup& g);

// Which transports this build has, for `hone env` and error messages.
bool have_mpi();
bool have_nccl();

// Seconds a collective or a rendezvous may wait for the other ranks
// (HONE_COLLECTIVE_TIMEOUT, default 600).
int collective_timeout_seconds();

}  // namespace hone
