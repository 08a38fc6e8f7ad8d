#pragma once
// Hopper's (sm_90a) asynchronous building blocks, as the flash_hopper_*.cu kernels use them:
// mbarriers, TMA tile loads into 128-byte-swizzled shared memory, and warpgroup MMA
// (wgmma) with its shared memory descriptors. The instructions exist only in the sm_90a
// image (HONE_HOPPER_IMAGE); kernels built on them compile to an empty body elsewhere and
// the host picks them only on a 9.0 GPU.
//
// Tiles of 64 half-precision columns (128 bytes a row) use the 128-byte swizzle: the 16-byte
// chunk c of row r sits at chunk c ^ (r % 8), so that eight rows' chunk c fall in eight
// different banks. Such a tile is an "atom" column for wgmma; tiles start 1024-byte aligned.
// Tiles of 32 columns (64-byte rows) use the 64-byte swizzle: chunk c of row r at
// c ^ (r / 2 % 4). HeadTile lays a head's [rows][D] out in such panels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/flash_kernels.h"

// Kernel bodies are compiled only into the sm_90a image; other images get an empty body, so
// helpers that only those bodies call are marked [[maybe_unused]] (nvcc's warning 177 there).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HONE_HOPPER_IMAGE 1
#endif

namespace hone::cuda::hopper {

using flash::smem_address;

// Byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// ---------------------------------------------------------------- mbarriers

__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}
// Makes initialised barriers visible to the async proxy (TMA) before any thread uses them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Hands registers between warpgroups (every warp of a warpgroup executes it): a producer
// that only issues TMA gives most back, the MMA warpgroups take them.
// setmaxnreg moves registers only within what the CTA got at launch: under
// __launch_bounds__(threads, 1) ptxas gives each thread 64 Ki / threads in steps of 8 (168 at
// 384 threads, not 170). So one producer warpgroup and the consumers must fit in threads x
// that, not in 64 Ki: an increase past it waits forever.
constexpr bool fits_launch_registers(int threads, int producer, int consumer) {
  return 128 * producer + (threads - 128) * consumer <= threads * (65536 / threads / 8 * 8);
}
template <int Registers>
__device__ __forceinline__ void registers_decrease() {
#ifdef HONE_HOPPER_IMAGE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
}
template <int Registers>
__device__ __forceinline__ void registers_increase() {
#ifdef HONE_HOPPER_IMAGE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
}

// ---------------------------------------------------------------- TMA

// Box (c0 = column, c1 = row) of a 2-D tensor map into shared memory; completes on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar))
      : "memory");
}

// A warp-specialised kernel launched with other than its roles' threads would hang (its
// consumers waiting for a producer warp that does not exist): it traps instead, so that the
// launch fails with an error.
__device__ __forceinline__ void expect_threads(int threads) {
  if (blockDim.x != unsigned(threads)) __trap();
}

// Orders this thread's generic-proxy shared memory accesses before later async-proxy ones
// (wgmma, TMA): writes (st.shared) that a wgmma reads, reads (ldmatrix) before a TMA rewrites.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A barrier among `threads` threads (a warpgroup) on hardware barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting: what this thread wrote to shared memory
// before is visible to the threads that wait there (named_barrier) once it completes.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Adds two floats to global memory, one vector reduction.
__device__ __forceinline__ void red_add_f32x2(float* p, float a, float b) {
#ifdef HONE_HOPPER_IMAGE
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#endif
}
// Adds four floats to global memory (16-byte aligned), one vector reduction. No memory
// clobber: the memory it adds to is not read by the kernels that reduce into it, and loads
// after it (the next values to add) may be issued before it.
__device__ __forceinline__ void red_add_f32x4(float* p, float a, float b, float c, float d) {
#ifdef HONE_HOPPER_IMAGE
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d));
#endif
}

// ---------------------------------------------------------------- wgmma

// Descriptor of a swizzled operand in shared memory (rows of SwizzleBytes, 128 or 64) whose
// 8-row groups lie 8 rows apart. The same form serves a K-major operand (rows are M or N,
// the columns K; step K by 16 with +32 bytes) and an MN-major one (rows are K, the columns
// M or N; step K by 16 with +16 rows); the leading byte offset is unused when M or N is one
// atom (a row's columns) wide.
template <int SwizzleBytes = 128>
__device__ __forceinline__ uint64_t smem_descriptor(const void* p) {
  static_assert(SwizzleBytes == 128 || SwizzleBytes == 64);
  uint64_t d = (smem_address(p) & 0x3FFFF) >> 4;
  d |= uint64_t(1) << 16;                           // leading byte offset (unused), 16 bytes
  d |= uint64_t(8 * SwizzleBytes >> 4) << 32;       // stride byte offset
  d |= uint64_t(SwizzleBytes == 128 ? 1 : 2) << 62;  // 128- or 64-byte swizzle
  return d;
}

// One head's [Rows][D] half tile in shared memory (Q, K, V or dO rows): panels of
// min(D, 64) columns, each a TMA box of its own and swizzled over its row (128 bytes for
// 64 columns, 64 for 32), panel p at p Rows kRowBytes.
template <int D, int Rows>
struct HeadTile {
  static_assert(D == 32 || D == 64 || D == 128, "Hopper attention tiles hold head sizes 32, 64 and 128");
  static constexpr int kCols = D < 64 ? D : 64;  // columns of a panel
  static constexpr int kPanels = D / kCols;
  static constexpr int kRowBytes = kCols * 2;    // the swizzle span
  static constexpr int kPanelBytes = Rows * kRowBytes;
  static constexpr int kBytes = kPanels * kPanelBytes;

  // Byte offset of 16-byte chunk c (of D / 8) of row r.
  __device__ static uint32_t chunk(int r, int c) {
    constexpr int kChunks = kCols / 8;
    const int cc = c % kChunks, sw = kRowBytes == 128 ? cc ^ (r & 7) : cc ^ ((r >> 1) & 3);
    return (c / kChunks) * kPanelBytes + r * kRowBytes + (sw << 4);
  }
  // K-major operand of rows row0 .. (M or N), K = columns 16 kk .. 16 kk + 15.
  __device__ static uint64_t k_major(const unsigned char* tile, int row0, int kk) {
    const int col = kk * 16;
    return smem_descriptor<kRowBytes>(tile + (col / kCols) * kPanelBytes + row0 * kRowBytes + (col % kCols) * 2);
  }
  // MN-major operand: K = rows k0 .. k0 + 15, M or N = panel p's kCols columns.
  __device__ static uint64_t mn_major(const unsigned char* tile, int p, int k0) {
    return smem_descriptor<kRowBytes>(tile + p * kPanelBytes + k0 * kRowBytes);
  }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across an asynchronous wgmma.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Keeps A fragments in their registers until here (after the wait of the wgmma reading
// them): the wgmma reads them asynchronously, after the instruction that names them.
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

#define HONE_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                     "+f"(d[i + 6]), "+f"(d[i + 7])
#define HONE_ACC32 HONE_ACC8(0), HONE_ACC8(8), HONE_ACC8(16), HONE_ACC8(24)
#define HONE_REGS32                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define HONE_REGS64                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
// One asm statement per shape; TY is the PTX name of T ("bf16" or "f16").
#define HONE_ACC16 HONE_ACC8(0), HONE_ACC8(8)
#define HONE_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
#define HONE_WGMMA_N32_RS(TY)                                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " HONE_REGS16                    \
               "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"                                             \
               : HONE_ACC16                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)), "n"(int(TransB)))
#define HONE_WGMMA_N32_SS(TY)                                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " HONE_REGS16                    \
               "%16, %17, p, 1, 1, %19, %20;\n}\n"                                                         \
               : HONE_ACC16                                                                                \
               : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(TransA)), "n"(int(TransB)))
#define HONE_WGMMA_N64_RS(TY)                                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " HONE_REGS32                    \
               "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                             \
               : HONE_ACC32                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)), "n"(int(TransB)))
#define HONE_WGMMA_N64_SS(TY)                                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " HONE_REGS32                    \
               "%32, %33, p, 1, 1, %35, %36;\n}\n"                                                         \
               : HONE_ACC32                                                                                \
               : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(TransA)), "n"(int(TransB)))
#define HONE_WGMMA_N128_RS(TY)                                                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " HONE_REGS64                   \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                               \
               : HONE_ACC32, HONE_ACC8(32), HONE_ACC8(40), HONE_ACC8(48), HONE_ACC8(56)                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
#define HONE_WGMMA_N128_SS(TY)                                                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " HONE_REGS64                   \
               "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                            \
               : HONE_ACC32, HONE_ACC8(32), HONE_ACC8(40), HONE_ACC8(48), HONE_ACC8(56)                    \
               : "l"(a), "l"(b), "r"(int(accumulate)))

// Expands one of the macros above with T's PTX type name (bf16 or f16): the asm string
// must be a literal, so the type is chosen by T rather than passed as a value.
#define HONE_WGMMA_TYPED(WGMMA)                  \
  do {                                           \
    if constexpr (std::is_same_v<T, __nv_bfloat16>) \
      WGMMA("bf16");                             \
    else                                         \
      WGMMA("f16");                              \
  } while (0)

// d (64 x 32, F32) (+)= a (64 x 16, registers, A fragments) * b (16 x 32, shared memory).
template <typename T, bool TransB>
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b,
                                                   bool accumulate) {
#ifdef HONE_HOPPER_IMAGE
  HONE_WGMMA_TYPED(HONE_WGMMA_N32_RS);
#endif
}

// d (64 x 32, F32) (+)= a (64 x 16) * b (16 x 32), both from shared memory.
template <typename T, bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
#ifdef HONE_HOPPER_IMAGE
  HONE_WGMMA_TYPED(HONE_WGMMA_N32_SS);
#endif
}

// d (64 x 64, F32) (+)= a (64 x 16, registers, A fragments) * b (16 x 64, shared memory).
// TransB: b is MN-major (its rows are K). accumulate = false overwrites d.
template <typename T, bool TransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                   bool accumulate) {
#ifdef HONE_HOPPER_IMAGE
  HONE_WGMMA_TYPED(HONE_WGMMA_N64_RS);
#endif
}

// d (64 x 64, F32) (+)= a (64 x 16) * b (16 x 64), both from shared memory; TransA: a is
// MN-major (its rows are K).
template <typename T, bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
#ifdef HONE_HOPPER_IMAGE
  HONE_WGMMA_TYPED(HONE_WGMMA_N64_SS);
#endif
}

// d (64 x 128, F32) (+)= a (64 x 16, registers) * b (16 x 128, shared memory, K-major).
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                                    bool accumulate) {
#ifdef HONE_HOPPER_IMAGE
  HONE_WGMMA_TYPED(HONE_WGMMA_N128_RS);
#endif
}

// d (64 x 128, F32) (+)= a (64 x 16) * b (16 x 128), both from shared memory, K-major.
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#ifdef HONE_HOPPER_IMAGE
  HONE_WGMMA_TYPED(HONE_WGMMA_N128_SS);
#endif
}

// One head tile panel's product, N = Cols (32 or 64): d holds Cols / 2 accumulators.
template <typename T, int Cols, bool TransB>
__device__ __forceinline__ void wgmma_panel_rs(float* d, const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (Cols == 32)
    wgmma_m64n32k16_rs<T, TransB>(*reinterpret_cast<float(*)[16]>(d), a, b, accumulate);
  else
    wgmma_m64n64k16_rs<T, TransB>(*reinterpret_cast<float(*)[32]>(d), a, b, accumulate);
}
template <typename T, int Cols, bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_panel_ss(float* d, uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (Cols == 32)
    wgmma_m64n32k16_ss<T, TransA, TransB>(*reinterpret_cast<float(*)[16]>(d), a, b, accumulate);
  else
    wgmma_m64n64k16_ss<T, TransA, TransB>(*reinterpret_cast<float(*)[32]>(d), a, b, accumulate);
}

#undef HONE_WGMMA_TYPED
#undef HONE_WGMMA_N32_RS
#undef HONE_WGMMA_N32_SS
#undef HONE_ACC16
#undef HONE_REGS16
#undef HONE_WGMMA_N128_SS
#undef HONE_WGMMA_N64_RS
#undef HONE_WGMMA_N64_SS
#undef HONE_WGMMA_N128_RS
#undef HONE_REGS32
#undef HONE_REGS64
#undef HONE_ACC32
#undef HONE_ACC8

}  // namespace hone::cuda::hopper
