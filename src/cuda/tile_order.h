#pragma once
// The Hopper attention kernels' tiles heaviest first. A persistent CTA that took its tiles
// in turns (tile_coords) finished apart from the others on packed batches: at lengths
// 16..512 the busiest CTA held a sixth to a fifth more work than the mean, in the forward
// (a tile walks one to four key blocks, with one to three warpgroups) and in the backward
// (a key tile walks 1..8 query blocks) alike (bench/tile_order_model.py). So each CTA sorts
// the (sequence, block) pairs of the launch by their work, heaviest first, with a stable
// counting sort, so that every CTA gets the same list without handing anything over, and
// takes the list's tiles in turns that run forward and backward by round (CTA c the c-th
// of even rounds, the c-th from the end of odd ones); a pair's heads are neighbours. In
// the model that leaves the busiest CTA 1-4% above the mean.
#include <cstdint>

#include "cuda/flash_kernels.h"

namespace hone::cuda::flash {

// Pairs a CTA sorts at most (13 KiB of shared memory with the keys and counts); more keep
// the turns, as do walks too long for a one-byte work key.
constexpr int kMaxOrderedPairs = 4096;
constexpr int kWorkKeys = 256;

// Where a kernel's shared memory holds the sort, from byte `at` on.
struct TileOrderSmem {
  size_t work, order, count, end;  // U8 [kMaxOrderedPairs], U16 [kMaxOrderedPairs], I32 [kWorkKeys]
  static constexpr TileOrderSmem at(size_t at) {
    const size_t count = at + 3 * size_t(kMaxOrderedPairs);
    return {at, at + kMaxOrderedPairs, count, count + 4 * kWorkKeys};
  }
};

// order[] = the pairs 0 .. pairs - 1, by work_key(p) (< kWorkKeys; 0 for a pair with no
// work), heaviest first, in pair order within a key. Every thread of the CTA takes part.
template <typename WorkKey>
__device__ void sort_pairs_by_work(int pairs, WorkKey work_key, uint8_t* work, uint16_t* order, int* count) {
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) work[p] = uint8_t(work_key(p));
  for (int k = threadIdx.x; k < kWorkKeys; k += blockDim.x) count[k] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[work[p]], 1);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const unsigned below = (1u << lane) - 1u;
    // count[k] becomes the first place of key k: the pairs of heavier keys come before it.
    int heavier = 0;
    for (int top = kWorkKeys - 1; top >= 0; top -= 32) {
      const int k = top - lane, c = count[k];
      int through = c;  // this chunk's keys from `top` down to k
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, through, o);
        if (lane >= o) through += v;
      }
      count[k] = heavier + through - c;
      heavier += __shfl_sync(0xffffffffu, through, 31);
    }
    __syncwarp();
    for (int p0 = 0; p0 < pairs; p0 += 32) {  // in pair order within a key: stable
      const int p = p0 + lane, key = p < pairs ? work[p] : -1;
      const unsigned same = __match_any_sync(0xffffffffu, key);
      if (p < pairs) order[count[key] + __popc(same & below)] = uint16_t(p);
      __syncwarp();
      if (p < pairs && (same & below) == 0) count[key] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
}

// A launch's tile counts, a kernel argument computed on the host. Derived in the kernel from
// the other arguments, they were live across the producer/consumer register split, and
// ptxas spilled them and reloaded them from local memory at every tile; an argument is read
// from the constant bank wherever it is used.
struct TileCounts {
  int blocks;    // tiles a (sequence, head) pair
  int bh_pairs;  // (sequence, head) pairs
  int tiles;     // blocks x bh_pairs
};

// The k-th tile of this CTA, or bh = -1 when it has no more: from the pairs (b blocks +
// block) by work, or in plain turns (order null).
__device__ __forceinline__ TileCoords cta_tile(const uint16_t* order, int k, int tiles, int blocks, int heads,
                                               int bh_pairs, bool packed) {
  const int col = order && (k & 1) ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int i = k * int(gridDim.x) + col;
  if (i >= tiles) return {-1, 0};
  if (!order) return tile_coords(i, blocks, bh_pairs, packed);
  const int pair = order[i / heads];
  return {pair / blocks * heads + i % heads, pair % blocks};
}

}  // namespace hone::cuda::flash
