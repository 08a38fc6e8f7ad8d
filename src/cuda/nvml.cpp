// GPU memory and environment through NVML, loaded at run time: hone does not link the
// driver's management library, so it still starts where libnvidia-ml is missing
// (containers without the driver's utilities, CPU-only CI) and falls back to the CUDA
// runtime there.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <vector>

#include "cuda/flash_hopper.h"
#include "cuda/kernel_image.h"
#include "hone/cuda.h"
#include "hone/gpu_info.h"

namespace hone {
namespace {

// The part of nvml.h used here; the header is not installed everywhere the toolkit is.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlProcessInfo_t {  // the layout nvmlDeviceGetComputeRunningProcesses_v3 fills
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;  // per-process memory hidden (MIG, containers)
constexpr unsigned kNvmlNameBytes = 96, kNvmlDriverVersionBytes = 80;

// The library, initialized once per process and never shut down (its handles stay valid
// for the process's life). Every call's status is checked by the callers.
class Nvml {
 public:
  static const Nvml& get() {
    static const Nvml nvml;
    return nvml;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  std::string describe(const char* call, nvmlReturn_t r) const {
    const char* s = error_string_ ? error_string_(r) : nullptr;
    return fmt::format("{} failed: {} (NVML error {})", call, s ? s : "unknown error", r);
  }

  // The NVML handle of a CUDA device: the two number devices differently (CUDA orders by
  // speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and honours CUDA_VISIBLE_DEVICES), so the
  // PCI bus id is the only reliable link.
  nvmlDevice_t device(int cuda_device, std::string* why) const {
    char bus[32] = {};
    if (cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device); e != cudaSuccess) {
      cudaGetLastError();  // not sticky, but it would be reported by the next launch check
      *why = fmt::format("cudaDeviceGetPCIBusId failed: {}", cudaGetErrorString(e));
      return nullptr;
    }
    nvmlDevice_t d = nullptr;
    if (nvmlReturn_t r = handle_by_pci_(bus, &d); r != kNvmlSuccess) {
      *why = describe("nvmlDeviceGetHandleByPciBusId_v2", r);
      return nullptr;
    }
    return d;
  }

  bool memory(nvmlDevice_t d, nvmlMemory_t* m, std::string* why) const {
    nvmlReturn_t r = memory_info_(d, m);
    if (r != kNvmlSuccess) *why = describe("nvmlDeviceGetMemoryInfo", r);
    return r == kNvmlSuccess;
  }

  // Bytes used on `d` by process `pid`; nullopt when NVML cannot tell, for example in a
  // container whose PID namespace hides the host's process ids.
  std::optional<uint64_t> process_memory(nvmlDevice_t d, unsigned pid) const {
    std::vector<nvmlProcessInfo_t> procs(16);
    unsigned n = 0;
    // Processes may start between the calls that size the list; a few tries suffice.
    for (int attempt = 0;; ++attempt) {
      n = unsigned(procs.size());
      nvmlReturn_t r = compute_processes_(d, &n, procs.data());
      if (r == kNvmlSuccess) break;
      if (r != kNvmlInsufficientSize || attempt == 4) return std::nullopt;
      procs.resize(n + 16);
    }
    std::optional<uint64_t> used;
    for (unsigned i = 0; i < n; ++i) {
      if (procs[i].pid != pid) continue;
      if (procs[i].usedGpuMemory == kNvmlValueNotAvailable) return std::nullopt;
      used = used.value_or(0) + procs[i].usedGpuMemory;  // one entry per MIG instance
    }
    return used;
  }

  std::string name(nvmlDevice_t d) const {
    char buf[kNvmlNameBytes] = {};
    return get_name_(d, buf, sizeof buf) == kNvmlSuccess ? std::string(buf) : std::string();
  }

  std::string driver_version(std::string* why) const {
    char buf[kNvmlDriverVersionBytes] = {};
    if (nvmlReturn_t r = driver_version_(buf, sizeof buf); r != kNvmlSuccess) {
      *why = describe("nvmlSystemGetDriverVersion", r);
      return {};
    }
    return buf;
  }

 private:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      const char* e = dlerror();  // names the file and the cause
      error_ = e ? e : "cannot load libnvidia-ml.so.1";
      return;
    }
    if (!load(error_string_, "nvmlErrorString") || !load(init_, "nvmlInit_v2") ||
        !load(handle_by_pci_, "nvmlDeviceGetHandleByPciBusId_v2") || !load(memory_info_, "nvmlDeviceGetMemoryInfo") ||
        !load(compute_processes_, "nvmlDeviceGetComputeRunningProcesses_v3") ||
        !load(driver_version_, "nvmlSystemGetDriverVersion") || !load(get_name_, "nvmlDeviceGetName"))
      return;
    if (nvmlReturn_t r = init_(); r != kNvmlSuccess) error_ = describe("nvmlInit_v2", r);
  }

  template <typename F>
  bool load(F& f, const char* symbol) {
    f = reinterpret_cast<F>(dlsym(lib_, symbol));
    if (!f) error_ = fmt::format("libnvidia-ml.so.1 has no {} (driver too old?)", symbol);
    return f != nullptr;
  }

  void* lib_ = nullptr;
  std::string error_;
  const char* (*error_string_)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*init_)() = nullptr;
  nvmlReturn_t (*handle_by_pci_)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory_info_)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*compute_processes_)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*driver_version_)(char*, unsigned) = nullptr;
  nvmlReturn_t (*get_name_)(nvmlDevice_t, char*, unsigned) = nullptr;
};

std::optional<GpuMemory> nvml_memory(int cuda_device, std::string* why) {
  const Nvml& nvml = Nvml::get();
  if (!nvml.ok()) {
    *why = nvml.error();
    return std::nullopt;
  }
  nvmlDevice_t d = nvml.device(cuda_device, why);
  nvmlMemory_t m{};
  if (!d || !nvml.memory(d, &m, why)) return std::nullopt;
  GpuMemory g{.used = m.used, .total = m.total, .free = m.free, .source = "NVML"};
  if (std::optional<uint64_t> mine = nvml.process_memory(d, unsigned(getpid()))) {
    g.process_used = *mine;
    g.process_known = true;
  }
  return g;
}

// The CUDA runtime sees only the device-wide numbers, and needs a context for them
// (creating one if this process has none yet).
std::optional<GpuMemory> runtime_memory(int cuda_device, const std::string& nvml_why) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(cuda_device) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  size_t free_b = 0, total_b = 0;
  const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  cudaSetDevice(previous);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return GpuMemory{.used = total_b - free_b,
                   .total = total_b,
                   .free = free_b,
                   .source = fmt::format("cudaMemGetInfo (NVML unavailable: {})", nvml_why)};
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// 12080 -> "12.8"
std::string cuda_version(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }

std::string mib(uint64_t bytes) { return fmt::format("{} MiB", bytes >> 20); }

std::string versions_line() {
  int runtime = 0, driver = 0;
  const bool have_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;  // 0: no driver
  cudaGetLastError();
  std::string line = fmt::format("CUDA runtime {} (hone built with {}), driver API {}",
                                 have_runtime ? cuda_version(runtime) : "unknown", cuda_version(CUDART_VERSION),
                                 have_driver ? cuda_version(driver) : "none (no NVIDIA driver)");
  const Nvml& nvml = Nvml::get();
  std::string why = nvml.error();
  const std::string version = nvml.ok() ? nvml.driver_version(&why) : std::string();
  line += version.empty() ? fmt::format(", NVIDIA driver version unknown (NVML unavailable: {})", why)
                          : fmt::format(", NVIDIA driver {}", version);
  return line + "\n";
}

std::string device_report(int dev) {
  cudaDeviceProp prop{};
  char bus[32] = {};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess || cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    return fmt::format("GPU {}: cannot be queried: {}\n", dev, cudaGetErrorString(e));
  }
  std::string name = prop.name, ignored;
  if (const Nvml& nvml = Nvml::get(); nvml.ok())
    if (nvmlDevice_t d = nvml.device(dev, &ignored))
      if (std::string n = nvml.name(d); !n.empty()) name = n;
  std::string out = fmt::format("GPU {}: {}, compute capability {}.{}, PCI {}\n", dev, name, prop.major, prop.minor, bus);

  if (std::optional<GpuMemory> m = gpu_memory(dev))
    out += fmt::format("  memory: {} total, {} used, {} free ({})\n", mib(m->total), mib(m->used), mib(m->free),
                       m->source);
  else
    out += "  memory: unknown (neither NVML nor cudaMemGetInfo answered)\n";

  // A feature needs its hardware and a GPU the CUDA backend accepts (Ampere or newer).
  const int cc = prop.major * 10 + prop.minor;
  const bool usable = cc >= 80;
  if (!usable)
    out += fmt::format("  not usable by hone: compute capability {}.{} is below 8.0 (Ampere)\n", prop.major,
                       prop.minor);
  auto feature = [&](const char* what, bool hardware) {
    return fmt::format("{} {}", what, usable && hardware ? "yes" : "no");
  };
  out += fmt::format("  hone features: {}, {}, {}, {}, {} (hone's kernels, head sizes 16, 32, 64 and 128)\n",
                     feature("fp32", true), feature("tf32", true), feature("bf16", true), feature("fp16", true),
                     feature("fused attention", true));
  if (!usable) return out;
  const cuda::KernelImage k = cuda::kernel_image(dev);
  if (k.machine_code)
    out += fmt::format("  hone's kernels: machine code for sm_{} in this binary, nothing compiled at run time; "
                       "cuBLASLt ships its own; cuDNN's attention (HONE_ATTENTION=cudnn only) compiles on first use\n",
                       k.binary_version);
  else
    out += fmt::format("  hone's kernels: no machine code for compute capability {}.{} in this binary ({}): the "
                       "driver would compile them from PTX on the first run, if the binary has PTX it can use; "
                       "rebuild with -DCMAKE_CUDA_ARCHITECTURES=$(tools/cuda-arch.sh)\n",
                       prop.major, prop.minor, k.detail);
  if (cc == 90) {
    int previous = 0;
    bool hopper = false;
    if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(dev) == cudaSuccess) {
      hopper = cuda::flash::hopper_kernels_present();
      cudaSetDevice(previous);
    }
    out += hopper ? "  attention: Hopper's wgmma/TMA kernels for head sizes 32, 64 and 128 (sm_90a machine code), the "
                    "mma.sync ones for 16\n"
                  : "  attention: the mma.sync kernels only: this binary has no sm_90a image for Hopper's wgmma/TMA "
                    "kernels (build with -DCMAKE_CUDA_ARCHITECTURES=90a)\n";
  }
  return out;
}

}  // namespace

std::optional<GpuMemory> gpu_memory(int cuda_device) {
  if (cuda_device < 0 || cuda_device >= device_count()) return std::nullopt;
  std::string why;
  if (std::optional<GpuMemory> m = nvml_memory(cuda_device, &why)) return m;
  return runtime_memory(cuda_device, why);
}

std::string gpu_environment_report() {
  std::string out = versions_line();
  std::string why;
  if (!cuda_available(&why)) return out + fmt::format("GPU: none usable: {}\n", why);
  for (int dev = 0, n = device_count(); dev < n; ++dev) out += device_report(dev);
  return out;
}

}  // namespace hone
