#pragma once
// What the GPU reports about itself: memory as nvidia-smi (NVML) counts it, and the
// environment summary of `hone env`. Both work, saying why not, in CPU-only builds.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hone {

// In bytes. used/total/free are device-wide, as Hugging Face's print_gpu_utilization
// prints them (NVML's v1 memory query: `used` includes the driver's reservation, about
// 0.5 GiB on an H100, which nvidia-smi leaves out); process_used is this process's
// share when NVML can tell it.
struct GpuMemory {
  uint64_t used = 0, total = 0, free = 0;
  uint64_t process_used = 0;
  bool process_known = false;
  std::string source;  // "NVML", or "cudaMemGetInfo (NVML unavailable: <reason>)"
};

// Memory of CUDA device `cuda_device` (the runtime's numbering); nullopt when no GPU is
// usable or the index is out of range.
std::optional<GpuMemory> gpu_memory(int cuda_device);

// For `hone env`: every GPU with its versions, memory and the hone features it supports,
// or the reason no GPU is usable.
std::string gpu_environment_report();

// Dense peak matrix throughput of a GPU, in FLOP/s, for "fp32" (no tensor cores), "tf32",
// "bf16" or "fp16", from NVIDIA's datasheets (SXM parts at boost clock); nullopt for a GPU
// that is not in the table. `gpu_name` is the CUDA device name, e.g. "NVIDIA H100 80GB HBM3".
std::optional<double> peak_flops(std::string_view gpu_name, std::string_view precision);

}  // namespace hone
