#pragma once
// hone's own flash attention for BF16 / F16 (flash_attention.cu), compiled ahead of time:
// FlashAttention-2's tiling on mma.sync tensor cores, no [S, S] matrix anywhere, the
// semantics of src/ops/attention.cpp (any 0/1 mask, -FLT_MAX on masked keys, dropout with
// hone's Philox stream (attention_keep), so the CPU reference reproduces its masks). Head sizes 16, 32, 64
// and 128. A window (AttentionDims::window) skips the key blocks (forward) and query blocks
// (backward) that lie wholly outside it and gives the elements outside it no weight, as
// keys past the sequence; without one the kernels do exactly what they did before it.
//
// stats [B, heads, S, 2] keeps, per query row, {max, 1 / sum}: the maximum of its masked
// scores in base-2 units (scale * q.k * log2 e) and the reciprocal of the sum of exp2(x -
// max). Backward recomputes P = exp2(x - max) * (1 / sum) from them.
#include <cuda_runtime.h>

#include <cstdint>

#include "hone/backend.h"

namespace hone::cuda {

// The scratch of one call in the attention workspace, offsets in F32 elements.
struct FlashScratch {
  int64_t dq_accum;     // F32 [B*S, H]: dQ summed over key blocks (backward)
  int64_t row_dot;      // F32 [B, heads, S]: rowsum(dctx * ctx) (backward)
  int64_t key_lengths;  // I32 [B]: keys past the last attended one are skipped
  int64_t total;
};
FlashScratch flash_scratch(const AttentionDims& d);
// 32-bit words of dropout keep bits per query row, which the forward saves for the
// backward: S rounded up to 128 keys (a 16-byte TMA row). With a window, only the words that
// hold a key within it of the row are written; packed, only those of a sequence's rows that
// hold one of its keys.
int keep_words(int seq);

// Whether flash_forward / flash_backward run this head size.
bool flash_supports_head_dim(int head_dim);

// With dropout, keep (I32 [B, heads, S, keep_words(S)]) receives the mask's bits.
void flash_forward(cudaStream_t stream, const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                   const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace);
// Packed sequences: sequence b is rows row_start[b] .. row_start[b + 1] - 1 (I32 [B + 1] on
// the device) of qkv [T, 3H] and ctx [T, H], attending to itself alone; d.batch = B, d.seq
// = S, at least the longest sequence. Training passes stats and keep as flash_forward's,
// in the padded layout [B, heads, S, ...] (sequence b's row i at position i); inference,
// empty ones and no dropout.
void flash_forward_packed(cudaStream_t stream, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                          const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx);
// dqkv is overwritten entirely (padded keys get their gradient, 0); keep is the forward's.
void flash_backward(cudaStream_t stream, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                    const Tensor& mask, const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                    const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace);
// The backward of a training flash_forward_packed: dqkv [T, 3H] overwritten.
void flash_backward_packed(cudaStream_t stream, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                           const Tensor& row_start, const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                           const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace);

}  // namespace hone::cuda
