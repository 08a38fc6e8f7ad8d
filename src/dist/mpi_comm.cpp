// MPI between CPU processes: collectives on host tensors, blocking, in the caller's order.
#ifdef HONE_HAVE_MPI
#include <mpi.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "dist/transports.h"
#include "dist/watchdog.h"
#include "hone/error.h"

namespace hone {

namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  fail("MPI: {} failed: {}", what, std::string(text, size_t(n)));
}

// MPI is initialised once per process, on first use, and finalised at exit.
void ensure_mpi(const ProcessGroup& g) {
  static std::once_flag once;
  std::call_once(once, [] {
    int ready = 0;
    check_mpi(MPI_Initialized(&ready), "MPI_Initialized");
    if (!ready) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit([] {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
      });
    }
  });
  int rank = 0, size = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  if (rank != g.rank || size != g.world_size)
    fail("MPI says this is rank {} of {}, the launcher's environment ({}) rank {} of {}", rank, size, g.launcher,
         g.rank, g.world_size);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const ProcessGroup& g) : Communicator(g) {
    ensure_mpi(g);
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    // Errors come back as codes, so that they become messages rather than MPI's abort.
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        g.rank, collective_timeout_seconds(),
        [this](std::string* what, std::chrono::steady_clock::time_point* since) {
          std::lock_guard<std::mutex> lock(mutex_);
          if (!in_flight_) return false;
          *what = in_flight_;
          *since = since_;
          return true;
        },
        [] { MPI_Abort(MPI_COMM_WORLD, 1); });
  }
  ~MpiCommunicator() override {
    watchdog_.reset();
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Comm_free(&comm_);
  }
  std::string name() const override { return "mpi"; }

  void all_reduce_sum(Backend& be, Tensor& t) override {
    check_host_f32(be, t, "all_reduce_sum");
    Guard g(*this, "MPI_Allreduce");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.data, int(t.numel()), MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
  }
  void reduce_sum(Backend& be, Tensor& t, int root) override {
    check_host_f32(be, t, "reduce_sum");
    Guard g(*this, "MPI_Reduce");
    const bool mine = rank() == root;
    check_mpi(MPI_Reduce(mine ? MPI_IN_PLACE : t.data, mine ? t.data : nullptr, int(t.numel()), MPI_FLOAT, MPI_SUM,
                         root, comm_),
              "MPI_Reduce");
  }
  void broadcast(Backend& be, Tensor& t, int root) override {
    HONE_CHECK(t.device == Device::CPU, "MPI broadcast of a tensor on the GPU");
    Guard g(*this, "MPI_Bcast");
    check_mpi(MPI_Bcast(t.data, int(t.bytes()), MPI_BYTE, root, comm_), "MPI_Bcast");
  }
  void barrier(Backend& be) override {
    be.synchronize();
    Guard g(*this, "MPI_Barrier");
    check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
  }

  std::vector<char> share(const std::vector<char>& blob) {
    int n = int(blob.size());
    {
      Guard g(*this, "MPI_Bcast");
      check_mpi(MPI_Bcast(&n, 1, MPI_INT, 0, comm_), "MPI_Bcast");
    }
    std::vector<char> out = rank() == 0 ? blob : std::vector<char>(size_t(n));
    Guard g(*this, "MPI_Bcast");
    check_mpi(MPI_Bcast(out.data(), n, MPI_BYTE, 0, comm_), "MPI_Bcast");
    return out;
  }

 private:
  // Marks a blocking call for the watchdog.
  struct Guard {
    MpiCommunicator& c;
    Guard(MpiCommunicator& comm, const char* what) : c(comm) {
      std::lock_guard<std::mutex> lock(c.mutex_);
      c.in_flight_ = what;
      c.since_ = std::chrono::steady_clock::now();
    }
    ~Guard() {
      std::lock_guard<std::mutex> lock(c.mutex_);
      c.in_flight_ = nullptr;
    }
  };
  static void check_host_f32(const Backend& be, const Tensor& t, const char* op) {
    HONE_CHECK(be.device() == Device::CPU && t.device == Device::CPU && t.dtype == DType::F32,
               "MPI {} of a {} tensor on the {} backend", op, dtype_name(t.dtype), be.name());
    HONE_CHECK(t.numel() < (int64_t(1) << 31), "MPI {} of {} elements", op, t.numel());
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::mutex mutex_;
  const char* in_flight_ = nullptr;
  std::chrono::steady_clock::time_point since_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup& g) {
  return std::make_unique<MpiCommunicator>(g);
}

std::vector<char> mpi_share(const ProcessGroup& g, const std::vector<char>& blob) {
  MpiCommunicator c(g);
  return c.share(blob);
}

}  // namespace hone
#endif
