#pragma once
// What the flash attention kernels (flash_forward.cu, flash_backward.cu) share: their
// arguments, the PTX they are built from (cp.async, ldmatrix, mma.sync m16n8k16 with F32
// accumulation), and the per-element math of scores and dropout.
//
// Fragment layouts of mma.sync.m16n8k16 (lane = 4 g + t): an accumulator tile holds, per
// lane, rows g and g + 8, columns 2t and 2t + 1. ldmatrix.x4 loads four 8x8 matrices, lanes
// 8m..8m+7 giving the row addresses of matrix m; .trans hands out columns instead of rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hone/backend.h"
#include "hone/philox.h"

namespace hone::cuda::flash {

constexpr int kThreads = 128;  // four warps per CTA
constexpr int kWarps = kThreads / 32;

struct ForwardArgs {
  const void* qkv;             // [B*S, 3H]
  const int32_t* mask;         // [B, S]
  const int32_t* key_lengths;  // [B]
  void* ctx;                   // [B*S, H]
  float2* stats;               // [B, heads, S]: {max, 1 / sum}
  int seq, heads;
  float scale_log2;  // scale * log2 e
  DropoutSpec drop;
  float keep_scale;             // 1 / (1 - p)
  const uint32_t* keep_bits;    // [B, heads, S, keep_words]: written beforehand when p > 0
  int keep_words;
  // Packed sequences when set, [B + 1]: sequence b is rows row_start[b] .. row_start[b + 1]
  // - 1 of qkv and ctx and attends to all of itself; S is at least the longest. mask and
  // key_lengths are then not read; stats (null in inference) and the keep bits stay in
  // the padded layout [B, heads, S], sequence b's row i at position i.
  const int32_t* row_start = nullptr;
  int window = -1;  // AttentionDims::window; packed, positions count from each sequence's start
  // The rows of each sequence, from its first, whose context is written: 1 for
  // AttentionDims::first_rows_only (the Hopper kernel; the others write every row).
  int query_rows = 1 << 30;
};

struct BackwardArgs {
  const void* qkv;
  const void* dctx;            // [B*S, H]
  const int32_t* mask;
  const int32_t* key_lengths;
  const float2* stats;
  const float* row_dot;        // [B, heads, S]: rowsum(dctx * ctx)
  float* dq_accum;             // [B*S, H], zeroed before the kernel
  void* dqkv;                  // [B*S, 3H]: dK and dV written here, dQ later from dq_accum
  int seq, heads;
  float scale, scale_log2;
  DropoutSpec drop;
  float keep_scale;
  const uint32_t* keep_bits;  // the forward's, when p > 0
  int keep_words;
  int window = -1;  // AttentionDims::window
  // Packed sequences when set, as ForwardArgs::row_start: qkv, dctx, dq_accum and dqkv
  // hold the packed rows; stats, row_dot and the keep bits the padded layout.
  const int32_t* row_start = nullptr;
};

// Host launchers, instantiated for T in {__nv_bfloat16, __half} and D in {16, 32, 64, 128}.
template <typename T, int D>
void launch_forward(const ForwardArgs& a, int batch, cudaStream_t stream);
template <typename T, int D>
void launch_backward(const BackwardArgs& a, int batch, cudaStream_t stream);

// ---------------------------------------------------------------- PTX

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zeros when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

// c += a b for one 16x8 tile, k = 16.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T (nearest even), lo in the low half: one register of a fragment.
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t w) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v;
    memcpy(&v, &w, 4);
    return __bfloat1622float2(v);
  } else {
    __half2 v;
    memcpy(&v, &w, 4);
    return __half22float2(v);
  }
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------- sliding window

// Keys at or past this one get no weight in any query row of sequence b, so the kernels
// stop there: key_lengths[b], one past the last attended key. Not with a window: a query
// whose window holds only padded keys weighs those (uniformly, as on the CPU), wherever
// they lie.
__device__ __forceinline__ int weighted_keys(const int32_t* key_lengths, int b, int seq, int window) {
  return window >= 0 ? seq : key_lengths[b];
}

// Blocks [lo, hi) of `block` positions, of `blocks`, that hold a position within `window`
// of one of rows [first, last] (every block without a window): the key blocks a query
// tile weighs (forward), or the query blocks that weigh a key tile (backward). Whole
// blocks outside the band are skipped: with w = 64 at S = 8192, about 3 blocks of 128 per
// tile remain instead of 64.
struct BlockRange {
  int lo, hi;
};
__device__ __forceinline__ BlockRange window_blocks(int window, int first, int last, int block, int blocks) {
  if (window < 0) return {0, blocks};
  const int64_t end = int64_t(last) + window;  // the last position within the window of a row
  return {max(first - window, 0) / block, end >= int64_t(blocks) * block ? blocks : int(end / block) + 1};
}

// Whether a tile of rows [r0, r1] by columns [c0, c1] (queries by keys, or keys by
// queries) holds an element outside the window, so that its elements need the test.
__device__ __forceinline__ bool crosses_window(int window, int r0, int r1, int c0, int c1) {
  return window >= 0 && (int64_t(c1) - r0 > window || int64_t(r1) - c0 > window);
}

// The maximum a row's exponentials subtract in the online softmax: 0 while the row has no
// weighted key yet (max -inf: each key so far outside its window), so that they and the
// rescale come out 0 rather than NaN. Without a window every block holds a key of finite
// score, so the max is never -inf and this changes nothing.
__device__ __forceinline__ float finite_max(float m) { return m == -INFINITY ? 0.0f : m; }

// ---------------------------------------------------------------- sequences

// 1 + the last attended key of a padded sequence (its mask row of S entries), found by the
// 32 lanes of a warp, each of which gets it: keys past it get no weight in any row, so the
// kernels stop there. A sequence with no attended key gets S: all of its rows are uniform
// over every key, as on the CPU.
__device__ __forceinline__ int warp_key_length(const int32_t* mask_row, int S, int lane) {
  int last = -1;
  for (int j = lane; j < S; j += 32)
    if (mask_row[j] != 0) last = j;
  for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
  return last >= 0 ? last + 1 : S;
}

// Where sequence b's rows are: padded, rows b S .. b S + S - 1, keys up to
// weighted_keys(); packed (row_start set), rows row_start[b] .. row_start[b + 1] - 1, every
// one a key. Rows and keys at or past `len` are another sequence's or none.
struct SequenceRows {
  int64_t first;
  int len, keys;
};
__device__ __forceinline__ SequenceRows sequence_rows(const int32_t* row_start, const int32_t* key_lengths, int b,
                                                      int seq, int window) {
  if (row_start) {
    const int first = row_start[b], len = row_start[b + 1] - first;
    return {first, len, len};
  }
  return {int64_t(b) * seq, seq, weighted_keys(key_lengths, b, seq, window)};
}

// The (sequence and head, block) of the persistent kernels' tile t, of `blocks` blocks
// (query tiles forward, key tiles backward) per (sequence, head) pair and `pairs` pairs.
// Padded, a pair's blocks are neighbours, so that CTAs working at once share its rows in
// L2. Packed, the last blocks of every pair come first: with the CTAs taking tiles in
// turns, a CTA would otherwise take the same block index every time (132 CTAs, 4 blocks a
// pair), and the CTAs of block 0, which every sequence has, had the most work, those of
// the last only the longest sequences'. Heavy tiles first and light ones last: packed
// forward + backward at bert-large's heads on 32 texts of 16..512 tokens 0.696 -> 0.672
// ms (H100). A packed batch's rows are few enough to stay in L2 between their pair's
// blocks.
struct TileCoords {
  int bh, block;
};
__device__ __forceinline__ TileCoords tile_coords(int t, int blocks, int pairs, bool packed) {
  if (packed) return {t % pairs, blocks - 1 - t / pairs};
  return {t / blocks, t % blocks};
}

// ---------------------------------------------------------------- scores and dropout

// What a key is to the softmax: live (1), masked (0: the score becomes -FLT_MAX, as on the
// CPU, so a row with every key masked is uniform), or past the sequence (-1: no weight).
// mask_row null (a packed sequence): every key within it is live. key_kind_of: the same from
// the key's mask value, already loaded (1 without a mask).
__device__ __forceinline__ int key_kind_of(int mask_value, int j, int seq) {
  return j < seq ? (mask_value != 0 ? 1 : 0) : -1;
}
__device__ __forceinline__ int key_kind(const int32_t* mask_row, int j, int seq) {
  return j < seq ? (!mask_row || mask_row[j] != 0 ? 1 : 0) : -1;
}

// A score in base-2 units (exp2 of it is exp of the scaled score).
__device__ __forceinline__ float score_log2(float dot, int kind, float scale_log2) {
  return kind > 0 ? dot * scale_log2 : kind == 0 ? -FLT_MAX : -INFINITY;
}

// The same as an addend, score_log2 = dot * scale_log2 + bias: 0 for a live key; -FLT_MAX
// for a masked one (the product is far below its ulp, so the sum is exactly -FLT_MAX); -inf
// past the sequence. mask_row null: every key within the sequence is live.
__device__ __forceinline__ float key_bias(const int32_t* mask_row, int j, int seq) {
  return j < seq ? (!mask_row || mask_row[j] != 0 ? 0.0f : -FLT_MAX) : -INFINITY;
}

// One element of the backward's tiles (rows keys, columns queries): the score s = q.k
// becomes P' (P kept and scaled by 1 / (1 - p), or 0: the factor of dV) and dp, the
// gradient of P', becomes dS = P (dP - D) (the factor of dK and dQ). max, inv and dot are
// the query's forward {max, 1 / sum} and D = rowsum(dO * O).
__device__ __forceinline__ void backward_element(float& s, float& dp, int kind, float scale_log2, float max, float inv,
                                                 float dot, bool keep, float keep_scale) {
  const float p = exp2_approx(score_log2(s, kind, scale_log2) - max) * inv;
  const float grad = keep ? dp * keep_scale : 0.0f;  // d(P) from d(P')
  s = keep ? p * keep_scale : 0.0f;
  dp = p * (grad - dot);
}

// backward_element over one accumulator tile of the backward: keys a and a + 8 (of kinds
// kind_a, kind_b) by queries q and q + 1, elements (a, q), (a, q + 1), (a + 8, q),
// (a + 8, q + 1). st holds the two queries' {max, 1 / sum}, dot their D; with dropout,
// bit 0 of keep_q0 / keep_q1 is key a's keep bit for query q / q + 1, bit 8 key a + 8's.
// Bit e of `outside` marks element e outside the window: it is then a key past the
// sequence (no weight).
__device__ __forceinline__ void backward_tile(float (&s)[4], float (&dp)[4], int kind_a, int kind_b, float scale_log2,
                                              float4 st, float2 dot, bool dropping, uint32_t keep_q0,
                                              uint32_t keep_q1, float keep_scale, uint32_t outside) {
  const uint32_t keep[4] = {keep_q0, keep_q1, keep_q0 >> 8, keep_q1 >> 8};
#pragma unroll
  for (int e = 0; e < 4; ++e)
    backward_element(s[e], dp[e], (outside >> e) & 1u ? -1 : e < 2 ? kind_a : kind_b, scale_log2,
                     e & 1 ? st.z : st.x, e & 1 ? st.w : st.y, e & 1 ? dot.y : dot.x, !dropping || (keep[e] & 1u),
                     keep_scale);
}

// backward_tile where no element of the tile crosses a window's edge, so that each key's
// elements share its kind: the kind is a bias the score's FFMA adds (kind_bias) and
// dropout a template argument, and no element takes a select (the backward kernels are
// latency-bound, and the selects were most of their elementwise pass). Same bits as
// backward_tile: fmaf(s, scale, 0) rounds s scale once, as the product does, and
// fmaf(s, scale, -FLT_MAX or -inf) is the masked score itself.
// kind_bias: key_bias from a key_kind the kernel already holds. (key_bias written as
// kind_bias(key_kind(...)) costs the forwards' producers 80-96 more instructions.)
__device__ __forceinline__ float kind_bias(int kind) { return kind > 0 ? 0.0f : kind == 0 ? -FLT_MAX : -INFINITY; }
template <bool Dropping>
__device__ __forceinline__ void backward_tile_off_edge(float (&s)[4], float (&dp)[4], float bias_a, float bias_b,
                                                       float scale_log2, float4 st, float2 dot, uint32_t keep_q0,
                                                       uint32_t keep_q1, float keep_scale) {
  const uint32_t keep[4] = {keep_q0, keep_q1, keep_q0 >> 8, keep_q1 >> 8};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float p =
        exp2_approx(fmaf(s[e], scale_log2, e < 2 ? bias_a : bias_b) - (e & 1 ? st.z : st.x)) * (e & 1 ? st.w : st.y);
    const float d = e & 1 ? dot.y : dot.x;
    if constexpr (Dropping) {
      const bool kept = keep[e] & 1u;
      dp[e] = p * ((kept ? dp[e] * keep_scale : 0.0f) - d);
      s[e] = kept ? p * keep_scale : 0.0f;
    } else {  // keep_scale is 1
      dp[e] = p * (dp[e] - d);
      s[e] = p;
    }
  }
}

// The `outside` bits of backward_tile for keys key_a, key_a + 8 by queries q, q + 1.
__device__ __forceinline__ uint32_t outside_bits(int window, int key_a, int q) {
  return uint32_t(outside_window(window, q, key_a)) | uint32_t(outside_window(window, q + 1, key_a)) << 1 |
         uint32_t(outside_window(window, q, key_a + 8)) << 2 | uint32_t(outside_window(window, q + 1, key_a + 8)) << 3;
}

// Adds the window to the scores of one forward accumulator tile in base-2 units: rows row0
// and row0 + 8 by keys key and key + 1, elements (row0, key), (row0, key + 1), (row0 + 8,
// key), (row0 + 8, key + 1); those outside the window become -inf.
__device__ __forceinline__ void window_tile(float* s, int window, int row0, int key) {
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (outside_window(window, row0 + (e >> 1) * 8, key + (e & 1))) s[e] = -INFINITY;
}

// Word key0 / 32 of one query row's dropout keep bits: bit k is attention_keep of element
// base + k (base = the flat index of (row, key0)), 0 for keys at or past S. When S % 8 == 0
// the word is four whole Philox blocks, drawn as independent chains that the compiler
// interleaves. threshold = attention_keep_threshold(p).
__device__ __forceinline__ uint32_t draw_keep_word(uint64_t seed, uint64_t stream, float p, uint32_t threshold,
                                                   int S, uint64_t base, int key0) {
  const int live = min(S - key0, 32);  // keys of this word inside the sequence
  uint32_t word = 0;
  if (S % 8 == 0) {
    Philox4 r[4];
#pragma unroll
    for (int blk = 0; blk < 4; ++blk) r[blk] = philox_block(seed, stream, (base >> 3) + blk);
#pragma unroll
    for (int e = 0; e < 32; ++e) word |= uint32_t(attention_half_kept(r[e >> 3].v[(e >> 1) & 3], e & 1, threshold)) << e;
    return live == 32 ? word : word & ((1u << live) - 1u);
  }
  for (int k = 0; k < live; ++k) word |= uint32_t(attention_keep(seed, stream, base + k, p)) << k;
  return word;
}

// The dropout keep bits of one query row (keep_bits_kernel's, flash_attention.cu): word k
// holds keys 32k .. 32k + 31, key j in bit j % 32. Rows past the sequence (a tail tile's,
// whose results are never stored) read the last row, so that no read leaves the buffer.
__device__ __forceinline__ const uint32_t* keep_row(const uint32_t* bits, int words, int bh, int seq, int row) {
  return bits + (int64_t(bh) * seq + min(row, seq - 1)) * words;
}

// Rows [r0, r0 + rows) of a [*, ld] half matrix into shared memory rows of `sld` elements,
// D columns, 16 bytes per cp.async; rows at or past `limit` become zeros.
template <typename T, int D>
__device__ __forceinline__ void load_rows_async(T* dst, int sld, const T* src, int64_t ld, int r0, int rows,
                                                int limit) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, k = c % kChunks;
    const bool valid = r0 + r < limit;
    cp_async16(dst + r * sld + k * 8, src + (valid ? int64_t(r0 + r) * ld : 0) + k * 8, valid);
  }
}

}  // namespace hone::cuda::flash
