#pragma once
// Whether hone's kernels are in this binary as machine code for a GPU. Meaningful when the
// process runs with CUDA_DISABLE_PTX_JIT=1 set before CUDA starts (as `hone env` does): the
// driver then loads only machine code, so a kernel that would be compiled from PTX on first
// use fails to load instead.
#include <string>

namespace hone::cuda {

struct KernelImage {
  bool machine_code = false;
  int binary_version = 0;  // the SASS architecture loaded, e.g. 90 for sm_90
  std::string detail;      // why not, when not
};

KernelImage kernel_image(int device);

}  // namespace hone::cuda
