// NCCL between GPUs, one per process. Collectives run on a stream of their own that waits
// for the compute stream's work queued before them, so that backward goes on while a
// layer's gradients are summed; the compute stream waits for them only where it reads them.
#ifdef HONE_HAVE_NCCL
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "dist/rendezvous.h"
#include "dist/transports.h"
#include "dist/watchdog.h"

#define HONE_NCCL_CHECK(call)                                                                   \
  do {                                                                                          \
    ncclResult_t hone_nr_ = (call);                                                             \
    if (hone_nr_ != ncclSuccess)                                                                \
      ::hone::fail("{} failed at {}:{}: {} ({})", #call, __FILE__, __LINE__, ncclGetErrorString(hone_nr_), \
                   ncclGetLastError(nullptr));                                                  \
  } while (0)

namespace hone {

namespace {

CudaBackend& cuda_of(Backend& be) {
  auto* c = dynamic_cast<CudaBackend*>(&be);
  HONE_CHECK(c, "an NCCL collective on the {} backend", be.name());
  return *c;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CudaBackend& be, const ProcessGroup& g) : Communicator(g) {
    // NVLink multicast (NVLS) can take a shared host's GPUs out of service; hone does not
    // need it, and leaves it off unless the user set otherwise.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId id{};
    if (g.rank == 0) HONE_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::vector<char> mine(reinterpret_cast<const char*>(&id), reinterpret_cast<const char*>(&id) + sizeof id);
    const std::vector<char> shared =
        g.master_addr.empty() && have_mpi() ? mpi_share(g, mine) : rendezvous_share(g, mine);
    if (shared.size() != sizeof id) fail("rank {}: the communicator's id came with {} bytes", g.rank, shared.size());
    std::memcpy(&id, shared.data(), sizeof id);
    HONE_CUDA_CHECK(cudaSetDevice(be.device_index()));
    size_t free_before = 0, free_after = 0, total = 0;
    HONE_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    HONE_NCCL_CHECK(ncclCommInitRank(&comm_, g.world_size, id, g.rank));
    HONE_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    device_bytes_ = free_before > free_after ? free_before - free_after : 0;
    int least = 0, greatest = 0;
    HONE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    // High priority: a reduction's blocks go first once backward has left SMs free.
    HONE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t& e : events_) HONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t* e : {&fork_, &join_}) HONE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    HONE_CUDA_CHECK(cudaMalloc(&word_, sizeof(float)));
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        g.rank, collective_timeout_seconds(),
        [this](std::string* what, std::chrono::steady_clock::time_point* since) { return stalled(what, since); },
        [this] { ncclCommAbort(comm_); });
  }
  ~NcclCommunicator() override {
    watchdog_.reset();
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaEvent_t e : {fork_, join_}) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
    cudaFree(word_);
  }
  std::string name() const override { return "nccl"; }
  size_t device_bytes() const override { return device_bytes_; }

  void all_reduce_sum(Backend& be, Tensor& t) override {
    HONE_CHECK(t.device == Device::CUDA && t.dtype == DType::F32, "NCCL all-reduce of a {} tensor",
               dtype_name(t.dtype));
    follow(cuda_of(be));
    HONE_NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), ncclFloat32, ncclSum, comm_, stream_));
    queued("ncclAllReduce");
  }
  void reduce_sum(Backend& be, Tensor& t, int root) override {
    HONE_CHECK(t.device == Device::CUDA && t.dtype == DType::F32, "NCCL reduce of a {} tensor", dtype_name(t.dtype));
    follow(cuda_of(be));
    HONE_NCCL_CHECK(ncclReduce(t.data, t.data, size_t(t.numel()), ncclFloat32, ncclSum, root, comm_, stream_));
    queued("ncclReduce");
  }
  void broadcast(Backend& be, Tensor& t, int root) override {
    HONE_CHECK(t.device == Device::CUDA, "NCCL broadcast of a host tensor");
    follow(cuda_of(be));
    HONE_NCCL_CHECK(ncclBroadcast(t.data, t.data, t.bytes(), ncclUint8, root, comm_, stream_));
    queued("ncclBroadcast");
  }
  void wait_collectives(Backend& be) override {
    HONE_CUDA_CHECK(cudaEventRecord(join_, stream_));
    HONE_CUDA_CHECK(cudaStreamWaitEvent(cuda_of(be).stream(), join_, 0));
  }
  void barrier(Backend& be) override {
    follow(cuda_of(be));
    HONE_NCCL_CHECK(ncclAllReduce(word_, word_, 1, ncclFloat32, ncclSum, comm_, stream_));
    queued("a barrier (ncclAllReduce)");
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // The collective stream waits for the compute stream's work queued so far.
  void follow(CudaBackend& be) {
    HONE_CUDA_CHECK(cudaEventRecord(fork_, be.stream()));
    HONE_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
    if (measured_calls_ < kMeasuredCalls) HONE_CUDA_CHECK(cudaMemGetInfo(&free_before_call_, &total_));
  }
  // An event after the collective, for the watchdog; the oldest finished ones are dropped.
  void queued(const char* what) {
    // NCCL connects its peers for an algorithm at the first collective that uses it (which
    // takes less memory than connecting all at the start): what it took is counted over the
    // first calls, while nothing else allocates (the plan's arenas are allocated already).
    if (measured_calls_ < kMeasuredCalls) {
      ++measured_calls_;
      size_t free_after = 0;
      HONE_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_));
      if (free_before_call_ > free_after) device_bytes_ += free_before_call_ - free_after;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    while (!flight_.empty() && cudaEventQuery(events_[flight_.front().slot]) == cudaSuccess) flight_.pop_front();
    if (flight_.size() == kEvents) {  // a full ring: the oldest must finish first
      HONE_CUDA_CHECK(cudaEventSynchronize(events_[flight_.front().slot]));
      flight_.pop_front();
    }
    const int slot = next_++ % kEvents;
    HONE_CUDA_CHECK(cudaEventRecord(events_[slot], stream_));
    flight_.push_back({slot, what, std::chrono::steady_clock::now()});
  }
  bool stalled(std::string* what, std::chrono::steady_clock::time_point* since) {
    std::lock_guard<std::mutex> lock(mutex_);
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      *what = std::string("NCCL (") + ncclGetErrorString(async) + ")";
      *since = std::chrono::steady_clock::time_point{};  // at once
      return true;
    }
    while (!flight_.empty()) {
      const cudaError_t q = cudaEventQuery(events_[flight_.front().slot]);
      if (q == cudaErrorNotReady) break;
      flight_.pop_front();
    }
    if (flight_.empty()) return false;
    *what = flight_.front().what;
    *since = flight_.front().since;
    return true;
  }

  struct InFlight {
    int slot;
    const char* what;
    std::chrono::steady_clock::time_point since;
  };
  static constexpr size_t kEvents = 512;
  ncclComm_t comm_ = nullptr;
  size_t device_bytes_ = 0;  // what ncclCommInitRank and the first calls took on this GPU
  static constexpr int kMeasuredCalls = 1024;  // tens of updates' collectives
  int measured_calls_ = 0;
  size_t free_before_call_ = 0, total_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[kEvents] = {};
  cudaEvent_t fork_ = nullptr, join_ = nullptr;  // compute -> collectives, collectives -> compute
  float* word_ = nullptr;
  std::mutex mutex_;
  std::deque<InFlight> flight_;
  int64_t next_ = 0;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Backend& be, const ProcessGroup& g) {
  return std::make_unique<NcclCommunicator>(cuda_of(be), g);
}

}  // namespace hone
#endif
