// Flash attention forward (FlashAttention-2's loop order): a CTA of four warps takes 128
// query rows of one (sequence, head) (64 at head size 128), keeps their Q fragments in registers and
// walks the key tiles up to the sequence's last attended key, K and V double-buffered in
// shared memory through cp.async. Each warp keeps its rows' running max and sum (online
// softmax, F32) and its output tile in registers; P is rounded to the half type for P V.
// With a window, only the key tiles that hold a key within it of one of the CTA's rows are
// walked, and the tiles that cross its edge set the scores outside it to -inf.
#include "cuda/check.h"
#include "cuda/flash_kernels.h"

namespace hone::cuda::flash {

namespace {

template <int D>
struct ForwardShape {
  // Query rows per warp in 16-row tiles: two up to D = 64, so that every K and V fragment
  // read from shared memory feeds two products (ldmatrix bandwidth bounds this loop);
  // one at D = 128, where two would not fit in registers.
  static constexpr int kTiles = D <= 64 ? 2 : 1;
  static constexpr int kRows = 16 * kTiles * kWarps;  // query rows per CTA
  static constexpr int kKeys = 64;                    // keys per tile
  static constexpr int kLd = D + 8;  // shared row stride: 16 bytes of padding keeps ldmatrix conflict-free
  static constexpr size_t kSmemBytes = size_t(kRows + 4 * kKeys) * kLd * 2 + 2 * kKeys * sizeof(float);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(ForwardArgs a) {
  using Shape = ForwardShape<D>;
  constexpr int M = Shape::kTiles, Br = Shape::kRows, Bc = Shape::kKeys, LD = Shape::kLd;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // [Br][LD]; each warp's rows also stage its output
  T* sK = sQ + Br * LD;                 // [2][Bc][LD]
  T* sV = sK + 2 * Bc * LD;             // [2][Bc][LD]
  float* sBias = reinterpret_cast<float*>(sV + 2 * Bc * LD);  // [2][Bc]: added to each key's scores

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int S = a.seq, H = a.heads * D;
  const int64_t ld = 3 * int64_t(H);
  const int bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, q0 = blockIdx.x * Br;
  const int warp_row0 = warp * 16 * M;  // this warp's first row in the CTA's tile
  const SequenceRows rows = sequence_rows(a.row_start, a.key_lengths, b, S, a.window);
  const int len = rows.len;
  if (q0 >= len) return;  // past a packed sequence's end
  const T* q_src = static_cast<const T*>(a.qkv) + rows.first * ld + h * D;
  const T* k_src = q_src + H;
  const T* v_src = q_src + 2 * H;
  const int32_t* mask_row = a.row_start ? nullptr : a.mask + int64_t(b) * S;
  const int tiles = (rows.keys + Bc - 1) / Bc;
  const BlockRange walk = window_blocks(a.window, q0, min(q0 + Br, len) - 1, Bc, tiles);
  const bool dropping = a.drop.p > 0.0f;

  const auto load_keys = [&](int tile) {
    const int buf = tile & 1;
    load_rows_async<T, D>(sK + buf * Bc * LD, LD, k_src, ld, tile * Bc, Bc, len);
    load_rows_async<T, D>(sV + buf * Bc * LD, LD, v_src, ld, tile * Bc, Bc, len);
    cp_async_commit();
    const int key = tile * Bc + threadIdx.x;
    if (threadIdx.x < Bc)
      sBias[buf * Bc + threadIdx.x] = key_bias(mask_row, key, len);
  };
  load_rows_async<T, D>(sQ, LD, q_src, ld, q0, Br, len);
  load_keys(walk.lo);

  uint32_t qf[M][D / 16][4];
  float o[M][D / 8][4] = {};
  float row_max[M][2], row_sum[M][2] = {};  // row_sum: this lane's columns only
#pragma unroll
  for (int m = 0; m < M; ++m) row_max[m][0] = row_max[m][1] = -INFINITY;

  for (int tile = walk.lo; tile < walk.hi; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // the tile is in; every warp is done with the buffer loaded next
    if (tile == walk.lo) {
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldmatrix_x4(qf[m][kk], sQ + (warp_row0 + m * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
    }
    if (tile + 1 < walk.hi) load_keys(tile + 1);
    const T* k_s = sK + (tile & 1) * Bc * LD;
    const T* v_s = sV + (tile & 1) * Bc * LD;
    const float* bias = sBias + (tile & 1) * Bc;

    float s[M][Bc / 8][4] = {};  // S = Q K^T, 16 M rows x Bc keys
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < Bc / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_s + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          mma<T>(s[m][2 * np], qf[m][kk], kb[0], kb[1]);
          mma<T>(s[m][2 * np + 1], qf[m][kk], kb[2], kb[3]);
        }
      }

    const bool edge = crosses_window(a.window, q0, q0 + Br - 1, tile * Bc, tile * Bc + Bc - 1);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float tile_max[2] = {row_max[m][0], row_max[m][1]};
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
        const float2 kb = *reinterpret_cast<const float2*>(bias + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][nt][e] = fmaf(s[m][nt][e], a.scale_log2, e & 1 ? kb.y : kb.x);
        if (edge) window_tile(s[m][nt], a.window, q0 + warp_row0 + m * 16 + g, tile * Bc + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[m][nt][e]);
      }
      float rescale[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        rescale[r] = exp2_approx(row_max[m][r] - finite_max(tile_max[r]));  // 0 on the first tile (-inf)
        row_max[m][r] = tile_max[r];
        row_sum[m][r] *= rescale[r];
      }
      const float sub[2] = {finite_max(row_max[m][0]), finite_max(row_max[m][1])};
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[m][nt][e] = exp2_approx(s[m][nt][e] - sub[e >> 1]);
          row_sum[m][e >> 1] += s[m][nt][e];
        }
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[m][dt][0] *= rescale[0], o[m][dt][1] *= rescale[0];
        o[m][dt][2] *= rescale[1], o[m][dt][3] *= rescale[1];
      }
      if (dropping) {  // this lane's rows are row0 and row0 + 8, its keys 8 nt + 2t and + 1
        const int row0 = q0 + warp_row0 + m * 16 + g;
        const uint32_t* bits0 = keep_row(a.keep_bits, a.keep_words, bh, S, row0);
        const uint32_t* bits1 = keep_row(a.keep_bits, a.keep_words, bh, S, row0 + 8);
#pragma unroll
        for (int c = 0; c < Bc / 32; ++c) {
          const uint32_t w0 = __ldg(bits0 + tile * (Bc / 32) + c), w1 = __ldg(bits1 + tile * (Bc / 32) + c);
#pragma unroll
          for (int nt = 4 * c; nt < 4 * c + 4; ++nt) {
            const int bit = (nt % 4) * 8 + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (!(((e < 2 ? w0 : w1) >> (bit + (e & 1))) & 1u)) s[m][nt][e] = 0.0f;
          }
        }
      }
    }

    // O += P V: P's accumulator tiles are, two by two, the A fragments of 16 keys.
#pragma unroll
    for (int kc = 0; kc < Bc / 16; ++kc) {
      uint32_t pa[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        pa[m][0] = pack<T>(s[m][2 * kc][0], s[m][2 * kc][1]);
        pa[m][1] = pack<T>(s[m][2 * kc][2], s[m][2 * kc][3]);
        pa[m][2] = pack<T>(s[m][2 * kc + 1][0], s[m][2 * kc + 1][1]);
        pa[m][3] = pack<T>(s[m][2 * kc + 1][2], s[m][2 * kc + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_s + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          mma<T>(o[m][2 * dp], pa[m], vb[0], vb[1]);
          mma<T>(o[m][2 * dp + 1], pa[m], vb[2], vb[3]);
        }
      }
    }
  }

  // The output through this warp's own Q rows (no other warp reads them), then 16-byte stores.
  T* stage = sQ + warp_row0 * LD;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 1);
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 2);
      inv[r] = 1.0f / row_sum[m][r];
    }
    const float s0 = inv[0] * a.keep_scale, s1 = inv[1] * a.keep_scale;
    T* rows = stage + m * 16 * LD;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(rows + g * LD + dt * 8 + 2 * t) = pack<T>(o[m][dt][0] * s0, o[m][dt][1] * s0);
      *reinterpret_cast<uint32_t*>(rows + (g + 8) * LD + dt * 8 + 2 * t) =
          pack<T>(o[m][dt][2] * s1, o[m][dt][3] * s1);
    }
    const int row0 = q0 + warp_row0 + m * 16 + g, row1 = row0 + 8;
    if (t == 0 && a.stats) {
      if (row0 < len) a.stats[int64_t(bh) * S + row0] = make_float2(row_max[m][0], inv[0]);
      if (row1 < len) a.stats[int64_t(bh) * S + row1] = make_float2(row_max[m][1], inv[1]);
    }
  }
  __syncwarp();
  T* ctx = static_cast<T*>(a.ctx) + rows.first * H + h * D;
  for (int c = lane; c < 16 * M * (D / 8); c += 32) {
    const int r = c / (D / 8), k = c % (D / 8), row = q0 + warp_row0 + r;
    if (row < len)
      *reinterpret_cast<int4*>(ctx + int64_t(row) * H + k * 8) = *reinterpret_cast<const int4*>(stage + r * LD + k * 8);
  }
}

}  // namespace

template <typename T, int D>
void launch_forward(const ForwardArgs& a, int batch, cudaStream_t stream) {
  using Shape = ForwardShape<D>;
  static const bool smem_opted_in = [] {  // once per kernel; above 48 KiB needs the opt-in
    HONE_CUDA_CHECK(cudaFuncSetAttribute(forward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(Shape::kSmemBytes)));
    return true;
  }();
  (void)smem_opted_in;
  const dim3 grid((a.seq + Shape::kRows - 1) / Shape::kRows, batch * a.heads);
  forward_kernel<T, D><<<grid, kThreads, Shape::kSmemBytes, stream>>>(a);
  HONE_CUDA_LAUNCH_CHECK();
}

#define HONE_FLASH_FORWARD(T, D) template void launch_forward<T, D>(const ForwardArgs&, int, cudaStream_t);
HONE_FLASH_FORWARD(__nv_bfloat16, 16)
HONE_FLASH_FORWARD(__nv_bfloat16, 32)
HONE_FLASH_FORWARD(__nv_bfloat16, 64)
HONE_FLASH_FORWARD(__nv_bfloat16, 128)
HONE_FLASH_FORWARD(__half, 16)
HONE_FLASH_FORWARD(__half, 32)
HONE_FLASH_FORWARD(__half, 64)
HONE_FLASH_FORWARD(__half, 128)
#undef HONE_FLASH_FORWARD

}  // namespace hone::cuda::flash
