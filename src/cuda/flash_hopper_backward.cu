// Flash attention backward for Hopper (FlashAttention-3's structure), head sizes 32, 64, 128: a
// persistent kernel, one CTA per SM taking tiles heaviest first (tile_order.h), of two
// consumer warpgroups and a producer warpgroup (one warp loads; at head sizes 32 and 64 the
// other three reduce dQ). A tile is 128 keys of one (sequence, head), 64 per consumer
// warpgroup; the producer streams K and V once per tile and then every query block (64
// queries: Q, dO through TMA, the forward's {max, 1 / sum} and D = rowsum(dO * O) through
// plain loads) through a ring of swizzled stages (HeadTile). Per query block a consumer
// warpgroup issues, as warpgroup MMAs with its K and V fragments in registers (from shared
// memory at head size 128, where registers hold dK and dV's 128 accumulators):
//   S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries),
//   dV += P'^T dO and dK += dS^T Q (P' the dropped P, dS^T = P^T (dP^T - D)),
//   dQ_part = dS K over its 64 keys (dS^T through shared memory),
// and both write their parts to shared memory, where the producer warpgroup's other three
// warps add them and reduce the sum into the F32 accumulator with vector reductions
// (reduce_dq_parts; at head size 128, ahead of dV and dK's products, each warpgroup takes 64 of
// dQ's columns over all the tile's keys, reading both dS^T, and reduces them itself).
// Dropout reads the keep bits drawn beforehand (keep_bits_kernel) through the query stages.
// Padded queries are computed (P = 0 past the sequence; a packed sequence has none, and its
// tiles' rows past it, another sequence's, get P = 0); key tiles past the sequence's last
// attended key only write their zero gradients. With a window, producer and consumers walk
// only the query blocks within it of the tile's keys, and the blocks that cross its edge give
// the elements outside it no weight. Same arguments and results as flash_backward.cu.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/flash_hopper.h"
#include "cuda/hopper.h"
#include "cuda/tile_order.h"

namespace hone::cuda::flash {

namespace {

using namespace hopper;

constexpr int kConsumers = 2;                          // warpgroups of 64 keys
constexpr int kKeys = 64 * kConsumers;                 // keys per tile
constexpr int kQueries = 64;                           // queries per block
constexpr int kStages = 2;                             // query blocks in flight
constexpr int kThreadsBwd = 128 * (kConsumers + 1);    // + the producer warpgroup
constexpr int kDsBytes = 64 * 64 * 2;                  // one swizzled [64 keys][64 queries] dS^T
// The producer warpgroup's warps 1-3 (reduce_dq_parts).
[[maybe_unused]] constexpr int kReducerThreads = 96;

// The query blocks that key tile key0 of a sequence is weighed by (window_blocks); the
// producer and the consumers walk the same ones.
__device__ __forceinline__ BlockRange query_walk(const BackwardArgs& a, const SequenceRows& rows, int key0) {
  return window_blocks(a.window, key0, min(key0 + kKeys, rows.len) - 1, kQueries, (rows.len + kQueries - 1) / kQueries);
}

template <int D>
struct BwdSmem {
  using KeyTile = HeadTile<D, kKeys>;
  using QueryTile = HeadTile<D, kQueries>;
  // Head size 128 keeps dK and dV (128 accumulators) in registers: K and V feed the MMAs
  // from shared memory, each warpgroup reduces 64 columns of dQ (no parts to exchange),
  // and one K/V buffer fits beside the stages.
  static constexpr bool kWide = D == 128;
  static constexpr int kKVBuffers = kWide ? 1 : 2;
  // Registers a thread (128 producer + 256 consumer threads <= 384 x 168): at head size 128 the
  // consumers spill 56 bytes at 232, 4 at 240, and the producer's loop fits in 24.
  static constexpr int kProducerRegisters = kWide ? 24 : 40;
  static constexpr int kConsumerRegisters = kWide ? 240 : 232;
  static_assert(fits_launch_registers(kThreadsBwd, kProducerRegisters, kConsumerRegisters));
  // Per K/V buffer (two: the next tile's load overlaps this one; one at head size 128) K
  // and V of 128 keys; per stage Q and dO of 64 queries; per consumer warpgroup two dS^T
  // [64 keys][64 queries], used in turns, so that a warp writing the next block's dS^T
  // never overwrites rows that a slower warp's part of the last dQ product may still read
  // (at head size 128 the other warpgroup's too: it passes the next block's barrier only
  // after its dQ product).
  static constexpr size_t kK = 0;                                                   // [buffers][128][D]
  static constexpr size_t kV = kK + size_t(kKVBuffers) * KeyTile::kBytes;           // [buffers][128][D]
  static constexpr size_t kQ = kV + size_t(kKVBuffers) * KeyTile::kBytes;           // [kStages][64][D]
  static constexpr size_t kO = kQ + size_t(kStages) * QueryTile::kBytes;            // [kStages][64][D]
  static constexpr size_t kDS = kO + size_t(kStages) * QueryTile::kBytes;           // [kConsumers][2][64][64]
  static constexpr size_t kStats = kDS + size_t(2 * kConsumers) * kDsBytes;         // [kStages][64] float2
  static constexpr size_t kDot = kStats + size_t(kStages) * kQueries * 8;           // [kStages][64] F32
  static constexpr size_t kBits = kDot + size_t(kStages) * kQueries * 4;  // [kStages][64][4] U32, 128-aligned
  // Per stage, both warpgroups' dQ parts for the reducer warps: [kStages][2][64 queries][D]
  // F32, rows of D / 4 16-byte chunks, chunk c of row r at c ^ (r % 8) (dq_part_offset).
  static constexpr size_t kPart = kBits + size_t(kStages) * kQueries * 16;
  static constexpr size_t kBars = kPart + (kWide ? 0 : size_t(kStages) * 2 * kQueries * D * 4);
  static constexpr TileOrderSmem kOrder = TileOrderSmem::at(kBars + (2 * kKVBuffers + 4 * kStages) * 8);
  static constexpr size_t kBytes = kOrder.end + 1024;  // + alignment slack
};

// Whether the launch's (sequence, key tile) pairs go heaviest first (tile_order.h): the work
// key is the query blocks walked, 0 for a key tile past the sequence's last attended key.
[[maybe_unused]] __device__ __forceinline__ bool orders_tiles(int batch, int S) {
  return batch * ((S + kKeys - 1) / kKeys) <= kMaxOrderedPairs && (S + kQueries - 1) / kQueries < kWorkKeys;
}

// The work key of pair p = b key_tiles + kt (orders_tiles).
[[maybe_unused]] __device__ __forceinline__ int backward_work(const BackwardArgs& a, int p, int key_tiles) {
  const int key0 = p % key_tiles * kKeys;
  const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, p / key_tiles, a.seq, a.window);
  if (key0 >= rows.keys) return 0;
  const BlockRange walk = query_walk(a, rows, key0);
  return walk.hi - walk.lo;
}

// What block_grads needs of a consumer lane: its keys key_a and key_a + 8 (kinds as
// key_kind), the block's first query q0 and its stats, D and keep bits in shared memory,
// and where its dS^T rows go.
struct GradTile {
  float scale_log2, keep_scale;
  int window, kind_a, kind_b, key_a, q0;
  const float2* stats;  // [64] {max, 1 / sum}
  const float* dots;    // [64] D
  const uint32_t* bits;  // the lane's keep bits of query q: bits[4 q] >> bit
  int bit;
  unsigned char* ds;  // dS^T [64 keys][64 queries], 128-byte swizzled
  int row, t;         // the lane's dS^T rows: row, row + 8; its query pair within each 8: 2 t
};

// s (S^T: 16 keys of this warp by the block's 64 queries, accumulator layout) becomes P'^T
// and dp (dP^T) becomes dS^T, also written to g.ds as bf16/fp16: backward_tile on a tile
// that crosses a window's edge, backward_tile_off_edge elsewhere. With StoresLast, dS^T's
// stores follow every tile's loads: behind a store to shared memory, the next tile's loads of
// the stats and D could not be issued early (ptxas cannot tell them apart), and the
// subtraction of D waited on each (ncu: 6% of the kernel's warp samples at head size 64).
// At head size 128 the held values spill, so there each tile stores its own.
template <typename T, bool Dropping, bool Edge, bool StoresLast>
__device__ __forceinline__ void block_grads(float (&s)[32], float (&dp)[32], const GradTile& g) {
  const float bias_a = kind_bias(g.kind_a), bias_b = kind_bias(g.kind_b);
  const auto store = [&](int nt) {
    *reinterpret_cast<uint32_t*>(g.ds + swizzled(g.row, nt) + 4 * g.t) = pack<T>(dp[4 * nt], dp[4 * nt + 1]);
    *reinterpret_cast<uint32_t*>(g.ds + swizzled(g.row + 8, nt) + 4 * g.t) = pack<T>(dp[4 * nt + 2], dp[4 * nt + 3]);
  };
#pragma unroll
  for (int nt = 0; nt < kQueries / 8; ++nt) {
    const int qc = nt * 8 + 2 * g.t;
    const float4 st = *reinterpret_cast<const float4*>(g.stats + qc);  // queries qc and qc + 1
    const float2 dot = *reinterpret_cast<const float2*>(g.dots + qc);
    uint32_t w0 = 0, w1 = 0;
    if constexpr (Dropping) w0 = g.bits[qc * 4] >> g.bit, w1 = g.bits[(qc + 1) * 4] >> g.bit;
    float(&sv)[4] = *reinterpret_cast<float(*)[4]>(s + 4 * nt);
    float(&dv)[4] = *reinterpret_cast<float(*)[4]>(dp + 4 * nt);
    if constexpr (Edge)
      backward_tile(sv, dv, g.kind_a, g.kind_b, g.scale_log2, st, dot, Dropping, w0, w1, g.keep_scale,
                    outside_bits(g.window, g.key_a, g.q0 + qc));
    else
      backward_tile_off_edge<Dropping>(sv, dv, bias_a, bias_b, g.scale_log2, st, dot, w0, w1, g.keep_scale);
    if constexpr (!StoresLast) store(nt);
  }
  if constexpr (StoresLast)
#pragma unroll
    for (int nt = 0; nt < kQueries / 8; ++nt) store(nt);
}

// Byte offset of column `col` (a multiple of 2) of row `row` in a dQ part: rows of D / 4
// 16-byte chunks, chunk c at c ^ (row % 8), so that a consumer warp's float2 stores (8 rows,
// four column pairs) and a reducer warp's float4 loads (whole rows) meet no bank conflicts.
template <int D>
__device__ __forceinline__ uint32_t dq_part_offset(int row, int col) {
  return uint32_t(row * D * 4 + ((((col >> 2) ^ (row & 7))) << 4) + (col & 3) * 4);
}

// The producer warpgroup's warps 1-3 (thread rt of kReducerThreads): per query block of the
// CTA's tiles (the walk of the producer and the consumers), they wait for both consumer
// warpgroups' dQ parts, add them and reduce the sum into the F32 accumulator, four columns a
// reduction (one per element and tile), then hand the buffer back. A thread keeps one chunk
// of four columns and takes every kRowStep-th row.
template <int D>
__device__ __forceinline__ void reduce_dq_parts(const BackwardArgs& a, int batch, const uint16_t* order,
                                                const unsigned char* parts, uint64_t* parts_full,
                                                uint64_t* parts_empty, int rt) {
  constexpr int kChunks = D / 4;                          // 16-byte chunks a row
  constexpr int kRowStep = kReducerThreads / kChunks;     // rows a pass of the reducers covers
  constexpr int kPartBytes = kQueries * D * 4;
  static_assert(kReducerThreads % kChunks == 0);
  const int S = a.seq, H = a.heads * D;
  const int key_tiles = (S + kKeys - 1) / kKeys;
  const int tiles = key_tiles * batch * a.heads;
  const int chunk = rt % kChunks, row0 = rt / kChunks;
  int r_iter = 0;
  for (int k = 0;; ++k) {
    const TileCoords tc = cta_tile(order, k, tiles, key_tiles, a.heads, batch * a.heads, a.row_start != nullptr);
    if (tc.bh < 0) break;
    const int bh = tc.bh, key0 = tc.block * kKeys, b = bh / a.heads, h = bh % a.heads;
    const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
    if (key0 >= rows.keys) continue;
    const BlockRange walk = query_walk(a, rows, key0);
    for (int qb = walk.lo; qb < walk.hi; ++qb, ++r_iter) {
      const int stage = r_iter % kStages;
      const int live = min(rows.len - qb * kQueries, kQueries);  // rows within the sequence
      float* at = a.dq_accum + (rows.first + qb * kQueries + row0) * H + h * D + 4 * chunk;
      const unsigned char* p0 = parts + stage * 2 * kPartBytes;
      mbar_wait(parts_full + stage, (r_iter / kStages) & 1);
      // Two rows a turn, their four loads issued together.
      const auto add_row = [&](float* to, const float4& x, const float4& y) {
        red_add_f32x4(to, x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      };
      int row = row0;
      for (; row + kRowStep < live; row += 2 * kRowStep, at += int64_t(2 * kRowStep) * H) {
        const uint32_t o0 = dq_part_offset<D>(row, 4 * chunk), o1 = dq_part_offset<D>(row + kRowStep, 4 * chunk);
        const float4 x0 = *reinterpret_cast<const float4*>(p0 + o0);
        const float4 y0 = *reinterpret_cast<const float4*>(p0 + kPartBytes + o0);
        const float4 x1 = *reinterpret_cast<const float4*>(p0 + o1);
        const float4 y1 = *reinterpret_cast<const float4*>(p0 + kPartBytes + o1);
        add_row(at, x0, y0);
        add_row(at + int64_t(kRowStep) * H, x1, y1);
      }
      if (row < live) {
        const uint32_t o = dq_part_offset<D>(row, 4 * chunk);
        add_row(at, *reinterpret_cast<const float4*>(p0 + o), *reinterpret_cast<const float4*>(p0 + kPartBytes + o));
      }
      mbar_arrive(parts_empty + stage);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreadsBwd, 1)
    hopper_backward_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dctx_map,
                           const __grid_constant__ CUtensorMap bits_map, BackwardArgs a, int batch) {
#ifdef HONE_HOPPER_IMAGE
  expect_threads(kThreadsBwd);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  using L = BwdSmem<D>;
  using KeyTile = typename L::KeyTile;
  using QueryTile = typename L::QueryTile;
  constexpr int kKVBuffers = L::kKVBuffers, kCols = KeyTile::kCols, kPanels = KeyTile::kPanels;
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  unsigned char* sK = smem + L::kK;
  unsigned char* sV = smem + L::kV;
  unsigned char* sQ = smem + L::kQ;
  unsigned char* sO = smem + L::kO;
  unsigned char* sDS = smem + L::kDS;
  float2* sStats = reinterpret_cast<float2*>(smem + L::kStats);
  float* sDot = reinterpret_cast<float*>(smem + L::kDot);
  const uint32_t* sBits = reinterpret_cast<const uint32_t*>(smem + L::kBits);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* kv_full = bars;                // [kKVBuffers]: K and V of a tile landed
  uint64_t* kv_empty = bars + kKVBuffers;  // [kKVBuffers]: every consumer warp is done with the tile
  uint64_t* q_full = bars + 2 * kKVBuffers;  // [kStages]: Q, dO landed, stats and D written
  uint64_t* q_empty = bars + 2 * kKVBuffers + kStages;  // [kStages]
  uint64_t* parts_full = bars + 2 * kKVBuffers + 2 * kStages;   // [kStages]: both dQ parts written
  uint64_t* parts_empty = bars + 2 * kKVBuffers + 3 * kStages;  // [kStages]: the reducers are done with them

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kConsumerWarps = 4 * kConsumers;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kKVBuffers; ++i) {
      mbar_init(kv_full + i, 1);
      mbar_init(kv_empty + i, kConsumerWarps);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full + s, 32);
      mbar_init(q_empty + s, kConsumerWarps);
      mbar_init(parts_full + s, 128 * kConsumers);
      mbar_init(parts_empty + s, kReducerThreads);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int S = a.seq, H = a.heads * D;
  const int key_tiles = (S + kKeys - 1) / kKeys;
  const int tiles = key_tiles * batch * a.heads;
  const bool dropping = a.drop.p > 0.0f;
  const bool packed = a.row_start != nullptr;
  // Null for plain turns; the loops below recompute it from the arguments rather than hold it.
  const auto tile_order = [&] {
    return orders_tiles(batch, S) ? reinterpret_cast<uint16_t*>(smem + L::kOrder.order) : nullptr;
  };
  if (tile_order())
    sort_pairs_by_work(
        batch * key_tiles, [&](int p) { return backward_work(a, p, key_tiles); }, smem + L::kOrder.work,
        tile_order(), reinterpret_cast<int*>(smem + L::kOrder.count));

  if (warp >= kConsumerWarps) {  // the producer warpgroup: its first warp loads, the others reduce dQ
    registers_decrease<L::kProducerRegisters>();
    if (warp != kConsumerWarps) {
      if constexpr (!L::kWide)
        reduce_dq_parts<D>(a, batch, tile_order(), smem + L::kPart, parts_full, parts_empty,
                           threadIdx.x - 128 * kConsumers - 32);
      return;
    }
    int kv_iter = 0, q_iter = 0;
    for (int k = 0;; ++k) {
      const TileCoords tc = cta_tile(tile_order(), k, tiles, key_tiles, a.heads, batch * a.heads, packed);
      if (tc.bh < 0) break;
      const int bh = tc.bh, key0 = tc.block * kKeys, b = bh / a.heads, h = bh % a.heads;
      const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
      if (key0 >= rows.keys) continue;
      const BlockRange walk = query_walk(a, rows, key0);
      const int row0 = int(rows.first);
      const int buf = kv_iter % kKVBuffers;
      mbar_wait(kv_empty + buf, ((kv_iter++ / kKVBuffers) & 1) ^ 1);
      if (lane == 0) {
        mbar_arrive_expect_tx(kv_full + buf, 2 * KeyTile::kBytes);
        for (int p = 0; p < kPanels; ++p)
          for (int half = 0; half < 2; ++half) {  // boxes of 64 rows
            const int at = buf * KeyTile::kBytes + p * KeyTile::kPanelBytes + half * 64 * KeyTile::kRowBytes;
            const int col = h * D + p * kCols, row = row0 + key0 + half * 64;
            tma_load_2d(sK + at, &qkv_map, H + col, row, kv_full + buf);
            tma_load_2d(sV + at, &qkv_map, 2 * H + col, row, kv_full + buf);
          }
      }
      for (int qb = walk.lo; qb < walk.hi; ++qb, ++q_iter) {
        const int stage = q_iter % kStages;
        mbar_wait(q_empty + stage, ((q_iter / kStages) & 1) ^ 1);
        for (int i = lane; i < kQueries; i += 32) {
          const int q = qb * kQueries + i;
          const bool valid = q < rows.len;  // a query past the sequence gets P = 0 (max = +inf) and D = 0
          sStats[stage * kQueries + i] = valid ? a.stats[int64_t(bh) * S + q] : make_float2(INFINITY, 0.0f);
          sDot[stage * kQueries + i] = valid ? a.row_dot[int64_t(bh) * S + q] : 0.0f;
        }
        if (lane == 0) {
          mbar_arrive_expect_tx(q_full + stage, 2 * QueryTile::kBytes + (dropping ? kQueries * 16 : 0));
          for (int p = 0; p < kPanels; ++p) {
            const int at = stage * QueryTile::kBytes + p * QueryTile::kPanelBytes, col = h * D + p * kCols;
            tma_load_2d(sQ + at, &qkv_map, col, row0 + qb * kQueries, q_full + stage);
            tma_load_2d(sO + at, &dctx_map, col, row0 + qb * kQueries, q_full + stage);
          }
          if (dropping)
            tma_load_2d(smem + L::kBits + stage * kQueries * 16, &bits_map, key0 / 32, bh * S + qb * kQueries,
                        q_full + stage);
        } else {
          mbar_arrive(q_full + stage);
        }
      }
    }
    return;
  }

  registers_increase<L::kConsumerRegisters>();
  // A consumer: warpgroup wg owns keys 64 wg .. 64 wg + 63 of the tile; its warp wq rows
  // 16 wq .. 16 wq + 15 of them, this lane keys key_a and key_a + 8.
  const int wg = warp / 4, wq = warp % 4, g = lane >> 2, t = lane & 3;
  int kv_iter = 0, q_iter = 0;
  for (int k = 0;; ++k) {
    const TileCoords tc = cta_tile(tile_order(), k, tiles, key_tiles, a.heads, batch * a.heads, packed);
    if (tc.bh < 0) break;
    const int bh = tc.bh, key0 = tc.block * kKeys, b = bh / a.heads, h = bh % a.heads;
    const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
    const int len = rows.len;  // keys and queries at or past it are another sequence's or none
    const int64_t seq_row0 = rows.first;
    const int row_in_tile = wg * 64 + wq * 16;
    const int key_a = key0 + row_in_tile + g, key_b = key_a + 8;
    T* dk_dst = static_cast<T*>(a.dqkv) + seq_row0 * 3 * H + H + h * D + 2 * t;
    T* dv_dst = dk_dst + H;

    if (key0 >= rows.keys) {  // no query attends to these keys: dK = dV = 0 (packed: none are this sequence's)
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        if (key_a < len) {
          *reinterpret_cast<uint32_t*>(dk_dst + int64_t(key_a) * 3 * H + dt * 8) = 0u;
          *reinterpret_cast<uint32_t*>(dv_dst + int64_t(key_a) * 3 * H + dt * 8) = 0u;
        }
        if (key_b < len) {
          *reinterpret_cast<uint32_t*>(dk_dst + int64_t(key_b) * 3 * H + dt * 8) = 0u;
          *reinterpret_cast<uint32_t*>(dv_dst + int64_t(key_b) * 3 * H + dt * 8) = 0u;
        }
      }
      continue;
    }

    // The keys' kinds (key_kind_of): both mask loads are issued (at indices clamped into the
    // row) before either is tested, and before the wait for K and V, so that their latency
    // passes during it. Tested one after the other, each load's latency was a stall of its
    // own (ncu: 3.5% of the kernel's warp samples).
    int live_a = 1, live_b = 1;
    if (!a.row_start) {
      const int32_t* mask_row = a.mask + seq_row0;
      live_a = mask_row[min(key_a, S - 1)];
      live_b = mask_row[min(key_b, S - 1)];
    }
    const int kind_a = key_kind_of(live_a, key_a, len), kind_b = key_kind_of(live_b, key_b, len);
    const int buf = kv_iter % kKVBuffers;
    mbar_wait(kv_full + buf, (kv_iter++ / kKVBuffers) & 1);
    const unsigned char* k_s = sK + buf * KeyTile::kBytes;
    const unsigned char* v_s = sV + buf * KeyTile::kBytes;
    const int bit_word = (row_in_tile + g) >> 5, bit_a = (row_in_tile + g) & 31;  // key_b: bit_a + 8, same word
    float dk[D / 2], dv[D / 2];  // per panel of kCols columns, its kCols / 2 accumulators
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;

    // This warp's K and V fragments (head sizes 32 and 64): read before the tile's first
    // block and again while each block's last products run, for the next. Kept across the
    // whole loop they would be 32 registers more than the consumers have in the
    // elementwise pass; read at each block's start, the products waited for them.
    uint32_t kf[D / 16][4], vf[D / 16][4];
    const auto load_key_fragments = [&] {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int r = row_in_tile + (lane & 15), c = kk * 2 + (lane >> 4);
        ldmatrix_x4(kf[kk], k_s + KeyTile::chunk(r, c));
        ldmatrix_x4(vf[kk], v_s + KeyTile::chunk(r, c));
      }
    };
    if constexpr (!L::kWide) load_key_fragments();

    const BlockRange walk = query_walk(a, rows, key0);
    for (int qb = walk.lo; qb < walk.hi; ++qb, ++q_iter) {
      const int stage = q_iter % kStages;
      mbar_wait(q_full + stage, (q_iter / kStages) & 1);
      const unsigned char* q_s = sQ + stage * QueryTile::kBytes;
      const unsigned char* o_s = sO + stage * QueryTile::kBytes;
      const float2* stats = sStats + stage * kQueries;
      const float* dots = sDot + stage * kQueries;
      const uint32_t* bits = sBits + stage * kQueries * 4;  // [query][4 words of the tile's keys]
      unsigned char* ds_s = sDS + (2 * wg + (q_iter & 1)) * kDsBytes;

      float s[32], dp[32];  // S^T = K Q^T and dP^T = V dO^T: 64 keys x 64 queries, tiles of 8 queries
      if constexpr (L::kWide) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          wgmma_m64n64k16_ss<T, false, false>(s, KeyTile::k_major(k_s, wg * 64, kk), QueryTile::k_major(q_s, 0, kk),
                                              kk > 0);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          wgmma_m64n64k16_ss<T, false, false>(dp, KeyTile::k_major(v_s, wg * 64, kk), QueryTile::k_major(o_s, 0, kk),
                                              kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
      } else {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          wgmma_m64n64k16_rs<T, false>(s, kf[kk], QueryTile::k_major(q_s, 0, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          wgmma_m64n64k16_rs<T, false>(dp, vf[kk], QueryTile::k_major(o_s, 0, kk), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(kf);
        fence_registers(vf);
      }
      fence_registers(s);
      fence_registers(dp);

      // s becomes P'^T (for dV), dp becomes dS^T (for dK, and through shared memory for dQ).
      // This warp's 16 keys against the block's queries (the test per element is per warp).
      const bool edge = crosses_window(a.window, key0 + row_in_tile, key0 + row_in_tile + 15, qb * kQueries,
                                       qb * kQueries + kQueries - 1);
      const GradTile gt{a.scale_log2, a.keep_scale, a.window, kind_a, kind_b, key_a, qb * kQueries, stats, dots,
                        bits + bit_word, bit_a, ds_s, wq * 16 + g, t};
      constexpr bool kStoresLast = !L::kWide;
      if (edge)
        dropping ? block_grads<T, true, true, kStoresLast>(s, dp, gt)
                 : block_grads<T, false, true, kStoresLast>(s, dp, gt);
      else
        dropping ? block_grads<T, true, false, kStoresLast>(s, dp, gt)
                 : block_grads<T, false, false, kStoresLast>(s, dp, gt);

      // dV += P'^T dO and dK += dS^T Q: the accumulator tiles, two by two, are A fragments of 16 queries.
      uint32_t pa[kQueries / 16][4], da[kQueries / 16][4];
#pragma unroll
      for (int qc = 0; qc < kQueries / 16; ++qc) {
        pa[qc][0] = pack<T>(s[8 * qc + 0], s[8 * qc + 1]);
        pa[qc][1] = pack<T>(s[8 * qc + 2], s[8 * qc + 3]);
        pa[qc][2] = pack<T>(s[8 * qc + 4], s[8 * qc + 5]);
        pa[qc][3] = pack<T>(s[8 * qc + 6], s[8 * qc + 7]);
        da[qc][0] = pack<T>(dp[8 * qc + 0], dp[8 * qc + 1]);
        da[qc][1] = pack<T>(dp[8 * qc + 2], dp[8 * qc + 3]);
        da[qc][2] = pack<T>(dp[8 * qc + 4], dp[8 * qc + 5]);
        da[qc][3] = pack<T>(dp[8 * qc + 6], dp[8 * qc + 7]);
      }
      // dQ_part (64 queries x D) = dS K over this warpgroup's keys reads all of its dS^T; at
      // head size 128 a warpgroup's 64 columns of dQ over the tile's keys read both's.
      fence_async_shared();
      if constexpr (L::kWide)
        named_barrier(1, 256);
      else
        named_barrier(1 + wg, 128);
      fence_registers(dv);
      fence_registers(dk);
      wgmma_fence();
      const auto issue_dv_dk = [&] {
#pragma unroll
        for (int qc = 0; qc < kQueries / 16; ++qc)
#pragma unroll
          for (int p = 0; p < kPanels; ++p)
            wgmma_panel_rs<T, kCols, true>(dv + p * kCols / 2, pa[qc], QueryTile::mn_major(o_s, p, qc * 16), true);
#pragma unroll
        for (int qc = 0; qc < kQueries / 16; ++qc)
#pragma unroll
          for (int p = 0; p < kPanels; ++p)
            wgmma_panel_rs<T, kCols, true>(dk + p * kCols / 2, da[qc], QueryTile::mn_major(q_s, p, qc * 16), true);
      };
      const auto fence_dv_dk = [&] {  // after the wait for dV and dK's products
        fence_registers(pa);
        fence_registers(da);
        fence_registers(dv);
        fence_registers(dk);
      };
      const auto release_stage = [&] {  // dV and dK's products read its Q and dO
        __syncwarp();
        if (lane == 0) mbar_arrive(q_empty + stage);
      };
      if constexpr (L::kWide) {
        // Warpgroup wg takes dQ's panel wg (64 columns) over all 128 keys of the tile, from
        // both warpgroups' dS^T: one reduction per element and tile, and 32 accumulators.
        // Its product goes first, a group of its own, so that its reductions are issued
        // while dV and dK's products run: 7% at head size 128 (A/B on an H200, 2026-11-30);
        // the same order at head sizes 32 and 64 gained nothing beside the early K and V.
        float dq[32];
#pragma unroll
        for (int kc = 0; kc < kKeys / 16; ++kc) {
          const unsigned char* ds = sDS + (2 * (kc / 4) + (q_iter & 1)) * kDsBytes + (kc % 4) * 16 * 128;
          wgmma_m64n64k16_ss<T, true, true>(dq, smem_descriptor(ds), KeyTile::mn_major(k_s, wg, kc * 16), kc > 0);
        }
        wgmma_commit();
        issue_dv_dk();
        wgmma_commit();
        wgmma_wait<1>();
        fence_registers(dq);
        // Adds dq, columns 64 wg .. 64 wg + 63, to the F32 accumulator: a row's reductions
        // from one address and its offsets. With the row test and the address computed per
        // reduction, each address register waited for the previous reduction to read it.
        const int qa = qb * kQueries + wq * 16 + g, qz = qa + 8;  // dQ rows are queries
        float* acc = a.dq_accum + seq_row0 * H + h * D + wg * 64 + 2 * t;
        if (qa < len) {
#pragma unroll
          for (int dt = 0; dt < 8; ++dt) red_add_f32x2(acc + int64_t(qa) * H + dt * 8, dq[4 * dt], dq[4 * dt + 1]);
        }
        if (qz < len) {
#pragma unroll
          for (int dt = 0; dt < 8; ++dt) red_add_f32x2(acc + int64_t(qz) * H + dt * 8, dq[4 * dt + 2], dq[4 * dt + 3]);
        }
        wgmma_wait<0>();
        fence_dv_dk();
        release_stage();
      } else {
        // dQ_part = dS K over the group's 64 keys, issued behind dV and dK's; the next
        // block's K and V fragments are read while the three run.
        float dq[D / 2];
        issue_dv_dk();
#pragma unroll
        for (int kc = 0; kc < 64 / 16; ++kc)
          wgmma_panel_ss<T, kCols, true, true>(dq, smem_descriptor(ds_s + kc * 16 * 128),
                                               KeyTile::mn_major(k_s, 0, wg * 64 + kc * 16), kc > 0);
        wgmma_commit();
        if (qb + 1 < walk.hi) load_key_fragments();
        wgmma_wait<0>();
        fence_dv_dk();
        fence_registers(dq);
        // Both warpgroups' dQ parts are of the same 64 queries (over their own keys), in the
        // same fragment layout: each writes its part to shared memory, and the producer
        // warpgroup's three other warps add the two and reduce the sum into the F32
        // accumulator (reduce_dq_parts), one reduction per element and tile. Done here, one
        // warpgroup waited at a barrier for the other's part every block and then issued
        // the reductions itself (ncu: a quarter of the consumers' warp samples).
        mbar_wait(parts_empty + stage, ((q_iter / kStages) & 1) ^ 1);
        unsigned char* part = smem + L::kPart + (stage * 2 + wg) * kQueries * D * 4;
        const int row = wq * 16 + g;  // and row + 8
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const uint32_t off = dq_part_offset<D>(row, dt * 8 + 2 * t);
          *reinterpret_cast<float2*>(part + off) = make_float2(dq[4 * dt], dq[4 * dt + 1]);
          *reinterpret_cast<float2*>(part + off + 8 * D * 4) = make_float2(dq[4 * dt + 2], dq[4 * dt + 3]);
        }
        mbar_arrive(parts_full + stage);
        release_stage();
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(kv_empty + buf);

    // Keys past the sequence are not written; masked keys come out exactly 0 (P = 0).
    if constexpr (!L::kWide) {
      // Through the group's two dS^T buffers (dK's rows, then dV's, in their swizzled layout):
      // each thread then stores whole 16-byte chunks of rows, four times fewer stores than
      // from the fragments, in full 128-byte rows. Stored from the fragments, the stores
      // filled the memory queue at every tile's end and the next tile's first instructions
      // waited for them (ncu: 12.7% of the kernel's warp samples at the tile's end and start).
      // The first barrier: every warp of the group is past its last dQ product, which read
      // the buffers; the last: every warp has read them before the next tile's dS^T.
      unsigned char* staged = sDS + 2 * wg * kDsBytes;
      named_barrier(1 + wg, 128);
      const int row = wq * 16 + g;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const uint32_t at = swizzled(row, dt) + 4 * t, below = swizzled(row + 8, dt) + 4 * t;
        *reinterpret_cast<uint32_t*>(staged + at) = pack<T>(dk[4 * dt] * a.scale, dk[4 * dt + 1] * a.scale);
        *reinterpret_cast<uint32_t*>(staged + below) = pack<T>(dk[4 * dt + 2] * a.scale, dk[4 * dt + 3] * a.scale);
        *reinterpret_cast<uint32_t*>(staged + kDsBytes + at) = pack<T>(dv[4 * dt], dv[4 * dt + 1]);
        *reinterpret_cast<uint32_t*>(staged + kDsBytes + below) = pack<T>(dv[4 * dt + 2], dv[4 * dt + 3]);
      }
      named_barrier(1 + wg, 128);
      constexpr int kChunks = D / 8;  // 16-byte chunks a row of dK
      T* dk_rows = static_cast<T*>(a.dqkv) + seq_row0 * 3 * H + H + h * D;
#pragma unroll
      for (int i = threadIdx.x & 127; i < 64 * kChunks; i += 128) {
        const int r = i / kChunks, c = i % kChunks, key = key0 + wg * 64 + r;
        if (key < len) {
          T* to = dk_rows + int64_t(key) * 3 * H + c * 8;
          *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(staged + swizzled(r, c));
          *reinterpret_cast<uint4*>(to + H) = *reinterpret_cast<const uint4*>(staged + kDsBytes + swizzled(r, c));
        }
      }
      named_barrier(1 + wg, 128);
    } else {  // head size 128: both groups read both dS^T buffers; stored from the fragments
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        if (key_a < len) {
          *reinterpret_cast<uint32_t*>(dk_dst + int64_t(key_a) * 3 * H + dt * 8) =
              pack<T>(dk[4 * dt] * a.scale, dk[4 * dt + 1] * a.scale);
          *reinterpret_cast<uint32_t*>(dv_dst + int64_t(key_a) * 3 * H + dt * 8) = pack<T>(dv[4 * dt], dv[4 * dt + 1]);
        }
        if (key_b < len) {
          *reinterpret_cast<uint32_t*>(dk_dst + int64_t(key_b) * 3 * H + dt * 8) =
              pack<T>(dk[4 * dt + 2] * a.scale, dk[4 * dt + 3] * a.scale);
          *reinterpret_cast<uint32_t*>(dv_dst + int64_t(key_b) * 3 * H + dt * 8) =
              pack<T>(dv[4 * dt + 2], dv[4 * dt + 3]);
        }
      }
    }
  }
#else
  __trap();  // picked only where hopper_kernels_present() says this image has the body
#endif
}

}  // namespace

template <typename T, int D>
void launch_hopper_backward(const BackwardArgs& a, const CUtensorMap& qkv_map, const CUtensorMap& dctx_map,
                            const CUtensorMap& bits_map, int batch, int sms, cudaStream_t stream) {
  constexpr size_t kBytes = BwdSmem<D>::kBytes;
  static const bool smem_opted_in = [] {  // once per kernel; above 48 KiB needs the opt-in
    HONE_CUDA_CHECK(cudaFuncSetAttribute(hopper_backward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(kBytes)));
    return true;
  }();
  (void)smem_opted_in;
  const int tiles = (a.seq + kKeys - 1) / kKeys * batch * a.heads;
  hopper_backward_kernel<T, D>
      <<<std::min(tiles, sms), kThreadsBwd, kBytes, stream>>>(qkv_map, dctx_map, bits_map, a, batch);
  HONE_CUDA_LAUNCH_CHECK();
}

#define HONE_HOPPER_BACKWARD(T, D)                                                                                  \
  template void launch_hopper_backward<T, D>(const BackwardArgs&, const CUtensorMap&, const CUtensorMap&,          \
                                             const CUtensorMap&, int, int, cudaStream_t);
HONE_HOPPER_BACKWARD(__nv_bfloat16, 32)
HONE_HOPPER_BACKWARD(__nv_bfloat16, 64)
HONE_HOPPER_BACKWARD(__nv_bfloat16, 128)
HONE_HOPPER_BACKWARD(__half, 32)
HONE_HOPPER_BACKWARD(__half, 64)
HONE_HOPPER_BACKWARD(__half, 128)
#undef HONE_HOPPER_BACKWARD

}  // namespace hone::cuda::flash
