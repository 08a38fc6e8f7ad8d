// The host side of hone's flash attention (flash_attention.h) and its small kernels: the
// key lengths that bound the work, the backward's pre-pass D = rowsum(dctx * ctx), and the
// conversion of the F32 dQ accumulator into dqkv.
#include "cuda/flash_attention.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "cuda/check.h"
#include "cuda/flash_hopper.h"
#include "cuda/flash_kernels.h"
#include "cuda/kernels.h"
#include "cuda/sdpa.h"
#include "hone/error.h"

namespace hone::cuda {

namespace {

using flash::pack;
using flash::unpack;

// key_lengths[b] = flash::warp_key_length of sequence b: one warp a sequence.
__global__ void key_lengths_kernel(const int32_t* __restrict__ mask, int S, int32_t* __restrict__ key_lengths) {
  const int b = blockIdx.x;
  const int length = flash::warp_key_length(mask + int64_t(b) * S, S, int(threadIdx.x));
  if (threadIdx.x == 0) key_lengths[b] = length;
}

// keep_bits[row * W + w], row = (b heads + h) S + query, holds in bit k whether dropout
// keeps (row, key 32 w + k): attention_keep of element row S + key, as on the CPU; keys past
// S get 0. One thread per word. The forward kernels read these words and the backward reads
// them again: no kernel draws Philox blocks between its MMAs, where the draws' latency
// would stall the tensor cores. (Drawn by the Hopper forward's three idle producer warps
// instead, they made it slower: 0.32 ms against 0.24 at bert-large's shape.)
// With a window, a row draws only the `span` words from the one of its first key within
// the window (window_words) that hold such a key; the others, whose keys have no weight,
// are not written: the kernels read them only to multiply probabilities of 0.
// Index is uint32_t when every word's index and the grid's stride fit it: 64-bit division
// is a software routine, and dividing each word's index so took 9% of the kernel (bert-large
// batch 32 forward with dropout, H100: 0.243 -> 0.234 ms with 32-bit indices).
// Packed (row_start set), a row past its sequence's end draws nothing, nor a word whose
// keys all lie past it: nothing reads those bits but to multiply probabilities of 0.
template <typename Index>
__global__ void keep_bits_kernel(DropoutSpec drop, int S, int W, int window, int span, Index rows,
                                 uint32_t* __restrict__ bits, const int32_t* __restrict__ row_start, int heads) {
  const uint64_t stream = dropout_stream(drop);
  const uint32_t threshold = attention_keep_threshold(drop.p);
  const Index words = rows * Index(span), stride = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride) {
    const Index row = i / Index(span);
    const int query = window >= 0 || row_start ? int(row % Index(S)) : 0;
    const int w = (window >= 0 ? max(query - window, 0) / 32 : 0) + int(i - row * Index(span));
    const int key0 = w * 32;
    if (w >= W || (window >= 0 && int64_t(key0) > int64_t(query) + window)) continue;
    if (row_start) {
      const Index b = row / (Index(S) * Index(heads));
      const int len = row_start[b + 1] - row_start[b];
      if (query >= len || key0 >= len) continue;
    }
    bits[uint64_t(row) * W + w] =
        flash::draw_keep_word(drop.seed, stream, drop.p, threshold, S, uint64_t(row) * S + key0, key0);
  }
}

// The words of keep bits a row draws: all W, or with a window those from the word of its
// first key within it to the word of its last, at most 2 window / 32 + 2 of them.
int window_words(int W, int window) {
  return window >= 0 ? int(std::min<int64_t>(W, 2 * int64_t(window) / 32 + 2)) : W;
}

// row_dot[b, h, i] = dctx[b, i, head h] . ctx[b, i, head h] in F32: D / 8 lanes per row,
// 8 elements (16 bytes) each. items = B S heads, item (b S + i) heads + h. Packed
// (row_start set): position i of sequence b is token row_start[b] + i, and positions past
// the sequence are skipped.
template <typename T, int D>
__global__ void row_dot_kernel(const T* __restrict__ dctx, const T* __restrict__ ctx, float* __restrict__ row_dot,
                               int64_t items, int S, int heads, const int32_t* __restrict__ row_start) {
  constexpr int kLanes = D / 8;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < items * kLanes; base += grid_stride()) {
    const int64_t item = (base + threadIdx.x) / kLanes;
    const int sub = threadIdx.x % kLanes;
    const int64_t position = item / heads, h = item % heads, b = position / S, i = position % S;
    int64_t token = position;
    bool live = item < items;
    if (live && row_start) {
      token = row_start[b] + i;
      live = token < row_start[b + 1];
    }
    float sum = 0.0f;
    if (live) {
      const int64_t offset = (token * heads + h) * D + sub * 8;  // token * H + head * D + ...
      const int4 x = *reinterpret_cast<const int4*>(dctx + offset), y = *reinterpret_cast<const int4*>(ctx + offset);
      const uint32_t xs[4] = {uint32_t(x.x), uint32_t(x.y), uint32_t(x.z), uint32_t(x.w)};
      const uint32_t ys[4] = {uint32_t(y.x), uint32_t(y.y), uint32_t(y.z), uint32_t(y.w)};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 u = unpack<T>(xs[k]), v = unpack<T>(ys[k]);
        sum += u.x * v.x + u.y * v.y;
      }
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (live && sub == 0) row_dot[(b * heads + h) * S + i] = sum;
  }
}

// dqkv[token, 0:H] = scale * dq_accum[token, :], 8 columns per thread.
template <typename T>
__global__ void dq_store_kernel(const float* __restrict__ dq_accum, T* __restrict__ dqkv, int64_t tokens, int H,
                                float scale) {
  const int64_t groups = tokens * (H / 8);
  for (int64_t i = grid_start(); i < groups; i += grid_stride()) {
    const int64_t token = i / (H / 8), c = i % (H / 8) * 8;
    const float4 lo = *reinterpret_cast<const float4*>(dq_accum + token * H + c);
    const float4 hi = *reinterpret_cast<const float4*>(dq_accum + token * H + c + 4);
    const int4 out = make_int4(int(pack<T>(lo.x * scale, lo.y * scale)), int(pack<T>(lo.z * scale, lo.w * scale)),
                               int(pack<T>(hi.x * scale, hi.y * scale)), int(pack<T>(hi.z * scale, hi.w * scale)));
    *reinterpret_cast<int4*>(dqkv + token * 3 * H + c) = out;
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// fn(TypeTag<T>{}, std::integral_constant<int, D>{}) for the call's element type and head size.
template <typename Fn>
void dispatch(DType t, int head_dim, Fn&& fn) {
  const auto with_dim = [&](auto type) {
    if (head_dim == 16) return fn(type, std::integral_constant<int, 16>{});
    if (head_dim == 32) return fn(type, std::integral_constant<int, 32>{});
    if (head_dim == 64) return fn(type, std::integral_constant<int, 64>{});
    return fn(type, std::integral_constant<int, 128>{});
  };
  if (t == DType::BF16) return with_dim(TypeTag<__nv_bfloat16>{});
  with_dim(TypeTag<__half>{});
}

void check_tensor(const Tensor& t, DType want, int64_t numel, const char* what) {
  if (t.dtype != want || t.numel() < numel)
    fail("flash attention: {} is {} {}, expected {} with at least {} elements", what, dtype_name(t.dtype),
         t.shape.str(), dtype_name(want), numel);
  if (!aligned16(t.data)) fail("flash attention: {} is not 16-byte aligned", what);
}

// The checks of every call.
void check_call(const Tensor& qkv, const AttentionDims& d, const DropoutSpec& drop) {
  if (qkv.dtype != DType::BF16 && qkv.dtype != DType::F16)
    fail("flash attention runs in BF16 or F16, not {}", dtype_name(qkv.dtype));
  if (!flash_supports_head_dim(d.head_dim))
    fail("bf16/fp16 attention needs a head size of 16, 32, 64 or 128; this model's is {} (run it in fp32, or with "
         "HONE_ATTENTION=cudnn)",
         d.head_dim);
  if (d.batch < 1 || d.seq < 1 || d.heads < 1)
    fail("flash attention: batch {}, sequence length {} and heads {} must be positive", d.batch, d.seq, d.heads);
  if (int64_t(d.batch) * d.heads > 65535)
    fail("flash attention: batch x heads = {} exceeds 65535", int64_t(d.batch) * d.heads);
  if (!(drop.p >= 0.0f && drop.p < 1.0f)) fail("attention dropout probability {} is not in [0, 1)", drop.p);
  if (d.window < -1) fail("flash attention: window {} must be -1 (no window) or a distance >= 0", d.window);
}

// The checks of a padded call in either direction; returns the key lengths, computed into
// the workspace, or null without a launch where the kernel takes them from the mask itself.
int32_t* prepare(cudaStream_t stream, const Tensor& qkv, const Tensor& mask, const Tensor& stats,
                 const AttentionDims& d, const DropoutSpec& drop, const Tensor& workspace,
                 bool kernel_reads_mask = false) {
  check_call(qkv, d, drop);
  const int64_t T = int64_t(d.batch) * d.seq;
  check_tensor(qkv, qkv.dtype, T * 3 * d.hidden(), "qkv");
  check_tensor(mask, DType::I32, T, "mask");
  check_tensor(stats, DType::F32, T * d.heads * 2, "stats");
  const FlashScratch f = flash_scratch(d);
  check_tensor(workspace, DType::F32, f.total, "the attention workspace");
  if (kernel_reads_mask) return nullptr;
  int32_t* key_lengths = reinterpret_cast<int32_t*>(workspace.f32() + f.key_lengths);
  key_lengths_kernel<<<d.batch, 32, 0, stream>>>(mask.ptr<int32_t>(), d.seq, key_lengths);
  HONE_CUDA_LAUNCH_CHECK();
  return key_lengths;
}

// The checks of a packed call in either direction: qkv holds T rows, at most B S.
void check_packed(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d, const DropoutSpec& drop) {
  check_call(qkv, d, drop);
  const int64_t T = qkv.shape[0];
  if (qkv.shape.rank != 2 || T > int64_t(d.batch) * d.seq)
    fail("packed flash attention: qkv {} for {} sequences of at most {}", qkv.shape.str(), d.batch, d.seq);
  check_tensor(qkv, qkv.dtype, T * 3 * d.hidden(), "qkv");
  check_tensor(row_start, DType::I32, d.batch + 1, "row_start");
}

float keep_scale(const DropoutSpec& drop) { return drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f; }

constexpr float kLog2e = 1.4426950408889634f;

// Hopper's kernels where they apply: head size 32, 64 or 128, a GPU and binary that have
// them, and HONE_ATTENTION not asking for the mma.sync kernels.
bool use_hopper(const AttentionDims& d) {
  return flash::hopper_head_dim(d.head_dim) && flash::hopper_kernels_present() && hopper_attention_allowed();
}

// The keep bits of this call, checked: the forward's to write or the backward's to read;
// null when nothing is dropped.
uint32_t* keep_bits(const Tensor& keep, const AttentionDims& d, const DropoutSpec& drop) {
  if (drop.p <= 0.0f) return nullptr;
  check_tensor(keep, DType::I32, int64_t(d.batch) * d.heads * d.seq * keep_words(d.seq), "the dropout keep bits");
  return keep.ptr<uint32_t>();
}

// The forward's mask into `bits` (when dropping); row_start: packed sequences' lengths.
void draw_keep_bits(cudaStream_t stream, const AttentionDims& d, const DropoutSpec& drop, uint32_t* bits,
                    const int32_t* row_start) {
  if (!bits) return;
  const int W = keep_words(d.seq), span = window_words(W, d.window);
  const int64_t rows = int64_t(d.batch) * d.heads * d.seq;
  const int blocks = blocks_for(rows * span);
  if (rows * span + int64_t(blocks) * kThreads <= int64_t(UINT32_MAX))
    keep_bits_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(drop, d.seq, W, d.window, span, uint32_t(rows), bits,
                                                                row_start, d.heads);
  else
    keep_bits_kernel<uint64_t><<<blocks, kThreads, 0, stream>>>(drop, d.seq, W, d.window, span, uint64_t(rows), bits,
                                                                row_start, d.heads);
  HONE_CUDA_LAUNCH_CHECK();
}

// The Hopper kernels' TMA map of the keep bits (box_rows rows of four words: 128 keys); a
// zeroed map when nothing is dropped.
CUtensorMap keep_bits_map(const AttentionDims& d, const uint32_t* bits, int box_rows) {
  if (!bits) return CUtensorMap{};
  return flash::hopper_bits_map(bits, int64_t(d.batch) * d.heads * d.seq, keep_words(d.seq), box_rows);
}

}  // namespace

int keep_words(int seq) { return (seq + 127) / 128 * 4; }

bool flash_supports_head_dim(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

FlashScratch flash_scratch(const AttentionDims& d) {
  const auto aligned = [](int64_t floats) { return (floats + 63) / 64 * 64; };  // 256-byte regions
  const int64_t tokens = int64_t(d.batch) * d.seq;
  FlashScratch f{};
  int64_t at = 0;
  f.dq_accum = at, at += aligned(tokens * d.hidden());
  f.row_dot = at, at += aligned(tokens * d.heads);
  f.key_lengths = at, at += aligned(d.batch);
  f.total = at;
  return f;
}

namespace {

// The forward of a call, padded (a.row_start null, T = B S) or packed (T rows of qkv).
void run_forward(cudaStream_t stream, flash::ForwardArgs a, const Tensor& qkv, int64_t T, const AttentionDims& d,
                 uint32_t* bits) {
  draw_keep_bits(stream, d, a.drop, bits, a.row_start);
  a.window = d.window;
  if (d.first_rows_only) a.query_rows = 1;
  dispatch(qkv.dtype, d.head_dim, [&](auto type, auto dim) {
    using T16 = typename decltype(type)::type;
    constexpr int D = decltype(dim)::value;
    if constexpr (flash::hopper_head_dim(D)) {
      if (use_hopper(d)) {
        // Packed, a tile that runs past a sequence's end reads the next one's rows (or TMA's
        // zeros past the last): their keys are masked and their queries' results not written.
        const bool bf16 = qkv.dtype == DType::BF16;
        constexpr int q_rows = flash::hopper_forward_rows(D);
        const CUtensorMap map = flash::hopper_tile_map(qkv.data, bf16, T, 3 * d.hidden(), 128, std::min(D, 64));
        const CUtensorMap q_map = flash::hopper_tile_map(qkv.data, bf16, T, 3 * d.hidden(), q_rows, std::min(D, 64));
        flash::launch_hopper_forward<T16, D>(a, map, q_map, keep_bits_map(d, bits, q_rows), d.batch, sm_count(),
                                             stream);
        return;
      }
    }
    flash::launch_forward<T16, D>(a, d.batch, stream);
  });
}

// The backward of a call over T rows of qkv (B S padded, or the packed rows): D =
// rowsum(dctx * ctx), the kernel, and dQ from its F32 accumulator.
void run_backward(cudaStream_t stream, flash::BackwardArgs a, const Tensor& dctx, const Tensor& qkv,
                  const Tensor& ctx, int64_t T, const AttentionDims& d, Tensor& dqkv, Tensor& workspace) {
  const int64_t H = d.hidden();
  check_tensor(dctx, qkv.dtype, T * H, "dctx");
  check_tensor(ctx, qkv.dtype, T * H, "ctx");
  check_tensor(dqkv, qkv.dtype, T * 3 * H, "dqkv");
  const FlashScratch f = flash_scratch(d);
  check_tensor(workspace, DType::F32, f.total, "the attention workspace");
  float* row_dot = workspace.f32() + f.row_dot;
  a.dq_accum = workspace.f32() + f.dq_accum;
  a.row_dot = row_dot;
  a.window = d.window;
  HONE_CUDA_CHECK(cudaMemsetAsync(a.dq_accum, 0, size_t(T * H) * sizeof(float), stream));
  dispatch(qkv.dtype, d.head_dim, [&](auto type, auto dim) {
    using T16 = typename decltype(type)::type;
    constexpr int D = decltype(dim)::value;
    const int64_t items = int64_t(d.batch) * d.seq * d.heads;
    row_dot_kernel<T16, D><<<blocks_for(items * (D / 8)), kThreads, 0, stream>>>(
        static_cast<const T16*>(dctx.data), static_cast<const T16*>(ctx.data), row_dot, items,
        d.seq, d.heads, a.row_start);
    HONE_CUDA_LAUNCH_CHECK();
    if constexpr (flash::hopper_head_dim(D)) {
      if (use_hopper(d)) {
        const bool bf16 = qkv.dtype == DType::BF16;
        const CUtensorMap qkv_map = flash::hopper_tile_map(qkv.data, bf16, T, 3 * H, 64, std::min(D, 64));
        const CUtensorMap dctx_map = flash::hopper_tile_map(dctx.data, bf16, T, H, 64, std::min(D, 64));
        const CUtensorMap bits_map = keep_bits_map(d, a.keep_bits, 64);
        flash::launch_hopper_backward<T16, D>(a, qkv_map, dctx_map, bits_map, d.batch, sm_count(), stream);
      } else {
        flash::launch_backward<T16, D>(a, d.batch, stream);
      }
    } else {
      flash::launch_backward<T16, D>(a, d.batch, stream);
    }
    dq_store_kernel<T16><<<blocks_for(T * (H / 8)), kThreads, 0, stream>>>(a.dq_accum, static_cast<T16*>(dqkv.data),
                                                                           T, int(H), d.scale);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void flash_forward(cudaStream_t stream, const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                   const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace) {
  const bool kernel_reads_mask = use_hopper(d) && flash::mask_lengths_in_kernel(d.batch, d.seq);
  const int32_t* key_lengths = prepare(stream, qkv, mask, stats, d, drop, workspace, kernel_reads_mask);
  const int64_t T = int64_t(d.batch) * d.seq;
  check_tensor(ctx, qkv.dtype, T * d.hidden(), "ctx");
  uint32_t* bits = keep_bits(keep, d, drop);
  const flash::ForwardArgs a{qkv.data, mask.ptr<int32_t>(), key_lengths, ctx.data,
                             reinterpret_cast<float2*>(stats.f32()), d.seq, d.heads, d.scale * kLog2e, drop,
                             keep_scale(drop), bits, keep_words(d.seq)};
  run_forward(stream, a, qkv, T, d, bits);
}

void flash_forward_packed(cudaStream_t stream, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                          const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx) {
  check_packed(qkv, row_start, d, drop);
  const int64_t T = qkv.shape[0];
  check_tensor(ctx, qkv.dtype, T * d.hidden(), "ctx");
  const bool training = stats.data != nullptr;
  if (training) check_tensor(stats, DType::F32, int64_t(d.batch) * d.seq * d.heads * 2, "stats");
  HONE_CHECK(training || drop.p == 0.0f, "packed flash attention: dropout without the statistics of a backward");
  uint32_t* bits = keep_bits(keep, d, drop);
  flash::ForwardArgs a{qkv.data, nullptr, nullptr, ctx.data,
                       training ? reinterpret_cast<float2*>(stats.f32()) : nullptr, d.seq, d.heads,
                       d.scale * kLog2e, drop, keep_scale(drop), bits, keep_words(d.seq)};
  a.row_start = row_start.ptr<int32_t>();
  run_forward(stream, a, qkv, T, d, bits);
}

void flash_backward(cudaStream_t stream, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                    const Tensor& mask, const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                    const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) {
  const int32_t* key_lengths = prepare(stream, qkv, mask, stats, d, drop, workspace);
  const flash::BackwardArgs a{qkv.data, dctx.data, mask.ptr<int32_t>(), key_lengths,
                              reinterpret_cast<const float2*>(stats.f32()), nullptr, nullptr, dqkv.data, d.seq,
                              d.heads, d.scale, d.scale * kLog2e, drop, keep_scale(drop), keep_bits(keep, d, drop),
                              keep_words(d.seq)};
  run_backward(stream, a, dctx, qkv, ctx, int64_t(d.batch) * d.seq, d, dqkv, workspace);
}

void flash_backward_packed(cudaStream_t stream, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                           const Tensor& row_start, const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                           const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) {
  check_packed(qkv, row_start, d, drop);
  check_tensor(stats, DType::F32, int64_t(d.batch) * d.seq * d.heads * 2, "stats");
  flash::BackwardArgs a{qkv.data, dctx.data, nullptr, nullptr, reinterpret_cast<const float2*>(stats.f32()),
                        nullptr, nullptr, dqkv.data, d.seq, d.heads, d.scale, d.scale * kLog2e, drop,
                        keep_scale(drop), keep_bits(keep, d, drop), keep_words(d.seq)};
  a.row_start = row_start.ptr<int32_t>();
  run_backward(stream, a, dctx, qkv, ctx, qkv.shape[0], d, dqkv, workspace);
}

}  // namespace hone::cuda
