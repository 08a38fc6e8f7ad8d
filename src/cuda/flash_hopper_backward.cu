// Flash attention backward for Hopper (FlashAttention-3's structure), head size 64: a
// persistent kernel, one CTA per SM, of two consumer warpgroups and a producer warpgroup
// (one warp of it works). A tile is 128 keys of one (sequence, head), 64 per consumer
// warpgroup; the producer streams K and V once per tile and then every query block (64
// queries: Q, dO through TMA, the forward's {max, 1 / sum} and D = rowsum(dO * O) through
// plain loads) through a ring of 128-byte-swizzled stages. Per query block a consumer
// warpgroup issues, as warpgroup MMAs with its K and V fragments in registers:
//   S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries),
//   dV += P'^T dO and dK += dS^T Q (P' the dropped P, dS^T = P^T (dP^T - D)),
//   dQ_part = dS K over its 64 keys (dS^T through shared memory),
// and one warpgroup, alternating by block, adds both parts to the F32 accumulator with
// vector reductions. Dropout reads the keep bits drawn beforehand (keep_bits_kernel)
// through the query stages. Padded queries are computed (P = 0 past the sequence; a
// packed sequence has none, and its tiles' rows past it, another sequence's, get P = 0);
// key tiles past the sequence's last attended key only write their zero gradients. With
// a window, producer and consumers walk only the query blocks within it of the tile's
// keys, and the blocks that cross its edge give the elements outside it no weight. Same
// arguments and results as flash_backward.cu.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/flash_hopper.h"
#include "cuda/hopper.h"

namespace hone::cuda::flash {

namespace {

using namespace hopper;

constexpr int kD = 64;
constexpr int kConsumers = 2;                          // warpgroups of 64 keys
constexpr int kKeys = 64 * kConsumers;                 // keys per tile
constexpr int kQueries = 64;                           // queries per block
constexpr int kStages = 2;                             // query blocks in flight
constexpr int kThreadsBwd = 128 * (kConsumers + 1);    // + the producer warpgroup
constexpr int kBox = 64 * kD * 2;                      // one swizzled [64][64] half tile

// The query blocks that key tile key0 of a sequence is weighed by (window_blocks); the
// producer and the consumers walk the same ones.
__device__ __forceinline__ BlockRange query_walk(const BackwardArgs& a, const SequenceRows& rows, int key0) {
  return window_blocks(a.window, key0, min(key0 + kKeys, rows.len) - 1, kQueries, (rows.len + kQueries - 1) / kQueries);
}

struct BwdSmem {
  // Per K/V buffer (two: the next tile's load overlaps this one) K and V of 128 keys; per
  // stage Q and dO of 64 queries; per consumer warpgroup two dS^T [64 keys][64 queries],
  // used in turns, so that a warp writing the next block's dS^T never overwrites rows that
  // a slower warp's part of the last dQ product may still read.
  static constexpr size_t kK = 0;                                       // [2][128][64]
  static constexpr size_t kV = kK + 2 * size_t(2 * kBox);               // [2][128][64]
  static constexpr size_t kQ = kV + 2 * size_t(2 * kBox);               // [kStages][64][64]
  static constexpr size_t kO = kQ + size_t(kStages) * kBox;             // [kStages][64][64]
  static constexpr size_t kDS = kO + size_t(kStages) * kBox;            // [kConsumers][2][64][64]
  static constexpr size_t kStats = kDS + size_t(2 * kConsumers) * kBox;  // [kStages][64] float2
  static constexpr size_t kDot = kStats + size_t(kStages) * kQueries * 8;  // [kStages][64] F32
  static constexpr size_t kBits = kDot + size_t(kStages) * kQueries * 4;  // [kStages][64][4] U32, 128-aligned
  // Per stage, one warpgroup's dQ part for the other: [kStages][8][128] float4.
  static constexpr size_t kPart = kBits + size_t(kStages) * kQueries * 16;
  static constexpr size_t kBars = kPart + size_t(kStages) * 8 * 128 * 16;
  static constexpr size_t kBytes = kBars + (4 + 2 * kStages) * 8 + 1024;  // + alignment slack
};

template <typename T>
__global__ void __launch_bounds__(kThreadsBwd, 1)
    hopper_backward_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dctx_map,
                           const __grid_constant__ CUtensorMap bits_map, BackwardArgs a, int batch) {
#ifdef HONE_HOPPER_IMAGE
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  unsigned char* sK = smem + BwdSmem::kK;
  unsigned char* sV = smem + BwdSmem::kV;
  unsigned char* sQ = smem + BwdSmem::kQ;
  unsigned char* sO = smem + BwdSmem::kO;
  unsigned char* sDS = smem + BwdSmem::kDS;
  float2* sStats = reinterpret_cast<float2*>(smem + BwdSmem::kStats);
  float* sDot = reinterpret_cast<float*>(smem + BwdSmem::kDot);
  const uint32_t* sBits = reinterpret_cast<const uint32_t*>(smem + BwdSmem::kBits);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + BwdSmem::kBars);
  uint64_t* kv_full = bars;       // [2]: K and V of a tile landed
  uint64_t* kv_empty = bars + 2;  // [2]: every consumer warp is done with the tile
  uint64_t* q_full = bars + 4;    // [kStages]: Q, dO landed, stats and D written
  uint64_t* q_empty = bars + 4 + kStages;  // [kStages]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kConsumerWarps = 4 * kConsumers;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) {
      mbar_init(kv_full + i, 1);
      mbar_init(kv_empty + i, kConsumerWarps);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full + s, 32);
      mbar_init(q_empty + s, kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int S = a.seq, H = a.heads * kD;
  const int key_tiles = (S + kKeys - 1) / kKeys;
  const int tiles = key_tiles * batch * a.heads;
  const bool dropping = a.drop.p > 0.0f;

  if (warp >= kConsumerWarps) {  // the producer warpgroup: its first warp loads, the others leave
    registers_decrease<40>();
    if (warp != kConsumerWarps) return;
    int kv_iter = 0, q_iter = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const TileCoords tc = tile_coords(tile, key_tiles, batch * a.heads, a.row_start != nullptr);
      const int bh = tc.bh, key0 = tc.block * kKeys, b = bh / a.heads, h = bh % a.heads;
      const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
      if (key0 >= rows.keys) continue;
      const BlockRange walk = query_walk(a, rows, key0);
      const int row0 = int(rows.first);
      const int buf = kv_iter & 1;
      mbar_wait(kv_empty + buf, ((kv_iter++ >> 1) & 1) ^ 1);
      if (lane == 0) {
        mbar_arrive_expect_tx(kv_full + buf, 4 * kBox);
        for (int half = 0; half < 2; ++half) {
          tma_load_2d(sK + buf * 2 * kBox + half * kBox, &qkv_map, H + h * kD, row0 + key0 + half * 64, kv_full + buf);
          tma_load_2d(sV + buf * 2 * kBox + half * kBox, &qkv_map, 2 * H + h * kD, row0 + key0 + half * 64,
                      kv_full + buf);
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
          mbar_arrive_expect_tx(q_full + stage, 2 * kBox + (dropping ? kQueries * 16 : 0));
          tma_load_2d(sQ + stage * kBox, &qkv_map, h * kD, row0 + qb * kQueries, q_full + stage);
          tma_load_2d(sO + stage * kBox, &dctx_map, h * kD, row0 + qb * kQueries, q_full + stage);
          if (dropping)
            tma_load_2d(smem + BwdSmem::kBits + stage * kQueries * 16, &bits_map, key0 / 32, bh * S + qb * kQueries,
                        q_full + stage);
        } else {
          mbar_arrive(q_full + stage);
        }
      }
    }
    return;
  }

  registers_increase<232>();  // 128 x 40 + 256 x 232 <= 64 Ki registers
  // A consumer: warpgroup wg owns keys 64 wg .. 64 wg + 63 of the tile; its warp wq rows
  // 16 wq .. 16 wq + 15 of them, this lane keys key_a and key_a + 8.
  const int wg = warp / 4, wq = warp % 4, g = lane >> 2, t = lane & 3;
  int kv_iter = 0, q_iter = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const TileCoords tc = tile_coords(tile, key_tiles, batch * a.heads, a.row_start != nullptr);
    const int bh = tc.bh, key0 = tc.block * kKeys, b = bh / a.heads, h = bh % a.heads;
    const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
    const int len = rows.len;  // keys and queries at or past it are another sequence's or none
    const int64_t seq_row0 = rows.first;
    const int row_in_tile = wg * 64 + wq * 16;
    const int key_a = key0 + row_in_tile + g, key_b = key_a + 8;
    T* dk_dst = static_cast<T*>(a.dqkv) + seq_row0 * 3 * H + H + h * kD + 2 * t;
    T* dv_dst = dk_dst + H;

    if (key0 >= rows.keys) {  // no query attends to these keys: dK = dV = 0 (packed: none are this sequence's)
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
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

    const int buf = kv_iter & 1;
    mbar_wait(kv_full + buf, (kv_iter++ >> 1) & 1);
    const unsigned char* k_s = sK + buf * 2 * kBox;
    const unsigned char* v_s = sV + buf * 2 * kBox;
    const int32_t* mask_row = a.row_start ? nullptr : a.mask + seq_row0;
    const int kind_a = key_kind(mask_row, key_a, len), kind_b = key_kind(mask_row, key_b, len);
    const int bit_word = (row_in_tile + g) >> 5, bit_a = (row_in_tile + g) & 31;  // key_b: bit_a + 8, same word
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dk[i] = dv[i] = 0.0f;

    const BlockRange walk = query_walk(a, rows, key0);
    for (int qb = walk.lo; qb < walk.hi; ++qb, ++q_iter) {
      const int stage = q_iter % kStages;
      mbar_wait(q_full + stage, (q_iter / kStages) & 1);
      const unsigned char* q_s = sQ + stage * kBox;
      const unsigned char* o_s = sO + stage * kBox;
      const float2* stats = sStats + stage * kQueries;
      const float* dots = sDot + stage * kQueries;
      const uint32_t* bits = sBits + stage * kQueries * 4;  // [query][4 words of the tile's keys]
      unsigned char* ds_s = sDS + (2 * wg + (q_iter & 1)) * kBox;

      // This warp's K and V fragments, read again per block: kept across the loop, they
      // would be 32 registers more than the consumers have.
      uint32_t kf[kD / 16][4], vf[kD / 16][4];
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int r = row_in_tile + (lane & 15);
        ldmatrix_x4(kf[kk], k_s + swizzled(r, kk * 2 + (lane >> 4)));
        ldmatrix_x4(vf[kk], v_s + swizzled(r, kk * 2 + (lane >> 4)));
      }
      float s[32], dp[32];  // S^T = K Q^T and dP^T = V dO^T: 64 keys x 64 queries, tiles of 8 queries
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) wgmma_m64n64k16_rs<T, false>(s, kf[kk], smem_descriptor(q_s + kk * 32), kk > 0);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        wgmma_m64n64k16_rs<T, false>(dp, vf[kk], smem_descriptor(o_s + kk * 32), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(kf);
      fence_registers(vf);
      fence_registers(s);
      fence_registers(dp);

      // s becomes P'^T (for dV), dp becomes dS^T (for dK, and through shared memory for dQ).
      // This warp's 16 keys against the block's queries (the test per element is per warp).
      const bool edge = crosses_window(a.window, key0 + row_in_tile, key0 + row_in_tile + 15, qb * kQueries,
                                       qb * kQueries + kQueries - 1);
#pragma unroll
      for (int nt = 0; nt < kQueries / 8; ++nt) {
        const int qc = nt * 8 + 2 * t;
        const float4 st = *reinterpret_cast<const float4*>(stats + qc);  // queries qc and qc + 1
        const float2 dot = *reinterpret_cast<const float2*>(dots + qc);
        uint32_t w0 = 0, w1 = 0;
        if (dropping) w0 = bits[qc * 4 + bit_word] >> bit_a, w1 = bits[(qc + 1) * 4 + bit_word] >> bit_a;
        backward_tile(*reinterpret_cast<float(*)[4]>(s + 4 * nt), *reinterpret_cast<float(*)[4]>(dp + 4 * nt), kind_a,
                      kind_b, a.scale_log2, st, dot, dropping, w0, w1, a.keep_scale,
                      edge ? outside_bits(a.window, key_a, qb * kQueries + qc) : 0u);
        const int r = wq * 16 + g;  // dS^T rows are keys, 128-byte swizzled, 2 queries a word
        *reinterpret_cast<uint32_t*>(ds_s + swizzled(r, nt) + 4 * t) = pack<T>(dp[4 * nt], dp[4 * nt + 1]);
        *reinterpret_cast<uint32_t*>(ds_s + swizzled(r + 8, nt) + 4 * t) = pack<T>(dp[4 * nt + 2], dp[4 * nt + 3]);
      }

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
      // dQ_part (64 queries x 64) = dS K over this warpgroup's keys reads all of its dS^T.
      fence_async_shared();
      named_barrier(1 + wg, 128);
      float dq[32];
      fence_registers(dv);
      fence_registers(dk);
      wgmma_fence();
#pragma unroll
      for (int qc = 0; qc < kQueries / 16; ++qc)
        wgmma_m64n64k16_rs<T, true>(dv, pa[qc], smem_descriptor(o_s + qc * 16 * 128), true);
#pragma unroll
      for (int qc = 0; qc < kQueries / 16; ++qc)
        wgmma_m64n64k16_rs<T, true>(dk, da[qc], smem_descriptor(q_s + qc * 16 * 128), true);
#pragma unroll
      for (int kc = 0; kc < 64 / 16; ++kc)
        wgmma_m64n64k16_ss<T, true, true>(dq, smem_descriptor(ds_s + kc * 16 * 128),
                                          smem_descriptor(k_s + (wg * 64 + kc * 16) * 128), kc > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(pa);
      fence_registers(da);
      fence_registers(dv);
      fence_registers(dk);
      fence_registers(dq);
      // Both warpgroups' dQ parts are of the same 64 queries (over their own keys), in the
      // same fragment layout: one warpgroup, alternating by block, adds the other's part
      // from shared memory and reduces the sum into the F32 accumulator, half the global
      // reductions (which cost 0.07 of the 0.51 ms at bert-large's shape). The part goes
      // through the block's stage's buffer, and the adder reads it before it releases the
      // stage: the other warpgroup writes that buffer again only for a block of the stage's
      // next round, which the producer loads after the release, so never while it is read.
      const bool adds = wg == (q_iter & 1);
      float4* part = reinterpret_cast<float4*>(smem + BwdSmem::kPart) + stage * 8 * 128 + (threadIdx.x & 127);
      if (!adds) {
#pragma unroll
        for (int j = 0; j < 8; ++j) part[j * 128] = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        named_barrier_arrive(3 + stage, 256);
      } else {
        named_barrier(3 + stage, 256);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 o = part[j * 128];
          dq[4 * j] += o.x, dq[4 * j + 1] += o.y, dq[4 * j + 2] += o.z, dq[4 * j + 3] += o.w;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(q_empty + stage);

      if (adds) {
        const int qa = qb * kQueries + wq * 16 + g, qz = qa + 8;  // dQ rows are queries
        float* acc = a.dq_accum + seq_row0 * H + h * kD + 2 * t;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          if (qa < len) red_add_f32x2(acc + int64_t(qa) * H + dt * 8, dq[4 * dt], dq[4 * dt + 1]);
          if (qz < len) red_add_f32x2(acc + int64_t(qz) * H + dt * 8, dq[4 * dt + 2], dq[4 * dt + 3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(kv_empty + buf);

    // Keys past the sequence are not written; masked keys come out exactly 0 (P = 0).
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
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
#else
  __trap();  // picked only where hopper_kernels_present() says this image has the body
#endif
}

}  // namespace

template <typename T>
void launch_hopper_backward(const BackwardArgs& a, const CUtensorMap& qkv_map, const CUtensorMap& dctx_map,
                            const CUtensorMap& bits_map, int batch, int sms, cudaStream_t stream) {
  static const bool smem_opted_in = [] {  // once per kernel; above 48 KiB needs the opt-in
    HONE_CUDA_CHECK(cudaFuncSetAttribute(hopper_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(BwdSmem::kBytes)));
    return true;
  }();
  (void)smem_opted_in;
  const int tiles = (a.seq + kKeys - 1) / kKeys * batch * a.heads;
  hopper_backward_kernel<T>
      <<<std::min(tiles, sms), kThreadsBwd, BwdSmem::kBytes, stream>>>(qkv_map, dctx_map, bits_map, a, batch);
  HONE_CUDA_LAUNCH_CHECK();
}

template void launch_hopper_backward<__nv_bfloat16>(const BackwardArgs&, const CUtensorMap&, const CUtensorMap&,
                                                     const CUtensorMap&, int, int, cudaStream_t);
template void launch_hopper_backward<__half>(const BackwardArgs&, const CUtensorMap&, const CUtensorMap&,
                                             const CUtensorMap&, int, int, cudaStream_t);

}  // namespace hone::cuda::flash
