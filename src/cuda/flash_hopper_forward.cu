// Flash attention forward for Hopper (FlashAttention-3's structure), head sizes 32, 64, 128: a
// persistent kernel, one CTA per SM taking tiles heaviest first (sort_pairs_by_work), of
// consumer warpgroups (three up to head size 64, two at 128: hopper_forward_rows) and a
// producer warpgroup (one warp of it works; the group gives its registers to the consumers).
// The producer streams each tile's Q (64 rows a consumer) and its key blocks (K and V, 128
// keys) through TMA into a ring of swizzled shared memory stages (HeadTile), with the key
// block's mask bias beside them, and mbarriers hand stages back and forth; beside each Q it
// writes the tile's coordinates, rows and key walk (TileInfo), which the consumers take rather
// than derive. Each consumer warpgroup owns 64 query rows: it keeps its Q fragments in
// registers and per key block issues S = Q K^T and O += P V as warpgroup MMAs (wgmma, A from
// registers, B from shared memory), with the online softmax between them in registers. A third
// group keeps the tensor cores busy while the other two run their softmax (the exp2s of a block
// take about as long as its two products at head size 64); a group whose rows are all past the
// sequence only hands the stages on. Dropout reads its keep bits, drawn beforehand
// (keep_bits_kernel), through the same stages. With a window, producer and consumers walk only
// the key blocks within it of the tile's rows, and the blocks that cross its edge set the
// scores outside it to -inf. Same arguments and results as flash_forward.cu (ForwardArgs), so
// the two are interchangeable.
#include <algorithm>
#include <array>
#include <atomic>

#include "cuda/check.h"
#include "cuda/flash_hopper.h"
#include "cuda/hopper.h"
#include "cuda/tile_order.h"

namespace hone::cuda::flash {

namespace {

using namespace hopper;

constexpr int kKeys = 128;  // keys per block

// Whether the launch's (sequence, query tile) pairs go heaviest first (tile_order.h): the
// work key is the key blocks walked x 4 + the warpgroups with rows, 0 past the end.
template <int kRows>
__device__ __forceinline__ bool orders_tiles(int batch, int S) {
  return batch * ((S + kRows - 1) / kRows) <= kMaxOrderedPairs && 4 * ((S + kKeys - 1) / kKeys) + 3 < kWorkKeys;
}

// Threads of the forward at head size D: 128 a consumer warpgroup (64 query rows), then the
// producer warpgroup.
constexpr int forward_threads(int D) { return 128 * (hopper_forward_rows(D) / 64 + 1); }

// The rows of a sequence whose context is written: all of them, or its first
// (ForwardArgs::query_rows). Rows past them are skipped as rows past the sequence are.
[[maybe_unused]] __device__ __forceinline__ int query_rows(const ForwardArgs& a, const SequenceRows& rows) {
  return min(rows.len, a.query_rows);
}

// The key blocks that query tile qt (of kRows rows) of a sequence weighs (window_blocks); the
// producer and the consumers walk the same ones.
template <int kRows>
__device__ __forceinline__ BlockRange key_walk(const ForwardArgs& a, const SequenceRows& rows, int qt) {
  const int first = qt * kRows, last = min(first + kRows, query_rows(a, rows)) - 1;
  return window_blocks(a.window, first, last, kKeys, (rows.keys + kKeys - 1) / kKeys);
}

// The work key of pair p = b q_tiles + qt (orders_tiles).
template <int kRows>
__device__ __forceinline__ int forward_work(const ForwardArgs& a, const int32_t* key_lengths, int p, int q_tiles) {
  const int qt = p % q_tiles;
  const SequenceRows rows = sequence_rows(a.row_start, key_lengths, p / q_tiles, a.seq, a.window);
  const int queries = query_rows(a, rows);
  if (qt * kRows >= queries) return 0;
  const BlockRange walk = key_walk<kRows>(a, rows, qt);
  return (walk.hi - walk.lo) * 4 + min(kRows / 64, (queries - qt * kRows + 63) / 64);
}

// What the consumers need of a tile, written by the producer beside its Q (bh < 0: no tile
// more), so that the consumers' tile start does no divisions and no global loads of their own.
struct TileInfo {
  int64_t first;  // SequenceRows::first
  int bh, h, qt, queries, lo, hi;
};
static_assert(sizeof(TileInfo) == 32);

template <int D, int kRows>
struct Smem {
  using Tile = HeadTile<D, kKeys>;
  using QTile = HeadTile<D, kRows>;
  static constexpr int kTileBytes = Tile::kBytes;
  static constexpr int kStages = D == 128 ? 2 : 3;  // key blocks in flight (three of 128 x 128 exceed the SM)
  // [kRows][D] Q, then per stage [kKeys][D] K and V, all 1024-byte aligned.
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + QTile::kBytes;
  static constexpr size_t kV = kK + size_t(kStages) * kTileBytes;
  static constexpr size_t kBias = kV + size_t(kStages) * kTileBytes;   // [kStages][kKeys] F32
  static constexpr size_t kBits = kBias + size_t(kStages) * kKeys * 4;  // [kStages][kRows][4] U32
  static constexpr size_t kPlain = kBits + size_t(kStages) * kRows * 16;  // [kStages] I32: every key's bias is 0
  static constexpr size_t kTile = kPlain + 16;  // TileInfo of the tile whose Q is in the Q buffer
  static constexpr size_t kBars = kTile + 32;   // mbarriers
  static_assert(kStages * 4 <= 16);
  static constexpr TileOrderSmem kOrder = TileOrderSmem::at(kBars + (2 + 2 * kStages) * 8);
  static constexpr size_t kLengths = kOrder.end;  // I32 [kMaskLengthsBatch]: key lengths from the mask
  static constexpr size_t kBytes = kLengths + 4 * kMaskLengthsBatch + 1024;  // + alignment slack
};

template <typename T, int D>
__global__ void __launch_bounds__(forward_threads(D), 1)
    hopper_forward_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap q_map,
                          const __grid_constant__ CUtensorMap bits_map, ForwardArgs a, int batch, TileCounts n) {
#ifdef HONE_HOPPER_IMAGE
  constexpr int kRows = hopper_forward_rows(D), kConsumers = kRows / 64;  // query rows per tile, warpgroups
  expect_threads(forward_threads(D));
  constexpr int kProducerRegisters = kConsumers == 3 ? 24 : 40, kConsumerRegisters = kConsumers == 3 ? 160 : 232;
  static_assert(fits_launch_registers(forward_threads(D), kProducerRegisters, kConsumerRegisters));
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  using L = Smem<D, kRows>;
  using Tile = typename L::Tile;
  using QTile = typename L::QTile;
  constexpr int kStages = L::kStages, kTileBytes = L::kTileBytes;
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem + L::kQ;
  unsigned char* sK = smem + L::kK;
  unsigned char* sV = smem + L::kV;
  float* sBias = reinterpret_cast<float*>(smem + L::kBias);
  int32_t* sPlain = reinterpret_cast<int32_t*>(smem + L::kPlain);
  TileInfo* sTile = reinterpret_cast<TileInfo*>(smem + L::kTile);
  const uint4* sBits = reinterpret_cast<const uint4*>(smem + L::kBits);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* q_full = bars;          // Q landed (TMA bytes)
  uint64_t* q_empty = bars + 1;     // every consumer warp holds its Q fragments
  uint64_t* kv_full = bars + 2;     // [kStages]: K, V landed and the bias written
  uint64_t* kv_empty = bars + 2 + kStages;  // [kStages]: every consumer warp is done with the stage

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kConsumerWarps = 4 * kConsumers;
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kConsumerWarps);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(kv_full + s, 32);
      mbar_init(kv_empty + s, kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int S = a.seq, H = a.heads * D;
  const bool dropping = a.drop.p > 0.0f;
  const bool packed = a.row_start != nullptr;
  // Small padded calls come without key lengths (mask_lengths_in_kernel): each CTA takes
  // them from the mask, a warp a sequence, rather than a launch of its own per layer.
  const int32_t* key_lengths = a.key_lengths;
  if (!packed && !key_lengths) {
    int32_t* lengths = reinterpret_cast<int32_t*>(smem + L::kLengths);
    for (int b = warp; b < batch; b += blockDim.x / 32) {
      const int length = warp_key_length(a.mask + int64_t(b) * S, S, lane);
      if (lane == 0) lengths[b] = length;
    }
    __syncthreads();
    key_lengths = lengths;
  }
  // Null for plain turns; the loops below recompute it from the arguments rather than hold
  // it. A launch of at most a tile a CTA (batch 1) has no order to choose: each CTA takes its
  // own tile, without the sort's pass over the pairs and its barriers (batch 1 x 128 ran 2.5%
  // faster). The tile counts come as an argument (TileCounts); ptxas (nvcc 13) reports 32-44
  // bytes of spill stores at head sizes 32 and 64, all in the producer's 24 registers.
  const auto tile_order = [&] {
    const bool ordered = orders_tiles<kRows>(batch, S) && n.tiles > int(gridDim.x);
    return ordered ? reinterpret_cast<uint16_t*>(smem + L::kOrder.order) : nullptr;
  };
  if (tile_order())
    sort_pairs_by_work(
        batch * n.blocks, [&](int p) { return forward_work<kRows>(a, key_lengths, p, n.blocks); },
        smem + L::kOrder.work, tile_order(), reinterpret_cast<int*>(smem + L::kOrder.count));

  if (warp >= kConsumerWarps) {  // the producer warpgroup: its first warp loads, the others leave
    registers_decrease<kProducerRegisters>();
    if (warp != kConsumerWarps) return;
    int kv_iter = 0, q_iter = 0;
    for (int k = 0;; ++k) {
      const TileCoords tc = cta_tile(tile_order(), k, n.tiles, n.blocks, a.heads, n.bh_pairs, packed);
      if (tc.bh < 0) break;
      const int bh = tc.bh, qt = tc.block, b = bh / a.heads, h = bh % a.heads;
      const SequenceRows rows = sequence_rows(a.row_start, key_lengths, b, S, a.window);
      const int queries = query_rows(a, rows);
      if (qt * kRows >= queries) continue;  // past the rows written: the consumers never see it
      const BlockRange walk = key_walk<kRows>(a, rows, qt);
      const int row0 = int(rows.first);
      const int32_t* mask_row = packed ? nullptr : a.mask + int64_t(b) * S;
      mbar_wait(q_empty, (q_iter++ & 1) ^ 1);
      if (lane == 0) {
        *sTile = TileInfo{rows.first, bh, h, qt, queries, walk.lo, walk.hi};
        mbar_arrive_expect_tx(q_full, QTile::kBytes);
        for (int p = 0; p < QTile::kPanels; ++p)
          tma_load_2d(sQ + p * QTile::kPanelBytes, &q_map, h * D + p * QTile::kCols, row0 + qt * kRows, q_full);
      }
      for (int kb = walk.lo; kb < walk.hi; ++kb, ++kv_iter) {
        const int stage = kv_iter % kStages;
        mbar_wait(kv_empty + stage, ((kv_iter / kStages) & 1) ^ 1);
        bool plain = true;
        for (int i = lane; i < kKeys; i += 32) {
          const int key = kb * kKeys + i;
          const float bias = key_bias(mask_row, key, rows.len);
          sBias[stage * kKeys + i] = bias;
          plain = plain && bias == 0.0f;
        }
        plain = __all_sync(0xffffffffu, plain);
        if (lane == 0) {
          sPlain[stage] = plain;
          mbar_arrive_expect_tx(kv_full + stage, 2 * kTileBytes + (dropping ? kRows * 16 : 0));
          for (int p = 0; p < Tile::kPanels; ++p) {
            const int col = h * D + p * Tile::kCols;
            tma_load_2d(sK + stage * kTileBytes + p * Tile::kPanelBytes, &qkv_map, H + col, row0 + kb * kKeys,
                        kv_full + stage);
            tma_load_2d(sV + stage * kTileBytes + p * Tile::kPanelBytes, &qkv_map, 2 * H + col, row0 + kb * kKeys,
                        kv_full + stage);
          }
          if (dropping)
            tma_load_2d(smem + L::kBits + stage * kRows * 16, &bits_map, kb * 4, bh * S + qt * kRows,
                        kv_full + stage);
        } else {
          mbar_arrive(kv_full + stage);
        }
      }
    }
    mbar_wait(q_empty, (q_iter & 1) ^ 1);  // the last tile's Q is taken: say there is no tile more
    if (lane == 0) {
      sTile->bh = -1;
      mbar_arrive(q_full);
    }
    return;
  }

  registers_increase<kConsumerRegisters>();
  // A consumer: warpgroup wg, its warp wq holds rows 16 wq .. 16 wq + 15 of the group's 64.
  const int wg = warp / 4, wq = warp % 4, g = lane >> 2, t = lane & 3;
  int kv_iter = 0, q_iter = 0;
  // The groups take turns at every key block: group wg issues its S = Q K^T once group
  // wg - 1 has its own S of the block back (is in its softmax), so that one group's exp2s
  // run beside another's products rather than every group's at once. Named barrier 1 + wg:
  // the group before arrives, group wg waits. Every group takes a turn at every block of
  // every tile (a group without rows too), so the turns balance; group 0's first turn needs
  // no wait, and the last group's last hand-over is taken up after the loop.
  int turns = 0;
  const auto take_turn = [&] {
    if (wg != 0 || turns > 0) named_barrier(1 + wg, 256);
    ++turns;
  };
  const auto pass_turn = [&] { named_barrier_arrive(1 + (wg + 1) % kConsumers, 256); };
  for (;;) {
    mbar_wait(q_full, q_iter++ & 1);
    const TileInfo tile = *sTile;
    if (tile.bh < 0) {
      if (wg == 0 && turns > 0) named_barrier(1, 256);
      break;
    }
    const int bh = tile.bh, qt = tile.qt, h = tile.h, queries = tile.queries;
    const BlockRange walk{tile.lo, tile.hi};
    const int row_in_tile = wg * 64 + wq * 16;
    const int warp_row0 = qt * kRows + row_in_tile;
    const int q_row0 = warp_row0 + g;  // this lane's rows: q_row0 and q_row0 + 8

    if (qt * kRows + wg * 64 >= queries) {  // every row of the group is past those written: hand the stages on
      __syncwarp();
      if (lane == 0) mbar_arrive(q_empty);
      for (int kb = walk.lo; kb < walk.hi; ++kb, ++kv_iter) {
        const int stage = kv_iter % kStages;
        mbar_wait(kv_full + stage, (kv_iter / kStages) & 1);  // the stage's previous phase is over
        take_turn();
        pass_turn();
        __syncwarp();
        if (lane == 0) mbar_arrive(kv_empty + stage);
      }
      continue;
    }
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldmatrix_x4(qf[kk], sQ + QTile::chunk(row_in_tile + (lane & 15), kk * 2 + (lane >> 4)));
    // The fragments are first used after the release below, so the loads may still be in
    // flight when the producer's TMA (the async proxy) writes the next tile's Q over them: a
    // write after read across proxies needs this fence (PTX memory model). Without it,
    // varied-length batches came out different from launch to launch on an H200
    // (EveryLaunchInARowGivesTheSameOutput).
    fence_async_shared();
    __syncwarp();
    if (lane == 0) mbar_arrive(q_empty);

    float o[D / 2];  // O: per panel of kCols columns, the panel's kCols / 2 accumulators
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // row_sum: this lane's columns

    for (int kb = walk.lo; kb < walk.hi; ++kb, ++kv_iter) {
      const int stage = kv_iter % kStages;
      mbar_wait(kv_full + stage, (kv_iter / kStages) & 1);
      const unsigned char* k_s = sK + stage * kTileBytes;
      const unsigned char* v_s = sV + stage * kTileBytes;
      const float* bias = sBias + stage * kKeys;

      float s[64];  // S = Q K^T: 16 accumulator tiles of 8 keys, s[4 nt + e]
      take_turn();
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) wgmma_m64n128k16_rs<T>(s, qf[kk], Tile::k_major(k_s, 0, kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(s);
      pass_turn();

      // This warp's 16 rows against the block's keys (the test per element is per warp).
      const bool edge = crosses_window(a.window, warp_row0, warp_row0 + 15, kb * kKeys, kb * kKeys + kKeys - 1);
      // In a plain block (every key's bias 0, off a window's edge: all but a sequence's last)
      // the maximum is taken over the raw scores and scaled after (the scale is positive and
      // rounding monotonic, so it is the scaled scores' maximum), and each exp2's argument below
      // is one FFMA of the raw score: the scaling leaves the path from S to the exp2s, and 64
      // instructions a block leave each thread. Elsewhere the scores are scaled and biased
      // first (score_scale 1: the same bits as before).
      const bool plain = sPlain[stage] != 0 && !edge;
      const float score_scale = plain ? a.scale_log2 : 1.0f;
      float tile_max[2] = {-INFINITY, -INFINITY};
      if (plain) {
#pragma unroll
        for (int i = 0; i < 64; ++i) tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
      } else {
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; ++nt) {
          const float2 kbias = *reinterpret_cast<const float2*>(bias + nt * 8 + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) s[4 * nt + e] = fmaf(s[4 * nt + e], a.scale_log2, e & 1 ? kbias.y : kbias.x);
          if (edge) window_tile(s + 4 * nt, a.window, q_row0, kb * kKeys + nt * 8 + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[4 * nt + e]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(row_max[r], tile_max[r] * score_scale);
      float rescale[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        rescale[r] = exp2_approx(row_max[r] - finite_max(tile_max[r]));  // 0 on the first block (-inf)
        row_max[r] = tile_max[r];
        row_sum[r] *= rescale[r];
      }
      const float neg_sub[2] = {-finite_max(row_max[0]), -finite_max(row_max[1])};
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        s[i] = exp2_approx(fmaf(s[i], score_scale, neg_sub[(i >> 1) & 1]));
        row_sum[(i >> 1) & 1] += s[i];
      }
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] *= rescale[(i >> 1) & 1];
      fence_registers(o);
      if (dropping) {  // this lane's two rows' 128 keep bits, key 8 nt + 2 t + (e & 1) in word nt / 4
        const uint4 w0 = sBits[stage * kRows + row_in_tile + g], w1 = sBits[stage * kRows + row_in_tile + g + 8];
        const uint32_t words[2][4] = {{w0.x, w0.y, w0.z, w0.w}, {w1.x, w1.y, w1.z, w1.w}};
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const uint32_t bit = (words[e >> 1][nt >> 2] >> ((nt & 3) * 8 + 2 * t + (e & 1))) & 1u;
            s[4 * nt + e] = bit ? s[4 * nt + e] : 0.0f;
          }
      }

      // O += P V: P's accumulator tiles, two by two, are the A fragments of 16 keys.
      uint32_t pa[kKeys / 16][4];
#pragma unroll
      for (int kc = 0; kc < kKeys / 16; ++kc) {
        pa[kc][0] = pack<T>(s[8 * kc + 0], s[8 * kc + 1]);
        pa[kc][1] = pack<T>(s[8 * kc + 2], s[8 * kc + 3]);
        pa[kc][2] = pack<T>(s[8 * kc + 4], s[8 * kc + 5]);
        pa[kc][3] = pack<T>(s[8 * kc + 6], s[8 * kc + 7]);
      }
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < kKeys / 16; ++kc)
#pragma unroll
        for (int p = 0; p < Tile::kPanels; ++p)
          wgmma_panel_rs<T, Tile::kCols, true>(o + p * Tile::kCols / 2, pa[kc], Tile::mn_major(v_s, p, kc * 16), true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(pa);
      fence_registers(o);
      __syncwarp();
      if (lane == 0) mbar_arrive(kv_empty + stage);
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
      inv[r] = 1.0f / row_sum[r];
    }
    const int q_row1 = q_row0 + 8;
    if (t == 0 && a.stats) {
      if (q_row0 < queries) a.stats[int64_t(bh) * S + q_row0] = make_float2(row_max[0], inv[0]);
      if (q_row1 < queries) a.stats[int64_t(bh) * S + q_row1] = make_float2(row_max[1], inv[1]);
    }
    const float s0 = inv[0] * a.keep_scale, s1 = inv[1] * a.keep_scale;
    T* ctx = static_cast<T*>(a.ctx) + tile.first * H + h * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      if (q_row0 < queries)
        *reinterpret_cast<uint32_t*>(ctx + int64_t(q_row0) * H + dt * 8) = pack<T>(o[4 * dt] * s0, o[4 * dt + 1] * s0);
      if (q_row1 < queries)
        *reinterpret_cast<uint32_t*>(ctx + int64_t(q_row1) * H + dt * 8) =
            pack<T>(o[4 * dt + 2] * s1, o[4 * dt + 3] * s1);
    }
  }
#else
  __trap();  // picked only where hopper_kernels_present() says this image has the body
#endif
}

}  // namespace

bool hopper_kernels_present() {
  static std::array<std::atomic<int>, 64> known{};  // per device: 0 unknown, 1 present, 2 absent
  int device = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= int(known.size())) return false;
  if (known[device] == 0) {
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, hopper_forward_kernel<__nv_bfloat16, 64>);
    if (e != cudaSuccess) cudaGetLastError();  // no image for this GPU: the answer, not an error
    // Machine code built from sm_90a's PTX; an image JIT-compiled from older PTX has no body.
    known[device] = e == cudaSuccess && attr.binaryVersion == 90 && attr.ptxVersion == 90 ? 1 : 2;
  }
  return known[device] == 1;
}

template <typename T, int D>
void launch_hopper_forward(const ForwardArgs& a, const CUtensorMap& qkv_map, const CUtensorMap& q_map,
                           const CUtensorMap& bits_map, int batch, int sms, cudaStream_t stream) {
  constexpr int kRows = hopper_forward_rows(D);
  constexpr size_t kBytes = Smem<D, kRows>::kBytes;
  static const bool smem_opted_in = [] {  // once per kernel; above 48 KiB needs the opt-in
    HONE_CUDA_CHECK(cudaFuncSetAttribute(hopper_forward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(kBytes)));
    return true;
  }();
  (void)smem_opted_in;
  const int blocks = (a.seq + kRows - 1) / kRows;
  const TileCounts n{blocks, batch * a.heads, blocks * batch * a.heads};
  hopper_forward_kernel<T, D>
      <<<std::min(n.tiles, sms), forward_threads(D), kBytes, stream>>>(qkv_map, q_map, bits_map, a, batch, n);
  HONE_CUDA_LAUNCH_CHECK();
}

#define HONE_HOPPER_FORWARD(T, D)                                                                                  \
  template void launch_hopper_forward<T, D>(const ForwardArgs&, const CUtensorMap&, const CUtensorMap&,            \
                                            const CUtensorMap&, int, int, cudaStream_t);
HONE_HOPPER_FORWARD(__nv_bfloat16, 32)
HONE_HOPPER_FORWARD(__nv_bfloat16, 64)
HONE_HOPPER_FORWARD(__nv_bfloat16, 128)
HONE_HOPPER_FORWARD(__half, 32)
HONE_HOPPER_FORWARD(__half, 64)
HONE_HOPPER_FORWARD(__half, 128)
#undef HONE_HOPPER_FORWARD

}  // namespace hone::cuda::flash
