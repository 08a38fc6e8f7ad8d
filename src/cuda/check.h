#pragma once
// Every CUDA runtime and cuBLAS call goes through these: a failure throws hone::Error
// naming the call, the file and line, and the library's own description.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "hone/error.h"

#define HONE_CUDA_CHECK(call)                                                                        \
  do {                                                                                               \
    cudaError_t hone_err_ = (call);                                                                  \
    if (hone_err_ != cudaSuccess)                                                                    \
      ::hone::fail("{} failed at {}:{}: {} ({})", #call, __FILE__, __LINE__,                         \
                   cudaGetErrorString(hone_err_), cudaGetErrorName(hone_err_));                      \
  } while (0)

#define HONE_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                               \
    cublasStatus_t hone_st_ = (call);                                                                \
    if (hone_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::hone::fail("{} failed at {}:{}: {}", #call, __FILE__, __LINE__, cublasLtGetStatusString(hone_st_)); \
  } while (0)

// After a kernel launch: launch errors are reported at once, execution errors by the
// next synchronizing call.
#define HONE_CUDA_LAUNCH_CHECK() HONE_CUDA_CHECK(cudaGetLastError())
