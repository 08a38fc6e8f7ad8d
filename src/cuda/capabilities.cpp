// What this build and machine can run, for callers that must decide before planning.
#include "hone/cuda.h"

namespace hone {

bool mixed_precision_available(std::string* why) {
  if (!cuda_available(why)) return false;
#ifdef HONE_HAVE_CUDNN
  return true;
#else
  if (why)
    *why = "this build of hone has no cuDNN, whose fused attention --bf16 and --fp16 use "
           "(install libcudnn9-dev-cuda-13 and rebuild)";
  return false;
#endif
}

}  // namespace hone
