#include <fmt/format.h>

#include "dist/transports.h"
#include "hone/error.h"

namespace hone {

namespace {

class SingleProcess final : public Communicator {
 public:
  SingleProcess() : Communicator(ProcessGroup{}) {}
  std::string name() const override { return "single process"; }
  void all_reduce_sum(Backend&, Tensor&) override {}
  void reduce_sum(Backend&, Tensor&, int root) override {
    HONE_CHECK(root == 0, "reduce to rank {} of a single process", root);
  }
  void broadcast(Backend&, Tensor&, int root) override {
    HONE_CHECK(root == 0, "broadcast from rank {} of a single process", root);
  }
  void barrier(Backend&) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleProcess>(); }

bool have_mpi() {
#ifdef HONE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool have_nccl() {
#ifdef HONE_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_communicator(Backend& be, const ProcessGroup& g) {
  if (!g.distributed()) return make_single_communicator();
  if (be.device() == Device::CUDA) {
    if (!have_nccl())
      fail("{} ranks on GPUs communicate through NCCL, and this build of hone has none (CMake found no nccl.h; "
           "install libnccl-dev or set NCCL_ROOT)",
           g.world_size);
    return make_nccl_communicator(be, g);
  }
  if (!have_mpi())
    fail("{} ranks on the CPU communicate through MPI, and this build of hone has none (install libopenmpi-dev "
         "and rebuild)",
         g.world_size);
  if (g.launcher != "mpirun" && g.launcher != "srun")
    fail("{} ranks on the CPU communicate through MPI: start them with mpirun -n {} (or hone launch, which does), "
         "not with {}",
         g.world_size, g.world_size, g.launcher);
  return make_mpi_communicator(g);
}

#ifndef HONE_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup&) { fail("this build of hone has no MPI"); }
std::vector<char> mpi_share(const ProcessGroup&, const std::vector<char>&) { fail("this build of hone has no MPI"); }
#endif
#ifndef HONE_HAVE_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(Backend&, const ProcessGroup&) {
  fail("this build of hone has no NCCL");
}
#endif

}  // namespace hone
