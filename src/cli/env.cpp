#include "cli/env.h"

#include <fmt/format.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "hone/cpu_backend.h"
#include "hone/distributed.h"
#include "hone/gpu_info.h"

// HONE_VERSION, HONE_BUILD_TYPE and HONE_CUDA_ARCHITECTURES come from CMake.
#if defined(__clang__)
#define HONE_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define HONE_COMPILER "GCC " __VERSION__
#else
#define HONE_COMPILER "unknown compiler"
#endif

namespace hone::cli {

int env_command() {
  // Machine code only, before CUDA starts: a kernel the driver would have to compile from
  // PTX then fails to load, which is how the report tells (src/cuda/kernel_image.h).
  setenv("CUDA_DISABLE_PTX_JIT", "1", 1);
  fmt::print("hone {} ({} build, {}, C++{})\n", HONE_VERSION, HONE_BUILD_TYPE, HONE_COMPILER, __cplusplus / 100 % 100);
#if defined(HONE_HAVE_CUDA)
  fmt::print("CUDA backend: built, for architectures {}\n", HONE_CUDA_ARCHITECTURES);
#else
  fmt::print("CUDA backend: not built (CPU-only build)\n");
#endif
  // The CPU backend's thread count: OMP_NUM_THREADS or --threads, else every processor.
  const char* env_threads = std::getenv("OMP_NUM_THREADS");
  fmt::print("CPU: {} OpenMP threads of {} processors{}\n", omp_get_max_threads(), omp_get_num_procs(),
             env_threads ? fmt::format(" (OMP_NUM_THREADS={})", env_threads) : std::string());
  select_blas_kernels();
  fmt::print("CPU products: OpenBLAS, {} kernels\n", blas_kernels());
  std::string no_bf16;
  const bool bf16 = cpu_bf16_products_available(&no_bf16);
  fmt::print("CPU bf16 products (--bf16 --device cpu): {}; AMX-BF16 {}\n", bf16 ? "oneDNN" : no_bf16,
             cpu_has_amx() ? "present (faster than fp32)" : "absent (may be slower than fp32)");
  fmt::print("{}", gpu_environment_report());
  const ProcessGroup g = process_group_from_env();
  fmt::print("several processes: NCCL {}, MPI {}; this process is rank {} of {} (launcher: {})\n",
             have_nccl() ? "built" : "not built", have_mpi() ? "built" : "not built", g.rank, g.world_size,
             g.launcher);
  return 0;
}

}  // namespace hone::cli
