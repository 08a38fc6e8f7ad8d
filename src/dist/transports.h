#pragma once
// The transports behind make_communicator, each built only where its library was found.
#include <memory>
#include <vector>

#include "hone/distributed.h"

namespace hone {

// Between CPU processes started by mpirun (or srun with OpenMPI's PMIx).
std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup& g);
// Rank 0's bytes on every rank, through MPI (for NCCL's id under mpirun).
std::vector<char> mpi_share(const ProcessGroup& g, const std::vector<char>& blob);
// Between GPUs, one per process (src/cuda/nccl_comm.cpp).
std::unique_ptr<Communicator> make_nccl_communicator(Backend& be, const ProcessGroup& g);

}  // namespace hone
