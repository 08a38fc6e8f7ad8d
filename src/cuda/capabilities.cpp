// What this build and machine can run, for callers that must decide before planning.
#include "hone/cuda.h"

#include "cuda/sdpa.h"

namespace hone {

// hone's own attention kernels run BF16/F16 on any supported GPU; only HONE_ATTENTION=cudnn
// needs a build with cuDNN.
bool mixed_precision_available(std::string* why) {
  if (!cuda_available(why)) return false;
#ifndef HONE_HAVE_CUDNN
  if (cuda::cudnn_attention_selected()) {
    if (why)
      *why = "HONE_ATTENTION=cudnn asks for cuDNN's fused attention, and this build of hone has no cuDNN "
             "(install libcudnn9-dev-cuda-13 and rebuild, or unset HONE_ATTENTION)";
    return false;
  }
#endif
  return true;
}

}  // namespace hone
