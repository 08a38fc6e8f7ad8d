#include "cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "cuda/check.h"
#include "cuda/sdpa.h"

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

CudaBackend::CudaBackend(const CudaOptions& options) : device_(options.device), tf32_(options.tf32) {
  HONE_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  HONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  if (prop.major < 8)
    fail("GPU {} ({}) has compute capability {}.{}; hone needs 8.0 (Ampere) or newer", device_, prop.name,
         prop.major, prop.minor);
  name_ = fmt::format("cuda:{} ({})", device_, prop.name);
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HONE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  HONE_CUDA_CHECK(cudaMalloc(&gemm_workspace_, kGemmWorkspaceBytes));
  const size_t reduce_bytes = kReduceSlots * sizeof(double) + sizeof(unsigned);
  HONE_CUDA_CHECK(cudaMalloc(&reduce_scratch_, reduce_bytes));
  HONE_CUDA_CHECK(cudaMemset(reduce_scratch_, 0, reduce_bytes));
  for (auto [ptr, one] : {std::pair{&ones_bf16_, float_to_bf16(1.0f)}, std::pair{&ones_f16_, float_to_f16(1.0f)}}) {
    const std::vector<uint16_t> host(size_t(kOnesLength), one);
    HONE_CUDA_CHECK(cudaMalloc(ptr, host.size() * sizeof(uint16_t)));
    HONE_CUDA_CHECK(cudaMemcpy(*ptr, host.data(), host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
  HONE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  HONE_CUDA_CHECK(cudaEventCreateWithFlags(&read_back_, cudaEventDisableTiming));
  for (cudaEvent_t& e : mark_events_) HONE_CUDA_CHECK(cudaEventCreate(&e));
}

CudaBackend::~CudaBackend() {
  // Destructors must not throw: errors here are ignored (the process is ending the run).
  if (stream_) cudaStreamSynchronize(stream_);
  cuda::destroy_sdpa_cache(sdpa_);
  if (copied_) cudaEventDestroy(copied_);
  if (read_back_) cudaEventDestroy(read_back_);
  for (cudaEvent_t e : mark_events_)
    if (e) cudaEventDestroy(e);
  if (gemm_workspace_) cudaFree(gemm_workspace_);
  if (ones_bf16_) cudaFree(ones_bf16_);
  if (ones_f16_) cudaFree(ones_f16_);
  if (reduce_scratch_) cudaFree(reduce_scratch_);
  if (lt_) cublasLtDestroy(lt_);
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

void* CudaBackend::allocate_host(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("cudaMallocHost of {:.1f} MiB of pinned host memory failed: {}", double(bytes) / (1 << 20),
         cudaGetErrorString(e));
  }
  return p;
}

void CudaBackend::deallocate_host(void* p) noexcept { cudaFreeHost(p); }

void CudaBackend::mark(StepSpan s) {
  if (dry_run) return;
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

SpanSeconds CudaBackend::take_span_seconds() {
  if (marks_recorded_ > 0) {
    mark(mark_spans_[(marks_recorded_ - 1) % kMarkRing]);  // closes the running span, which goes on
    read_marks(marks_recorded_ - 1);
  }
  SpanSeconds out = span_seconds_;
  span_seconds_ = {};
  return out;
}

void CudaBackend::wait_for_copies() { HONE_CUDA_CHECK(cudaEventSynchronize(copied_)); }

void CudaBackend::synchronize() { HONE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  HONE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, stream_));
  if (src.device == Device::CPU) HONE_CUDA_CHECK(cudaEventRecord(copied_, stream_));
  if (dst.device == Device::CPU) HONE_CUDA_CHECK(cudaEventRecord(read_back_, stream_));
}

void CudaBackend::wait_for_reads() { HONE_CUDA_CHECK(cudaEventSynchronize(read_back_)); }

void CudaBackend::read(const Tensor& src, float* host, size_t n) {
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
