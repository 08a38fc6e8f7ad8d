// Whether this binary holds machine code (SASS) for a GPU, for `hone env`. Every .cu of hone
// compiles with the same CMAKE_CUDA_ARCHITECTURES, so one kernel answers for all of them.
#include "cuda/kernel_image.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace hone::cuda {
namespace {

__global__ void image_probe_kernel() {}

}  // namespace

KernelImage kernel_image(int device) {
  KernelImage k;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    k.detail = fmt::format("cannot select GPU {}: {}", device, cudaGetErrorString(cudaGetLastError()));
    return k;
  }
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, image_probe_kernel);
  if (e == cudaSuccess) {
    k.machine_code = true;
    k.binary_version = attr.binaryVersion;
  } else {
    k.detail = cudaGetErrorString(e);
    cudaGetLastError();  // the error is this answer's, not the next call's
  }
  cudaSetDevice(previous);
  return k;
}

}  // namespace hone::cuda
