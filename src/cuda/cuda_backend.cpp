#include "cuda/cuda_backend.h"

#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "cuda/check.h"
#include "cuda/sdpa.h"
#include "cuda/warm_start.h"

namespace hone {

bool cuda_available(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why)
      *why = e != cudaSuccess ? fmt::format("no usable CUDA device: {}", cudaGetErrorString(e))
                              : std::string("no CUDA device found");
    cudaGetLastError();  // clear the sticky error so later calls are not confused by it
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) {
  std::string why;
  if (!cuda_available(&why)) fail("--device cuda: {}", why);
  return std::make_unique<CudaBackend>(options);
}

CudaBackend::CudaBackend(const CudaOptions& options)
    : device_(options.device), tf32_(options.tf32), time_products_(options.time_products) {
  HONE_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  HONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  if (prop.major < 8)
    fail("GPU {} ({}) has compute capability {}.{}; hone needs 8.0 (Ampere) or newer", device_, prop.name,
         prop.major, prop.minor);
  name_ = fmt::format("cuda:{} ({})", device_, prop.name);
  sms_ = prop.multiProcessorCount;
  cudnn_attention_ = cuda::cudnn_attention_selected();
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  lt_ = cuda::take_prepared_lt(device_);
  if (!lt_) HONE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  HONE_CUDA_CHECK(cudaMalloc(&gemm_workspace_, kGemmWorkspaceBytes));
  const size_t reduce_bytes = kReduceSlots * sizeof(double) + sizeof(unsigned);
  HONE_CUDA_CHECK(cudaMalloc(&reduce_scratch_, reduce_bytes));
  HONE_CUDA_CHECK(cudaMemset(reduce_scratch_, 0, reduce_bytes));
  for (auto [ptr, one] : {std::pair{&ones_bf16_, float_to_bf16(1.0f)}, std::pair{&ones_f16_, float_to_f16(1.0f)}}) {
    const std::vector<uint16_t> host(size_t(kOnesLength), one);
    HONE_CUDA_CHECK(cudaMalloc(ptr, host.size() * sizeof(uint16_t)));
    HONE_CUDA_CHECK(cudaMemcpy(*ptr, host.data(), host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
  for (cudaStream_t* s : {&copy_stream_, &to_host_stream_, &to_device_stream_})
    HONE_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&copied_, &read_back_, &staged_, &taken_})
    HONE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  for (cudaEvent_t& e : transfer_events_) HONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (cudaEvent_t& e : mark_events_) HONE_CUDA_CHECK(cudaEventCreate(&e));
}

CudaBackend::~CudaBackend() {
  // Destructors must not throw: errors here are ignored (the process is ending the run).
  abort_recording();
  if (stream_) cudaStreamSynchronize(stream_);
  for (cudaStream_t s : {copy_stream_, to_host_stream_, to_device_stream_})
    if (s) cudaStreamSynchronize(s);
  for (Recording& r : recordings_) destroy(r);
  cuda::destroy_sdpa_cache(sdpa_);
  for (cudaEvent_t e : {copied_, read_back_, staged_, taken_})
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : mark_events_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : transfer_events_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : stamp_events_) cudaEventDestroy(e);
  if (gemm_workspace_) cudaFree(gemm_workspace_);
  if (ones_bf16_) cudaFree(ones_bf16_);
  if (ones_f16_) cudaFree(ones_f16_);
  if (reduce_scratch_) cudaFree(reduce_scratch_);
  if (lt_) cublasLtDestroy(lt_);
  for (cudaStream_t s : {copy_stream_, to_host_stream_, to_device_stream_})
    if (s) cudaStreamDestroy(s);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("out of GPU memory on {}: cudaMalloc of {:.1f} MiB failed ({}); {:.1f} MiB free of {:.1f} MiB", name_,
         double(bytes) / (1 << 20), cudaGetErrorString(e), double(free_b) / (1 << 20), double(total_b) / (1 << 20));
  }
  return p;
}

void CudaBackend::deallocate(void* p) noexcept { cudaFree(p); }

namespace {

// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (f >> key >> kib)
    if (key == "MemAvailable:") return kib << 10;
  return 0;
}

}  // namespace

// Page-locking through cudaHostAlloc costs about 0.5 s per GB (2.96 s for an offloaded
// bert-large's 6 GB on an H100 host); the same memory from aligned_alloc, on transparent
// huge pages where the kernel gives them, first touched by every core and then registered
// takes a tenth of that (0.30 s). Small buffers keep cudaHostAlloc.
void* CudaBackend::allocate_host(size_t bytes) {
  const auto mib = [](size_t b) { return double(b) / (1 << 20); };
  if (bytes < kRegisteredHostBytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("cudaMallocHost of {:.1f} MiB of pinned host memory failed: {}", mib(bytes), cudaGetErrorString(e));
    }
    return p;
  }
  constexpr size_t kHugePage = size_t(2) << 20;
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Touching memory the host lacks would end the process, not fail here.
  const size_t available = host_memory_available();
  if (available && size > available)
    fail("{:.1f} MiB of page-locked host memory asked for, but the host has {:.1f} MiB available", mib(size),
         mib(available));
  char* p = static_cast<char*>(std::aligned_alloc(kHugePage, size));
  if (!p) fail("out of host memory: could not allocate {:.1f} MiB to page-lock", mib(size));
  madvise(p, size, MADV_HUGEPAGE);  // a hint: without it the pages are 4 KiB, still correct
  const size_t pages = size / kHugePage;
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  std::vector<std::thread> touch;
  for (unsigned t = 0; t < threads; ++t)
    touch.emplace_back([=] {
      for (size_t i = pages * t / threads; i < pages * (t + 1) / threads; ++i) std::memset(p + i * kHugePage, 0, kHugePage);
    });
  for (std::thread& t : touch) t.join();
  const cudaError_t e = cudaHostRegister(p, size, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::free(p);
    fail("cudaHostRegister of {:.1f} MiB of host memory failed: {}", mib(size), cudaGetErrorString(e));
  }
  std::lock_guard<std::mutex> lock(registered_mutex_);
  registered_.insert(p);
  return p;
}

void CudaBackend::deallocate_host(void* p) noexcept {
  {
    std::lock_guard<std::mutex> lock(registered_mutex_);
    if (registered_.erase(p)) {
      cudaHostUnregister(p);
      std::free(p);
      return;
    }
  }
  cudaFreeHost(p);
}

void CudaBackend::record_mark(StepSpan s) {
  if (dry_run) return;
  if (recording_) {  // a new segment, which replay() will mark
    finish_segment();
    next_segment_ = {true, s, nullptr};
    start_segment();
    return;
  }
  if (marks_recorded_ - marks_read_ == kMarkRing) read_marks(marks_read_ + 1);  // the oldest, long done
  const int i = int(marks_recorded_ % kMarkRing);
  HONE_CUDA_CHECK(cudaEventRecord(mark_events_[i], stream_));
  mark_spans_[i] = s;
  ++marks_recorded_;
}

void CudaBackend::read_marks(int64_t upto) {
  for (; marks_read_ < upto && marks_read_ + 1 < marks_recorded_; ++marks_read_) {
    const int i = int(marks_read_ % kMarkRing), j = int((marks_read_ + 1) % kMarkRing);
    HONE_CUDA_CHECK(cudaEventSynchronize(mark_events_[j]));
    float ms = 0;
    HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, mark_events_[i], mark_events_[j]));
    span_seconds_[size_t(mark_spans_[i])] += double(ms) / 1e3;
  }
}

void CudaBackend::stamp() {
  HONE_CHECK(!recording_, "op timing while recording a CUDA graph");
  if (stamps_used_ == stamp_events_.size()) {
    cudaEvent_t e = nullptr;
    HONE_CUDA_CHECK(cudaEventCreate(&e));
    stamp_events_.push_back(e);
  }
  HONE_CUDA_CHECK(cudaEventRecord(stamp_events_[stamps_used_++], stream_));
}

std::vector<double> CudaBackend::take_stamps() {
  std::vector<double> out;
  if (stamps_used_ == 0) return out;
  HONE_CUDA_CHECK(cudaEventSynchronize(stamp_events_[stamps_used_ - 1]));
  out.reserve(stamps_used_);
  for (size_t i = 0; i < stamps_used_; ++i) {
    float ms = 0;
    HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, stamp_events_.front(), stamp_events_[i]));
    out.push_back(double(ms) / 1e3);
  }
  stamps_used_ = 0;
  return out;
}

void CudaBackend::push_range(const char* name) { nvtxRangePushA(name); }
void CudaBackend::pop_range() { nvtxRangePop(); }

SpanSeconds CudaBackend::take_span_seconds() {
  if (marks_recorded_ > 0) {
    mark(mark_spans_[(marks_recorded_ - 1) % kMarkRing]);  // closes the running span, which goes on
    read_marks(marks_recorded_ - 1);
  }
  SpanSeconds out = span_seconds_;
  span_seconds_ = {};
  return out;
}

void CudaBackend::wait_for_copies() {
  HONE_CUDA_CHECK(cudaEventSynchronize(copied_));
  HONE_CUDA_CHECK(cudaEventSynchronize(staged_));
}

void CudaBackend::synchronize() {
  HONE_CHECK(!recording_, "synchronize() while recording a CUDA graph");
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  // A recorded copy would read the same host address at every replay: host inputs are
  // staged outside recordings. Copies to (page-locked) host memory may be recorded.
  HONE_CHECK(!(recording_ && src.device == Device::CPU), "a copy from host memory while recording a CUDA graph");
  HONE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, stream_));
  if (recording_) {  // replay() records read_back_
    building_.reads_host |= dst.device == Device::CPU;
    return;
  }
  if (src.device == Device::CPU) HONE_CUDA_CHECK(cudaEventRecord(copied_, stream_));
  if (dst.device == Device::CPU) HONE_CUDA_CHECK(cudaEventRecord(read_back_, stream_));
}

void CudaBackend::stage(const Tensor& host, Tensor& staging) {
  HONE_CHECK(!recording_, "stage() while recording a CUDA graph");
  HONE_CHECK(host.bytes() == staging.bytes(), "stage: {} bytes into a staging buffer of {}", host.bytes(),
             staging.bytes());
  HONE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, taken_, 0));  // the staging buffer is free again
  HONE_CUDA_CHECK(cudaMemcpyAsync(staging.data, host.data, host.bytes(), cudaMemcpyHostToDevice, copy_stream_));
  HONE_CUDA_CHECK(cudaEventRecord(staged_, copy_stream_));
}

void CudaBackend::take_staged(const Tensor& staging, Tensor& dst) {
  HONE_CHECK(!recording_, "take_staged() while recording a CUDA graph");
  HONE_CHECK(staging.bytes() == dst.bytes(), "take_staged: {} bytes into {}", staging.bytes(), dst.bytes());
  HONE_CUDA_CHECK(cudaStreamWaitEvent(stream_, staged_, 0));
  HONE_CUDA_CHECK(cudaMemcpyAsync(dst.data, staging.data, staging.bytes(), cudaMemcpyDeviceToDevice, stream_));
  HONE_CUDA_CHECK(cudaEventRecord(taken_, stream_));
}

// The transfer stream waits for the compute stream's work so far (an event on stream_,
// the ticket's own, recorded again once the copy is queued).
Backend::Transfer CudaBackend::transfer(cudaStream_t s, const Tensor& src, Tensor& dst) {
  HONE_CHECK(!recording_, "a transfer while recording a CUDA graph");
  HONE_CHECK(src.bytes() == dst.bytes(), "transfer: {} bytes into {}", src.bytes(), dst.bytes());
  const Transfer t{transfers_++};
  cudaEvent_t e = transfer_event(t);
  HONE_CUDA_CHECK(cudaEventRecord(e, stream_));
  HONE_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0));
  HONE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, s));
  HONE_CUDA_CHECK(cudaEventRecord(e, s));
  return t;
}

Backend::Transfer CudaBackend::transfer_to_host(const Tensor& src, Tensor& host_dst) {
  HONE_CHECK(host_dst.device == Device::CPU && src.device == Device::CUDA,
             "transfer_to_host: from the device's memory to the host's only");
  return transfer(to_host_stream_, src, host_dst);
}

Backend::Transfer CudaBackend::transfer_to_device(const Tensor& host_src, Tensor& dst) {
  HONE_CHECK(host_src.device == Device::CPU && dst.device == Device::CUDA,
             "transfer_to_device: from the host's memory to the device's only");
  return transfer(to_device_stream_, host_src, dst);
}

cudaEvent_t CudaBackend::transfer_event(Transfer t) const {
  HONE_CHECK(t.id < transfers_ && t.id >= transfers_ - kTransferTickets,
             "transfer ticket {} is stale: {} transfers were queued after it", t.id, transfers_ - 1 - t.id);
  return transfer_events_[t.id % kTransferTickets];
}

void CudaBackend::wait_transfer(Transfer t) {
  if (t.id >= 0) HONE_CUDA_CHECK(cudaEventSynchronize(transfer_event(t)));
}

void CudaBackend::compute_waits_for(Transfer t) {
  if (t.id >= 0) HONE_CUDA_CHECK(cudaStreamWaitEvent(stream_, transfer_event(t), 0));
}

// ThreadLocal: the loader's threads may use CUDA while the training thread records.
void CudaBackend::start_segment() {
  HONE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

void CudaBackend::finish_segment() {
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("recording the training step as a CUDA graph failed: {} ({}); --cuda_graphs false runs every step "
         "without graphs",
         cudaGetErrorString(e), cudaGetErrorName(e));
  }
  size_t nodes = 0;
  cudaError_t status = cudaGraphGetNodes(graph, nullptr, &nodes);
  next_segment_.exec = nullptr;
  if (status == cudaSuccess && nodes > 0) status = cudaGraphInstantiate(&next_segment_.exec, graph, 0);
  if (status == cudaSuccess) building_.segments.push_back(next_segment_);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail("instantiating a recorded CUDA graph of {} nodes failed: {} ({})", nodes, cudaGetErrorString(status),
         cudaGetErrorName(status));
  }
}

void CudaBackend::begin_recording() {
  HONE_CHECK(!recording_ && !dry_run, "begin_recording while recording or in a dry run");
  building_ = {};
  next_segment_ = {};
  start_segment();
  recording_ = true;
}

int CudaBackend::end_recording() {
  HONE_CHECK(recording_, "end_recording without begin_recording");
  try {
    finish_segment();
  } catch (...) {
    abort_recording();
    throw;
  }
  recording_ = false;
  recordings_.push_back(std::move(building_));
  building_ = {};
  return int(recordings_.size()) - 1;
}

void CudaBackend::destroy(Recording& r) noexcept {
  for (const Segment& g : r.segments)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  r = {};
}

void CudaBackend::free_recording(int recording) noexcept {
  if (recording >= 0 && recording < int(recordings_.size())) destroy(recordings_[size_t(recording)]);
}

void CudaBackend::abort_recording() noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (stream_ && cudaStreamIsCapturing(stream_, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
  destroy(building_);
  recording_ = false;
}

void CudaBackend::replay(int recording) {
  HONE_CHECK(!recording_ && recording >= 0 && recording < int(recordings_.size()) &&
                 !recordings_[size_t(recording)].segments.empty(),
             "replay of recording {}: there is no such recording", recording);
  const Recording& r = recordings_[size_t(recording)];
  for (const Segment& g : r.segments) {
    if (g.marks) mark(g.span);
    if (g.exec) HONE_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  }
  // Only recordings that read to the host: a read_back_ after every replay would make
  // wait_for_reads() wait for the micro-step just queued.
  if (r.reads_host) HONE_CUDA_CHECK(cudaEventRecord(read_back_, stream_));
}

void CudaBackend::wait_for_reads() { HONE_CUDA_CHECK(cudaEventSynchronize(read_back_)); }

void CudaBackend::read(const Tensor& src, float* host, size_t n) {
  HONE_CHECK(!recording_, "a synchronous read while recording a CUDA graph");
  if (src.dtype == DType::F32) {
    HONE_CUDA_CHECK(cudaMemcpyAsync(host, src.data, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  // Halves are converted on the host: reads are rare and small (losses, metrics, tests).
  if (src.dtype != DType::BF16 && src.dtype != DType::F16)
    fail("read on CUDA: dtype {} is not F32, BF16 or F16", dtype_name(src.dtype));
  std::vector<uint16_t> raw(n);
  HONE_CUDA_CHECK(cudaMemcpyAsync(raw.data(), src.data, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_));
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::transform(raw.begin(), raw.end(), host, src.dtype == DType::BF16 ? bf16_to_float : f16_to_float);
}

}  // namespace hone
