// Which of OpenBLAS's kernels the CPU backend's products run. Debian's OpenBLAS is built
// for every x86-64 core and picks one at load from the CPU's family and model; a CPU newer
// than its tables (0.3.21 on a Sapphire Rapids-class Xeon, say) gets its Prescott (SSE3)
// fallback, though the CPU has AVX-512: all-MiniLM-L6-v2 fine-tuning on 2 cores ran 2.4x
// slower so. There, before the first product, this selects the kernels the CPU's
// instructions allow, as OPENBLAS_CORETYPE would have at load (a value the user sets is
// left alone).
#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "hone/cpu_backend.h"

namespace hone {

namespace {

// OpenBLAS's fallbacks for x86-64 cores it does not know.
bool generic_kernels(const char* core) {
  for (const char* name : {"Prescott", "Core2", "Nehalem", "Unknown"})
    if (std::strcmp(core, name) == 0) return true;
  return false;
}

// The kernels for this CPU's vector instructions, or null when its fallback is right.
const char* kernels_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

}  // namespace

void select_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_CORETYPE") || !generic_kernels(openblas_get_corename())) return;
    const char* want = kernels_for_this_cpu();
    // A DYNAMIC_ARCH build's own selection, run again with the choice in its variable;
    // another OpenBLAS (or BLAS) lacks these and keeps its kernels.
    auto quit = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
    auto init = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
    if (!want || !quit || !init) return;
    setenv("OPENBLAS_CORETYPE", want, 0);
    quit();
    init();
  });
}

const char* blas_kernels() { return openblas_get_corename(); }

}  // namespace hone
