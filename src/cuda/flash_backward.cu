// Flash attention backward (FlashAttention-2's): a CTA of four warps takes 64 keys of one
// (sequence, head), 16 per warp, and walks every query tile (padded queries too: their
// rows are computed, as in the forward; a packed sequence has none). Per tile each warp
// recomputes S^T = K Q^T for its keys, P^T from the forward's {max, 1 / sum}, dP^T = V dO^T
// and dS^T = P^T (dP^T - D), and accumulates dV += P'^T dO and dK += dS^T Q in registers
// (P' the dropped P). dS goes through shared memory so that the CTA can add its share of
// dQ = dS K to an F32 accumulator with atomics. Key tiles past the sequence's last
// attended key only write their zero gradients. With a window, only the query tiles that
// hold a query within it of one of the CTA's keys are walked, and the tiles that cross its
// edge give the elements outside it no weight.
#include <type_traits>

#include "cuda/check.h"
#include "cuda/flash_kernels.h"

namespace hone::cuda::flash {

namespace {

template <int D>
struct BackwardShape {
  static constexpr int kKeys = 16 * kWarps;        // keys per CTA
  static constexpr int kRows = D == 128 ? 32 : 64;  // queries per tile (registers bound it at D = 128)
  static constexpr int kLd = D + 8;                 // shared row stride of K, V, Q, dO
  static constexpr int kLdS = kRows + 8;            // shared row stride of dS^T
  static constexpr size_t kSmemBytes =
      size_t(2 * kKeys + 4 * kRows) * kLd * 2 + size_t(kKeys) * kLdS * 2 + 2 * kRows * (sizeof(float2) + sizeof(float));
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) backward_kernel(BackwardArgs a) {
  using Shape = BackwardShape<D>;
  constexpr int Bc = Shape::kKeys, Br = Shape::kRows, LD = Shape::kLd, LDS = Shape::kLdS;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);  // [Bc][LD]
  T* sV = sK + Bc * LD;                 // [Bc][LD]
  T* sQ = sV + Bc * LD;                 // [2][Br][LD]
  T* sO = sQ + 2 * Br * LD;             // [2][Br][LD]: dO
  T* sDS = sO + 2 * Br * LD;            // [Bc][LDS]: dS^T, keys by queries
  float2* sStats = reinterpret_cast<float2*>(sDS + Bc * LDS);  // [2][Br]: {max, 1 / sum} of each query
  float* sDot = reinterpret_cast<float*>(sStats + 2 * Br);      // [2][Br]: D of each query

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int S = a.seq, H = a.heads * D;
  const int64_t ld = 3 * int64_t(H);
  const int bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, key0 = blockIdx.x * Bc;
  const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
  const int len = rows.len;  // keys and queries at or past it are another sequence's or none
  const int64_t seq_row0 = rows.first;
  const T* q_src = static_cast<const T*>(a.qkv) + seq_row0 * ld + h * D;
  const T* do_src = static_cast<const T*>(a.dctx) + seq_row0 * H + h * D;
  T* dk_dst = static_cast<T*>(a.dqkv) + seq_row0 * ld + H + h * D;
  T* dv_dst = dk_dst + H;

  if (key0 >= rows.keys) {  // no query attends to these keys: dK = dV = 0 (packed: none are this sequence's)
    for (int c = threadIdx.x; c < Bc * (D / 8); c += kThreads) {
      const int r = c / (D / 8), k = c % (D / 8);
      if (key0 + r >= len) break;
      *reinterpret_cast<int4*>(dk_dst + int64_t(key0 + r) * ld + k * 8) = make_int4(0, 0, 0, 0);
      *reinterpret_cast<int4*>(dv_dst + int64_t(key0 + r) * ld + k * 8) = make_int4(0, 0, 0, 0);
    }
    return;
  }

  const int q_tiles = (len + Br - 1) / Br;
  const BlockRange walk = window_blocks(a.window, key0, min(key0 + Bc, len) - 1, Br, q_tiles);
  const auto load_queries = [&](int tile) {
    const int buf = tile & 1;
    load_rows_async<T, D>(sQ + buf * Br * LD, LD, q_src, ld, tile * Br, Br, len);
    load_rows_async<T, D>(sO + buf * Br * LD, LD, do_src, H, tile * Br, Br, len);
    cp_async_commit();
    for (int i = threadIdx.x; i < Br; i += kThreads) {
      const int q = tile * Br + i;
      const bool valid = q < len;  // a query past the sequence gets P = 0 (max = +inf) and D = 0
      sStats[buf * Br + i] = valid ? a.stats[int64_t(bh) * S + q] : make_float2(INFINITY, 0.0f);
      sDot[buf * Br + i] = valid ? a.row_dot[int64_t(bh) * S + q] : 0.0f;
    }
  };
  load_rows_async<T, D>(sK, LD, q_src + H, ld, key0, Bc, len);
  load_rows_async<T, D>(sV, LD, q_src + 2 * H, ld, key0, Bc, len);
  load_queries(walk.lo);

  const int key_a = key0 + warp * 16 + g, key_b = key_a + 8;  // this lane's two keys
  const int32_t* mask_row = a.row_start ? nullptr : a.mask + seq_row0;
  const int kind_a = key_kind(mask_row, key_a, len), kind_b = key_kind(mask_row, key_b, len);
  const float bias_a = kind_bias(kind_a), bias_b = kind_bias(kind_b);
  const bool dropping = a.drop.p > 0.0f;
  const int keep_word = key_a >> 5, keep_bit = key_a & 31;  // key_b's bit is 8 higher, in the same word
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};

  for (int tile = walk.lo; tile < walk.hi; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // the tile is in; every warp is done with the previous tile's buffers and dS
    if (tile + 1 < walk.hi) load_queries(tile + 1);
    const T* q_s = sQ + (tile & 1) * Br * LD;
    const T* o_s = sO + (tile & 1) * Br * LD;
    const float2* stats = sStats + (tile & 1) * Br;
    const float* dots = sDot + (tile & 1) * Br;

    float s[Br / 8][4] = {}, dp[Br / 8][4] = {};  // S^T = K Q^T and dP^T = V dO^T: 16 keys x Br queries
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldmatrix_x4(ka, sK + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
      ldmatrix_x4(va, sV + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < Br / 16; ++np) {
        const int off = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t qb[4], ob[4];
        ldmatrix_x4(qb, q_s + off);
        ldmatrix_x4(ob, o_s + off);
        mma<T>(s[2 * np], ka, qb[0], qb[1]);
        mma<T>(s[2 * np + 1], ka, qb[2], qb[3]);
        mma<T>(dp[2 * np], va, ob[0], ob[1]);
        mma<T>(dp[2 * np + 1], va, ob[2], ob[3]);
      }
    }

    // s becomes P'^T (for dV), dp becomes dS^T (for dK, and through shared memory for dQ).
    const auto grads = [&](auto dropping_c, auto edge_c) {
      constexpr bool kDropping = decltype(dropping_c)::value, kEdge = decltype(edge_c)::value;
#pragma unroll
      for (int nt = 0; nt < Br / 8; ++nt) {
        const int qc = nt * 8 + 2 * t;
        const float4 st = *reinterpret_cast<const float4*>(stats + qc);  // queries qc and qc + 1
        const float2 dot = *reinterpret_cast<const float2*>(dots + qc);
        uint32_t w0 = 0, w1 = 0;
        if constexpr (kDropping) {
          const int q = tile * Br + qc;
          w0 = __ldg(keep_row(a.keep_bits, a.keep_words, bh, S, q) + keep_word) >> keep_bit;
          w1 = __ldg(keep_row(a.keep_bits, a.keep_words, bh, S, q + 1) + keep_word) >> keep_bit;
        }
        if constexpr (kEdge)
          backward_tile(s[nt], dp[nt], kind_a, kind_b, a.scale_log2, st, dot, kDropping, w0, w1, a.keep_scale,
                        outside_bits(a.window, key_a, tile * Br + qc));
        else
          backward_tile_off_edge<kDropping>(s[nt], dp[nt], bias_a, bias_b, a.scale_log2, st, dot, w0, w1,
                                            a.keep_scale);
        *reinterpret_cast<uint32_t*>(sDS + (warp * 16 + g) * LDS + qc) = pack<T>(dp[nt][0], dp[nt][1]);
        *reinterpret_cast<uint32_t*>(sDS + (warp * 16 + g + 8) * LDS + qc) = pack<T>(dp[nt][2], dp[nt][3]);
      }
    };
    using std::false_type, std::true_type;
    if (crosses_window(a.window, key0, key0 + Bc - 1, tile * Br, tile * Br + Br - 1))
      dropping ? grads(true_type{}, true_type{}) : grads(false_type{}, true_type{});
    else
      dropping ? grads(true_type{}, false_type{}) : grads(false_type{}, false_type{});

    // dV += P'^T dO and dK += dS^T Q: the accumulator tiles, two by two, are A fragments of 16 queries.
#pragma unroll
    for (int qc = 0; qc < Br / 16; ++qc) {
      const uint32_t pa[4] = {pack<T>(s[2 * qc][0], s[2 * qc][1]), pack<T>(s[2 * qc][2], s[2 * qc][3]),
                              pack<T>(s[2 * qc + 1][0], s[2 * qc + 1][1]),
                              pack<T>(s[2 * qc + 1][2], s[2 * qc + 1][3])};
      const uint32_t da[4] = {pack<T>(dp[2 * qc][0], dp[2 * qc][1]), pack<T>(dp[2 * qc][2], dp[2 * qc][3]),
                              pack<T>(dp[2 * qc + 1][0], dp[2 * qc + 1][1]),
                              pack<T>(dp[2 * qc + 1][2], dp[2 * qc + 1][3])};
#pragma unroll
      for (int dpair = 0; dpair < D / 16; ++dpair) {
        const int off = (qc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dpair * 16 + (lane >> 4) * 8;
        uint32_t ob[4], qb[4];
        ldmatrix_x4_trans(ob, o_s + off);
        ldmatrix_x4_trans(qb, q_s + off);
        mma<T>(dv[2 * dpair], pa, ob[0], ob[1]);
        mma<T>(dv[2 * dpair + 1], pa, ob[2], ob[3]);
        mma<T>(dk[2 * dpair], da, qb[0], qb[1]);
        mma<T>(dk[2 * dpair + 1], da, qb[2], qb[3]);
      }
    }
    __syncthreads();  // dS^T of all four warps is in

    // dQ (Br x D) += dS K: warps split it into 16-row by kCols tiles.
    constexpr int kRowTiles = Br / 16, kColSplit = kWarps / kRowTiles, kCols = D / kColSplit;
    const int rt = warp % kRowTiles, cs = warp / kRowTiles;
    float dq[kCols / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < Bc / 16; ++kc) {
      uint32_t sa[4];
      ldmatrix_x4_trans(sa, sDS + (kc * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + rt * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int dpair = 0; dpair < kCols / 16; ++dpair) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, sK + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + cs * kCols + dpair * 16 +
                                  (lane >> 4) * 8);
        mma<T>(dq[2 * dpair], sa, kb[0], kb[1]);
        mma<T>(dq[2 * dpair + 1], sa, kb[2], kb[3]);
      }
    }
    const int qa = tile * Br + rt * 16 + g, qb = qa + 8;
    float* acc = a.dq_accum + seq_row0 * H + h * D + cs * kCols + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kCols / 8; ++dt) {
      if (qa < len) {
        atomicAdd(acc + int64_t(qa) * H + dt * 8, dq[dt][0]);
        atomicAdd(acc + int64_t(qa) * H + dt * 8 + 1, dq[dt][1]);
      }
      if (qb < len) {
        atomicAdd(acc + int64_t(qb) * H + dt * 8, dq[dt][2]);
        atomicAdd(acc + int64_t(qb) * H + dt * 8 + 1, dq[dt][3]);
      }
    }
  }

  // Keys past the sequence are not written; masked keys come out exactly 0 (P = 0).
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int c = dt * 8 + 2 * t;
    if (key_a < len) {
      *reinterpret_cast<uint32_t*>(dk_dst + int64_t(key_a) * ld + c) = pack<T>(dk[dt][0] * a.scale, dk[dt][1] * a.scale);
      *reinterpret_cast<uint32_t*>(dv_dst + int64_t(key_a) * ld + c) = pack<T>(dv[dt][0], dv[dt][1]);
    }
    if (key_b < len) {
      *reinterpret_cast<uint32_t*>(dk_dst + int64_t(key_b) * ld + c) = pack<T>(dk[dt][2] * a.scale, dk[dt][3] * a.scale);
      *reinterpret_cast<uint32_t*>(dv_dst + int64_t(key_b) * ld + c) = pack<T>(dv[dt][2], dv[dt][3]);
    }
  }
}

}  // namespace

template <typename T, int D>
void launch_backward(const BackwardArgs& a, int batch, cudaStream_t stream) {
  using Shape = BackwardShape<D>;
  static const bool smem_opted_in = [] {  // once per kernel; above 48 KiB needs the opt-in
    HONE_CUDA_CHECK(cudaFuncSetAttribute(backward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(Shape::kSmemBytes)));
    return true;
  }();
  (void)smem_opted_in;
  const dim3 grid((a.seq + Shape::kKeys - 1) / Shape::kKeys, batch * a.heads);
  backward_kernel<T, D><<<grid, kThreads, Shape::kSmemBytes, stream>>>(a);
  HONE_CUDA_LAUNCH_CHECK();
}

#define HONE_FLASH_BACKWARD(T, D) template void launch_backward<T, D>(const BackwardArgs&, int, cudaStream_t);
HONE_FLASH_BACKWARD(__nv_bfloat16, 16)
HONE_FLASH_BACKWARD(__nv_bfloat16, 32)
HONE_FLASH_BACKWARD(__nv_bfloat16, 64)
HONE_FLASH_BACKWARD(__nv_bfloat16, 128)
HONE_FLASH_BACKWARD(__half, 16)
HONE_FLASH_BACKWARD(__half, 32)
HONE_FLASH_BACKWARD(__half, 64)
HONE_FLASH_BACKWARD(__half, 128)
#undef HONE_FLASH_BACKWARD

}  // namespace hone::cuda::flash
