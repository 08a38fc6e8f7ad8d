// The feed-forward block's up-projection with BERT's erf GELU in the epilogue, on Hopper
// (hopper_gemm.h); it writes the product before the GELU too where training keeps it.
// A persistent kernel, one CTA per SM, of a producer warp and two consumer warpgroups. The
// producer streams 64-column slices of x's and w's 128-row tiles through TMA into a ring of
// 128-byte-swizzled stages; each consumer warpgroup takes every other 128 x 128 tile of the
// CTA, issues warpgroup MMAs on its slices (both operands from shared memory, K-major, F32
// accumulators), then adds the bias, stages the pre-activations in shared memory rounded
// to the dtype (as the unfused product writes them, so the GELU's inputs are the training
// forward's), and applies the GELU as it stores whole rows. The consumers' main loops take
// turns, so one's epilogue (16 Ki GELUs, the stores) runs during the other's MMAs. Stored
// straight from the MMA fragments, each warp store wrote 16 bytes in each of 8 rows, and
// the stores took longer than the MMAs. In bf16 the GELU is a table lookup (below).
// Measured on an H100 at bert-large's shape (16384 x 4096 x 1024, bf16): 0.242 ms (568
// TFLOP/s), 0.25 writing pre too, against 0.289 for cuBLASLt's product and the GELU pass,
// the product alone 0.188; with the identity in the GELU's place 0.201. On an H200, with a
// thread's lookups issued together and addressed by byte offsets: 0.214 ms (643 TFLOP/s),
// 0.222 writing pre, the product alone 0.189 (docs/design/fusions.md has what was tried).
#include "cuda/hopper_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda/check.h"
#include "cuda/flash_hopper.h"
#include "cuda/hopper.h"
#include "cuda/kernels.h"

namespace hone::cuda {

namespace {

using namespace hopper;
using flash::pack;
using flash::unpack;

constexpr int kTileM = 128, kTileN = 128, kSliceK = 64;
constexpr int kStages = 4;
constexpr int kConsumers = 2;
constexpr int kProductThreads = 128 * (kConsumers + 1);  // the consumer warpgroups, then the producer's
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;  // a thread, after the split
static_assert(fits_launch_registers(kProductThreads, kProducerRegisters, kConsumerRegisters));
constexpr int kSliceBytes = kTileM * kSliceK * 2;        // one [128][64] half tile, x's or w's
constexpr int kStagedRow = kTileN + 8;  // elements a staged output row takes: a warp's fragment
                                        // writes (8 rows, 4 lanes) fall in distinct banks
// The GELU of a bf16 pre-activation is a function of its 16 bits. The kernel tabulates it
// (computed with gelu() below, so the bits are the same) for magnitudes in [2^-24, 16) of
// either sign, where nearly every input falls: 28 binades of 128 values. A lookup takes
// about 8 instructions where erff takes about 30; the store loop issues them on one warp a
// scheduler beside the other group's main loop, so each one counts (a GELU computed from a
// polynomial and two MUFU operations, 20-odd instructions, ran slower).
constexpr uint32_t kGeluTableLow = 103u << 7;  // the bits of 2^-24
constexpr uint32_t kGeluTableSpan = 28u << 7;  // up to the bits of 2^4
// Entry layout: the positive values' GELUs from entry 0, the negative ones' from entry 4096
// (byte 8192), in 16 KiB: a value's byte offset is then its magnitude's index times two,
// or'ed with its sign moved to bit 13, and any offset the lookups form stays inside.
constexpr uint32_t kGeluNegativeEntry = 4096;
constexpr int kGeluTableEntries = 2 * kGeluNegativeEntry;
static_assert(kGeluTableSpan <= kGeluNegativeEntry);
static_assert(kTileM == kTileN, "x's and w's tiles share one TMA box");
static_assert(kTileN == 128, "each consumer thread reads one column's bias");

struct Smem {
  static constexpr size_t kX = 0;                                   // [kStages][128][64]
  static constexpr size_t kW = kX + size_t(kStages) * kSliceBytes;  // [kStages][128][64]
  static constexpr size_t kStaged = size_t(kTileM) * kStagedRow * 2;
  static constexpr size_t kOut = kW + size_t(kStages) * kSliceBytes;  // [kConsumers][kStaged]
  static constexpr size_t kBias = kOut + kConsumers * kStaged;          // [kConsumers][kTileN] F32
  static constexpr size_t kTable = kBias + size_t(kConsumers) * kTileN * 4;  // [kGeluTableEntries] bf16 bits
  static constexpr size_t kBars = kTable + size_t(kGeluTableEntries) * 2;
  static constexpr size_t kBytes = kBars + 2 * kStages * 8 + 1024;  // + alignment slack
};

// BERT's GELU, as the separate pass computes it (elementwise.cu).
__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }

// The table's entry e: the GELU's bits of the bf16 value it stands for (0 in the gaps past
// each half's span, which no value in the table reads).
[[maybe_unused]] __device__ __forceinline__ uint16_t gelu_table_entry(uint32_t e) {
  const uint32_t index = e % kGeluNegativeEntry;
  if (index >= kGeluTableSpan) return 0;
  const uint32_t u = (e < kGeluNegativeEntry ? 0u : 0x8000u) | (kGeluTableLow + index);
  return uint16_t(pack<__nv_bfloat16>(gelu(__uint_as_float(u << 16)), 0.0f));
}

// The GELU of two pre-activations packed as T, computed.
template <typename T>
__device__ __forceinline__ uint32_t gelu2(uint32_t w) {
  const float2 f = unpack<T>(w);
  return pack<T>(gelu(f.x), gelu(f.y));
}

// Whether both bf16 halves of w lie in the table.
[[maybe_unused]] __device__ __forceinline__ bool in_gelu_table(uint32_t w) {
  return (w & 0x7fffu) - kGeluTableLow < kGeluTableSpan && ((w >> 16) & 0x7fffu) - kGeluTableLow < kGeluTableSpan;
}

// Both bf16 halves of w less the table's lowest magnitude, in one subtraction: each half
// of the result is its value's index in the table wherever in_gelu_table(w) (no borrow
// crosses the halves then).
[[maybe_unused]] __device__ __forceinline__ uint32_t table_indices(uint32_t w) { return w - (kGeluTableLow * 0x10001u); }

// The table's GELUs of both bf16 halves of w, from t = table_indices(w): right where
// in_gelu_table(w), and read from the table either way (the offsets masked into its 16 KiB),
// without a branch, so that a thread's lookups are all in flight at once. (Taken pair by
// pair behind a branch, each pair's loads waited for the pair before.)
[[maybe_unused]] __device__ __forceinline__ uint32_t gelu2_table(uint32_t w, uint32_t t, const unsigned char* table) {
  const uint32_t lo = ((t << 1) & 0x1ffeu) | ((w >> 2) & 0x2000u);
  const uint32_t hi = ((t >> 15) & 0x1ffeu) | ((w >> 18) & 0x2000u);
  return uint32_t(*reinterpret_cast<const uint16_t*>(table + lo)) |
         uint32_t(*reinterpret_cast<const uint16_t*>(table + hi)) << 16;
}

// Nonzero in bit 15 or 31 where a half of w lies outside the table, from t =
// table_indices(w): a half's magnitude index (its low 15 bits; a magnitude under the table
// wraps to 0x4c80 or more) plus 0x8000 - kGeluTableSpan carries into its top bit exactly when
// it is kGeluTableSpan or more. Or'ed over many words, one test covers them all.
[[maybe_unused]] __device__ __forceinline__ uint32_t outside_gelu_table(uint32_t t) {
  return (t & 0x7fff7fffu) + (0x8000u - kGeluTableSpan) * 0x10001u;
}

// The GELUs of kPieces x 8 staged pre-activations, packed as they are, in place: independent
// elements side by side, so that their lookups (or erfs' dependent chains) interleave. bf16
// looks every pair up, then computes the few pairs outside the table (zeros, tiny values,
// |x| >= 16, infinities, NaN).
template <typename T, int kPieces>
__device__ __forceinline__ void gelu_pieces(int4 (&v)[kPieces], const unsigned char* table) {
  uint32_t w[kPieces][4], g[kPieces][4];
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    w[p][0] = uint32_t(v[p].x), w[p][1] = uint32_t(v[p].y), w[p][2] = uint32_t(v[p].z), w[p][3] = uint32_t(v[p].w);
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t outside = 0;
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t t = table_indices(w[p][i]);
        g[p][i] = gelu2_table(w[p][i], t, table);
        outside |= outside_gelu_table(t);
      }
    if (outside & 0x80008000u)
#pragma unroll
      for (int p = 0; p < kPieces; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (!in_gelu_table(w[p][i])) g[p][i] = gelu2<T>(w[p][i]);
  } else {
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) g[p][i] = gelu2<T>(w[p][i]);
  }
#pragma unroll
  for (int p = 0; p < kPieces; ++p) v[p] = make_int4(int(g[p][0]), int(g[p][1]), int(g[p][2]), int(g[p][3]));
}

// Writes the GELU of a staged [128][kStagedRow] tile of pre-activations (its first m - m0
// rows) to out[m0.., n0..], and the pre-activations to pre where it is not null, 16 bytes a
// thread at a time, several pieces in flight; the warpgroup's barrier `bar` brackets the
// staging. Here, after the accumulators are dead, the erfs (fp16, and bf16 outside the
// table) have the registers to run side by side.
template <typename T>
__device__ __forceinline__ void write_staged_gelu(T* out, T* pre, const T* staged, const unsigned char* table, int m0, int n0,
                                                  int m, int n, int bar) {
  named_barrier(bar, 128);  // the fragments are staged
  // bf16: four pieces (32 lookups) in flight, 0.233-0.234 ms against two's 0.237-0.238 (H200,
  // without pre, when each pair's lookups sat behind a branch). Eight, without spills once
  // the accumulators were dead here, ran 0.223 without pre and 0.236 keeping it, against
  // four's 0.217 and 0.225-0.226 (H200, 2026-11-29). fp16's erfs take two.
  constexpr int kPieces = kTileN / 8, kInFlight = std::is_same_v<T, __nv_bfloat16> ? 4 : 2;
  const int rows = min(kTileM, m - m0), pieces = rows * kPieces;
  for (int c0 = threadIdx.x % 128; c0 < pieces; c0 += 128 * kInFlight) {
    int4 v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int c = c0 + 128 * i;
      v[i] = c < pieces ? *reinterpret_cast<const int4*>(staged + (c / kPieces) * kStagedRow + c % kPieces * 8)
                        : make_int4(0, 0, 0, 0);
    }
    int4 gv[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) gv[i] = v[i];
    gelu_pieces<T>(gv, table);
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int c = c0 + 128 * i;
      if (c < pieces) {
        const int64_t at = int64_t(m0 + c / kPieces) * n + n0 + c % kPieces * 8;
        *reinterpret_cast<int4*>(out + at) = gv[i];
        if (pre) *reinterpret_cast<int4*>(pre + at) = v[i];
      }
    }
  }
  named_barrier(bar, 128);  // the staging buffer is free again
}

template <typename T>
__global__ void __launch_bounds__(kProductThreads, 1)
    gelu_product_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                        const T* __restrict__ bias, T* __restrict__ y, T* __restrict__ pre, int m, int n, int k) {
#ifdef HONE_HOPPER_IMAGE
  expect_threads(kProductThreads);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  unsigned char* sX = smem + Smem::kX;
  unsigned char* sW = smem + Smem::kW;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::kBars);  // [kStages]: both slices landed
  uint64_t* empty = full + kStages;                                  // [kStages]: the consumer's warps are done
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, 4);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int tiles_n = n / kTileN, tiles = tiles_n * ((m + kTileM - 1) / kTileM), slices = k / kSliceK;

  if (warp >= 4 * kConsumers) {  // the producer warpgroup: one lane of its first warp loads
    registers_decrease<kProducerRegisters>();
    if (warp != 4 * kConsumers || lane != 0) return;
    int it = 0;  // slices handed out so far
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int m0 = tile / tiles_n * kTileM, n0 = tile % tiles_n * kTileN;
      for (int kb = 0; kb < slices; ++kb, ++it) {
        const int s = it % kStages;
        mbar_wait(empty + s, ((it / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(full + s, 2 * kSliceBytes);
        tma_load_2d(sX + s * kSliceBytes, &x_map, kb * kSliceK, m0, full + s);
        tma_load_2d(sW + s * kSliceBytes, &w_map, kb * kSliceK, n0, full + s);
      }
    }
    return;
  }

  registers_increase<kConsumerRegisters>();
  unsigned char* table = smem + Smem::kTable;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // while the producer's first loads land
    for (int e = threadIdx.x; e < kGeluTableEntries; e += 128 * kConsumers)
      reinterpret_cast<uint16_t*>(table)[e] = gelu_table_entry(e);
    named_barrier(5, 128 * kConsumers);
  }
  const int wg = warp / 4, wq = warp % 4, g = lane >> 2, t = lane & 3;
  T* staged = reinterpret_cast<T*>(smem + Smem::kOut + wg * Smem::kStaged);
  float* tile_bias = reinterpret_cast<float*>(smem + Smem::kBias) + wg * kTileN;
  // Consumer wg takes the CTA's tiles wg, wg + 2, ...: tile j of the CTA holds ring slices
  // j * slices ... (j + 1) * slices - 1. The consumers' main loops take turns (named
  // barriers 3 and 4, one per direction): a stage's barrier tells its phases apart only
  // when its waiters are at most one phase ahead, so a consumer waits for a tile's slices
  // only after the other has waited for the tile's before.
  const int my_turn = 3 + wg, their_turn = 4 - wg;
  for (int j = wg, tile = blockIdx.x + wg * gridDim.x; tile < tiles; j += kConsumers, tile += kConsumers * gridDim.x) {
    const int m0 = tile / tiles_n * kTileM, n0 = tile % tiles_n * kTileN;
    // The tile's bias, read from global memory while the main loop runs, not in the epilogue.
    tile_bias[threadIdx.x % 128] = bias ? float(bias[n0 + threadIdx.x % 128]) : 0.0f;
    if (j > 0) named_barrier(my_turn, 256);
    // acc[h]: rows 64 h .. 64 h + 63 of the tile. Warp wq holds rows 16 wq + g and + 8 of
    // each; element 4 nt + e is column 8 nt + 2 t + (e & 1) of row + 8 (e >> 1).
    float acc[2][64];
    const int first = j * slices;
    // Issues slice kb's MMAs; accumulate = false (the tile's first slice) overwrites acc.
    const auto mma_slice = [&](int kb, bool accumulate) {
      const int it = first + kb, s = it % kStages;
      mbar_wait(full + s, (it / kStages) & 1);
      const unsigned char* xs = sX + s * kSliceBytes;
      const unsigned char* ws = sW + s * kSliceBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSliceK / 16; ++kk) {
        const uint64_t wd = smem_descriptor(ws + kk * 32);
        wgmma_m64n128k16_ss<T>(acc[0], smem_descriptor(xs + kk * 32), wd, accumulate || kk > 0);
        wgmma_m64n128k16_ss<T>(acc[1], smem_descriptor(xs + 64 * 128 + kk * 32), wd, accumulate || kk > 0);
      }
      wgmma_commit();
      // One slice's MMAs stay in flight; the slice before it is done, and its stage free.
      wgmma_wait<1>();
      fence_registers(acc[0]);
      fence_registers(acc[1]);
      if (kb > 0 && lane == 0) mbar_arrive(empty + (it - 1) % kStages);
    };
    // The first slice apart (hopper_gelu_product_runs asks k > 0): with its MMAs' accumulate
    // flag a constant, ptxas sees that they do not read acc, so the last tile's accumulators
    // are dead in the store loop (with the flag a loop's value, they held 128 registers there).
    mma_slice(0, false);
    for (int kb = 1; kb < slices; ++kb) mma_slice(kb, true);
    if (tile + gridDim.x < tiles) named_barrier_arrive(their_turn, 256);  // the other's next tile may start
    wgmma_wait<0>();
    fence_registers(acc[0]);
    fence_registers(acc[1]);
    if (lane == 0) mbar_arrive(empty + (first + slices - 1) % kStages);

    named_barrier(1 + wg, 128);  // the tile's bias is in shared memory
#pragma unroll
    for (int nt = 0; nt < kTileN / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      const float2 b = make_float2(tile_bias[col], tile_bias[col + 1]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = 64 * h + 16 * wq + g + 8 * r;
          *reinterpret_cast<uint32_t*>(staged + row * kStagedRow + col) =
              pack<T>(acc[h][4 * nt + 2 * r] + b.x, acc[h][4 * nt + 2 * r + 1] + b.y);
        }
    }
    write_staged_gelu(y, pre, staged, table, m0, n0, m, n, 1 + wg);
  }
#else
  __trap();  // picked only where hopper_kernels_present() says this image has the body
#endif
}

template <typename T>
void launch(cudaStream_t stream, const void* x, const void* w, const void* b, void* y, void* pre, int64_t m,
            int64_t n, int64_t k, int sms) {
  static const bool smem_opted_in = [] {  // once per kernel; above 48 KiB needs the opt-in
    HONE_CUDA_CHECK(cudaFuncSetAttribute(gelu_product_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(Smem::kBytes)));
    return true;
  }();
  (void)smem_opted_in;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const CUtensorMap x_map = flash::hopper_tile_map(x, bf16, m, k, kTileM);
  const CUtensorMap w_map = flash::hopper_tile_map(w, bf16, n, k, kTileN);
  const int64_t tiles = n / kTileN * ((m + kTileM - 1) / kTileM);
  gelu_product_kernel<T><<<unsigned(std::min<int64_t>(tiles, sms)), kProductThreads, Smem::kBytes, stream>>>(
      x_map, w_map, static_cast<const T*>(b), static_cast<T*>(y), static_cast<T*>(pre), int(m), int(n), int(k));
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool gelu_epilogue_allowed() {
  const char* v = std::getenv("HONE_GELU_EPILOGUE");
  if (v == nullptr || std::strcmp(v, "on") == 0) return true;
  if (std::strcmp(v, "off") == 0) return false;
  fail("HONE_GELU_EPILOGUE={} is not a choice: unset or \"on\" for hone's Hopper product with the GELU in its "
       "epilogue where it runs, \"off\" for cuBLASLt's product and a GELU pass",
       v);
}

bool hopper_gelu_product_runs(DType t, int64_t m, int64_t n, int64_t k, int sms,
                              std::initializer_list<const void*> data) {
  bool aligned = true;
  for (const void* p : data) aligned = aligned && aligned16(p);
  if (!((t == DType::BF16 || t == DType::F16) && n % kTileN == 0 && k > 0 && k % kSliceK == 0 && n < (int64_t(1) << 30) &&
        aligned && gelu_epilogue_allowed() && flash::hopper_kernels_present()))
    return false;
  // Fewer tiles than two a CTA leave SMs idle that cuBLASLt's choices (split k) would use.
  return n / kTileN * ((m + kTileM - 1) / kTileM) >= 2 * int64_t(sms);
}

void hopper_gelu_product(cudaStream_t stream, int sms, DType t, const void* x, const void* w, const void* b,
                         void* y, void* pre, int64_t m, int64_t n, int64_t k) {
  if (m == 0) return;
  if (m > std::numeric_limits<int>::max() - kTileM || n / kTileN * ((m + kTileM - 1) / kTileM) >= (int64_t(1) << 31))
    fail("the GELU product: [{}, {}] is more than its 32-bit indices count", m, n);
  if (t == DType::BF16)
    launch<__nv_bfloat16>(stream, x, w, b, y, pre, m, n, k, sms);
  else
    launch<__half>(stream, x, w, b, y, pre, m, n, k, sms);
}

}  // namespace hone::cuda
