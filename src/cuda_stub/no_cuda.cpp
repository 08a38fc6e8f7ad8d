// Built instead of src/cuda/ when CMake found no CUDA compiler.
#include "hone/cuda.h"
#include "hone/error.h"
#include "hone/gpu_info.h"

namespace hone {

bool cuda_available(std::string* why) {
  if (why) *why = "this build of hone has no CUDA backend (CMake found no CUDA compiler)";
  return false;
}

bool mixed_precision_available(std::string* why) { return cuda_available(why); }

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions&) {
  std::string why;
  cuda_available(&why);
  fail("{}", why);
}

void prepare_cuda(int, DType, bool, PreparedWork) {}

std::optional<GpuMemory> gpu_memory(int) { return std::nullopt; }

std::string gpu_environment_report() {
  std::string why;
  cuda_available(&why);
  return "GPU: none usable: " + why + "\n";
}

}  // namespace hone
