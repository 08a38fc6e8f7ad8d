#pragma once
// The cuBLASLt handle that hone::prepare_cuda (hone/cuda.h) readied on another thread.
#include <cublasLt.h>

namespace hone::cuda {

// The handle prepared for `device`, now the caller's to destroy; nullptr when none was.
cublasLtHandle_t take_prepared_lt(int device);

}  // namespace hone::cuda
