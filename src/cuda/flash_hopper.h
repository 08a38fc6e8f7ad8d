#pragma once
// hone's Hopper attention kernels (flash_hopper_*.cu): FlashAttention-3's structure on
// TMA and warpgroup MMA for head sizes 32 (MiniLM), 64 (BERT base and large) and 128. They take
// the arguments of the mma.sync kernels (flash_kernels.h) plus a TMA map of qkv, and
// flash_attention.cu picks them on a 9.0 GPU whose binary image holds them.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hone::cuda::flash {

struct ForwardArgs;
struct BackwardArgs;

// The head sizes the kernels below are built for.
constexpr bool hopper_head_dim(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

// TMA map of a row-major half matrix [rows, cols] in boxes of box_rows x box_cols (64 or 32)
// columns, 128- or 64-byte swizzled as HeadTile lays a panel out: one head's Q, K, V (of
// qkv) or dO (of dctx) tiles, a box per panel, or a product's operand tiles.
CUtensorMap hopper_tile_map(const void* base, bool bf16, int64_t rows, int64_t cols, int box_rows, int box_cols = 64);

// TMA map of the dropout keep bits, U32 [rows, words], in boxes of box_rows x 4 words.
CUtensorMap hopper_bits_map(const uint32_t* bits, int64_t rows, int words, int box_rows);

// Whether the current GPU runs the kernels below: a 9.0 GPU and a binary with sm_90a code.
bool hopper_kernels_present();

// Query rows of the forward's tiles, 64 a consumer warpgroup: three groups up to head size
// 64, two at 128, where Q and O fragments leave registers for no more.
constexpr int hopper_forward_rows(int head_dim) { return head_dim <= 64 ? 192 : 128; }
// Padded calls of at most kMaskLengthsBatch sequences and kMaskLengthsTokens tokens may
// leave a.key_lengths null: the forward then takes them from the mask itself, sparing a
// launch (at batch 1 x 128 the launch took a fifth as long as the attention).
constexpr int kMaskLengthsBatch = 256;
constexpr int64_t kMaskLengthsTokens = 4096;
constexpr bool mask_lengths_in_kernel(int batch, int seq) {
  return batch <= kMaskLengthsBatch && int64_t(batch) * seq <= kMaskLengthsTokens;
}
// sms: the number of persistent CTAs at most (one per SM).
// qkv_map: boxes of 128 rows (K, V); q_map and bits_map (read only when a.drop.p > 0):
// boxes of hopper_forward_rows(D) rows.
template <typename T, int D>
void launch_hopper_forward(const ForwardArgs& a, const CUtensorMap& qkv_map, const CUtensorMap& q_map,
                           const CUtensorMap& bits_map, int batch, int sms, cudaStream_t stream);
// qkv_map, dctx_map and bits_map: boxes of 64 rows. a.dq_accum as for launch_backward.
template <typename T, int D>
void launch_hopper_backward(const BackwardArgs& a, const CUtensorMap& qkv_map, const CUtensorMap& dctx_map,
                            const CUtensorMap& bits_map, int batch, int sms, cudaStream_t stream);

}  // namespace hone::cuda::flash
