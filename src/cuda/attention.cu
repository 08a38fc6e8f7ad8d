// Scaled dot-product self-attention, with the semantics of src/ops/attention.cpp.
//
// F32: the products are cuBLAS strided-batched GEMMs over the heads of one sequence (head
// h's Q, K and V start h*head_dim columns further, leading dimension 3H), one call per
// sequence; the masked softmax with dropout and its backward are row kernels. Products
// are written column-major, so each computes the transpose of the row-major result.
// The [B, heads, S, S] probabilities live only in the workspace: backward recomputes
// them from the scores and the saved per-row {max, 1 / sum}. A window (d.window) is applied
// in the row kernels (keys outside it get probability 0); the products stay [S, S].
//
// BF16 / F16: hone's flash attention (flash_attention.h), no [S, S] matrix anywhere, with
// the F32 path's semantics and dropout masks; stats keeps {max, 1 / sum} of each query row
// (the max in base-2 units). HONE_ATTENTION=cudnn runs cuDNN's fused flash attention
// (sdpa.h) instead: its mask becomes per-sequence key lengths, so it must be right-padded
// (ones, then zeros; the caller guarantees it); stats keeps the log-sum-exp of each query
// row in its first B*heads*S floats, and dropout draws cuDNN's own Philox mask (not
// attention_keep's): the same DropoutSpec gives the same mask in forward and backward, but
// not the F32 path's mask. cuDNN's graph here has no band mask, so a windowed call runs
// hone's flash kernels even then (cudnn_runs), with their stats and dropout masks.
#include <algorithm>
#include <cfloat>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/flash_attention.h"
#include "cuda/kernels.h"
#include "cuda/rows.h"
#include "cuda/sdpa.h"
#include "hone/philox.h"

namespace hone {

namespace {

constexpr int kGroups = 4;  // runs of W columns per thread: 512 columns fit one warp with W = 4

// d with its stream resolved (dropout_stream), read once per thread rather than per draw.
__device__ __forceinline__ DropoutSpec resolved(DropoutSpec d) {
  d.stream = dropout_stream(d);
  d.step = nullptr;
  return d;
}

// Dropout bits of columns [idx, idx + W) of the flat probs index (attention_keep's); with
// W = 4 idx is a multiple of 4, so the four halves lie in one Philox block. d is resolved.
template <int W>
__device__ __forceinline__ void keep_bits(DropoutSpec d, uint64_t idx, bool (&keep)[W]) {
  if constexpr (W == 4) {
    const Philox4 r = philox_block(d.seed, d.stream, idx >> 3);
    const uint32_t threshold = attention_keep_threshold(d.p), first = uint32_t(idx & 7) / 2;
    #pragma unroll
    for (int t = 0; t < 4; ++t) keep[t] = attention_half_kept(r.v[first + t / 2], t & 1, threshold);
  } else {
    keep[0] = attention_keep(d.seed, d.stream, idx, d.p);
  }
}

// A score as the softmax takes it: -inf outside the query's window (no weight, whatever
// the mask), the score plus -FLT_MAX for a masked key.
__device__ __forceinline__ float windowed_score(float score, int32_t mask, int window, int query, int key) {
  if (outside_window(window, query, key)) return -INFINITY;
  return mask == 0 ? score + -FLT_MAX : score;
}

// probs holds the scaled scores [rows, S] and becomes the softmax over each row; masked
// keys (mask[b, j] == 0) get -FLT_MAX added, as on the CPU, so a row with every key
// masked is uniform, and keys outside the query's window get probability 0. stats
// receives each row's {max, 1 / sum}. With dropout, probs receives dropout(probs)
// instead: backward recomputes the rest.
template <int W>
__global__ void __launch_bounds__(1024) softmax_forward_kernel(float* __restrict__ probs, const int32_t* __restrict__ mask,
                                       float* __restrict__ stats, bool dropping, int64_t rows, int S,
                                       int rows_per_seq, int window, DropoutSpec drop, float keep_scale) {
  drop = resolved(drop);
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;  // dead threads still take part in the reductions
  float* p = probs + row * S;
  const int32_t* m = mask + (live ? row / rows_per_seq : 0) * S;
  const int query = int(row % S);
  float v[kGroups][W];
  float mx = -INFINITY;
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (live && c < S) {
      int32_t mk[W];
      cuda::load<W>(p + c, v[g]);
      cuda::load<W>(m + c, mk);
      #pragma unroll
      for (int t = 0; t < W; ++t) {
        v[g][t] = windowed_score(v[g][t], mk[t], window, query, c + t);
        mx = fmaxf(mx, v[g][t]);
      }
    }
  }
  mx = cuda::row_max(mx);
  float sum = 0.0f;
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (live && c < S)
      #pragma unroll
      for (int t = 0; t < W; ++t) sum += v[g][t] = expf(v[g][t] - mx);
  }
  const float inv = 1.0f / cuda::row_sum(sum);
  if (live && threadIdx.x == 0) {
    stats[2 * row] = mx;
    stats[2 * row + 1] = inv;
  }
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= S) continue;
    #pragma unroll
    for (int t = 0; t < W; ++t) v[g][t] *= inv;
    if (dropping) {
      bool keep[W];
      keep_bits<W>(drop, uint64_t(row) * S + c, keep);
      #pragma unroll
      for (int t = 0; t < W; ++t) v[g][t] = keep[t] ? v[g][t] * keep_scale : 0.0f;
    }
    cuda::store<W>(p + c, v[g]);
  }
}

// probs holds the recomputed scaled scores and becomes the forward's probabilities
// again (exp(score - max) * inv: the forward's own arithmetic, so the same bits).
// grad holds d(dropout(probs)) = dctx V^T and becomes d(scores) / scale:
// dS = P * (g - sum(g * P)), g = d(probs) = keep * scale * grad. probs ends holding
// dropout(P) (P itself without dropout), the operand of dV.
template <int W>
__global__ void __launch_bounds__(1024) softmax_backward_kernel(float* __restrict__ probs, const int32_t* __restrict__ mask,
                                        const float* __restrict__ stats, float* __restrict__ grad,
                                        bool dropping, int64_t rows, int S, int rows_per_seq, int window,
                                        DropoutSpec drop, float keep_scale) {
  drop = resolved(drop);
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;
  float* p = probs + row * S;
  const int32_t* m = mask + (live ? row / rows_per_seq : 0) * S;
  const int query = int(row % S);
  const float mx = live ? stats[2 * row] : 0.0f, inv = live ? stats[2 * row + 1] : 0.0f;
  float* gr = grad + row * S;
  float pv[kGroups][W], gv[kGroups][W];
  float dot = 0.0f;
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= S) continue;
    int32_t mk[W];
    cuda::load<W>(p + c, pv[g]);
    cuda::load<W>(m + c, mk);
    #pragma unroll
    for (int t = 0; t < W; ++t) pv[g][t] = expf(windowed_score(pv[g][t], mk[t], window, query, c + t) - mx) * inv;
    cuda::load<W>(gr + c, gv[g]);
    if (dropping) {
      bool keep[W];
      float out[W];
      keep_bits<W>(drop, uint64_t(row) * S + c, keep);
      #pragma unroll
      for (int t = 0; t < W; ++t) {
        out[t] = keep[t] ? pv[g][t] * keep_scale : 0.0f;
        gv[g][t] = keep[t] ? gv[g][t] * keep_scale : 0.0f;
      }
      cuda::store<W>(p + c, out);
    } else {
      cuda::store<W>(p + c, pv[g]);
    }
    #pragma unroll
    for (int t = 0; t < W; ++t) dot += gv[g][t] * pv[g][t];
  }
  dot = cuda::row_sum(dot);
  #pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int c = (g * blockDim.x + threadIdx.x) * W;
    if (!live || c >= S) continue;
    #pragma unroll
    for (int t = 0; t < W; ++t) gv[g][t] = pv[g][t] * (gv[g][t] - dot);
    cuda::store<W>(gr + c, gv[g]);
  }
}

// Column-major C = alpha op(A) op(B) for each of `batch` heads, C overwritten: one
// strided-batched cuBLASLt product.
void heads_gemm(CudaBackend& be, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                const float* a, int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b, float* c,
                int ldc, int64_t stride_c, int batch) {
  CudaBackend::LtGemm g{ta, tb, m, n, k, a, lda, b, ldb, c, ldc, 0.0f};
  g.alpha = alpha;
  g.batch = batch;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_d = stride_c;
  be.lt_matmul(g);
}

// Where sequence b's operands start: Q, K, V and their gradients in [B*S, 3H], the
// context in [B*S, H], the [heads, S, S] blocks in probs and the workspace.
struct SeqOffsets {
  int64_t qkv, ctx, probs;
};

SeqOffsets seq_offsets(const AttentionDims& d, int b) {
  const int64_t S = d.seq;
  return {b * S * 3 * d.hidden(), b * S * d.hidden(), b * int64_t(d.heads) * S * S};
}

// ---------------------------------------------------------------- cuDNN (BF16 / F16, HONE_ATTENTION=cudnn)

// Where the fused path's scratch lies in the attention workspace, in F32 elements; each
// region starts 256-byte aligned (cuDNN's tensors declare 16).
struct FusedScratch {
  int64_t softmax_sum, dq_accum, seq_q, seq_kv, rng, cudnn, total;
};

FusedScratch fused_scratch(const AttentionDims& d) {
  const auto aligned = [](int64_t floats) { return (floats + 63) / 64 * 64; };
  const int64_t rows = int64_t(d.batch) * d.heads * d.seq;
  FusedScratch f{};
  int64_t at = 0;
  f.softmax_sum = at, at += aligned(rows);                  // F32 [B, heads, S]
  f.dq_accum = at, at += aligned(rows * d.head_dim);        // F32 [B, heads, S, head_dim]
  f.seq_q = at, at += aligned(d.batch);                     // I32 [B]
  f.seq_kv = at, at += aligned(d.batch);                    // I32 [B]
  f.rng = at, at += aligned(8);                             // I64 seed at [0], offset at [2]
  f.cudnn = at, at += cuda::kSdpaWorkspaceBytes / int64_t(sizeof(float));  // the plan's own
  f.total = at;
  return f;
}

// cuDNN's Philox seed for one call site: forward and backward of a site agree (same spec),
// sites and steps differ (their (seed, stream) pairs differ).
__device__ int64_t philox_seed(const DropoutSpec& drop) {
  uint64_t z = drop.seed ^ (dropout_stream(drop) * 0x9E3779B97F4A7C15ull);  // splitmix64
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return int64_t((z ^ (z >> 31)) >> 1);  // non-negative, as the seeds cuDNN's samples use
}

// One block per sequence: seq_q[b] = S (every query row is live, as in Hugging Face, where
// padded queries still attend to the valid keys) and seq_kv[b] = the ones of mask row b
// (keys past it get probability 0: right padding). A row without any one gets S, so that
// it stays finite (Hugging Face makes such a row uniform; it has no valid token anyway).
// Block 0 also writes the Philox seed of `drop` and the offset (0).
__global__ void fused_lengths_kernel(const int32_t* __restrict__ mask, int S, int32_t* __restrict__ seq_q,
                                     int32_t* __restrict__ seq_kv, int64_t* __restrict__ rng, DropoutSpec drop) {
  __shared__ int scratch[32];
  const int b = blockIdx.x;
  int ones = 0;
  for (int j = threadIdx.x; j < S; j += blockDim.x) ones += mask[int64_t(b) * S + j] != 0;
  ones = cuda::block_sum(ones, scratch);
  if (threadIdx.x == 0) {
    seq_q[b] = S;
    seq_kv[b] = ones > 0 ? ones : S;
    if (b == 0) rng[0] = philox_seed(drop), rng[2] = 0;  // 16 bytes apart: each tensor is 16-byte aligned
  }
}

// Keys at or past seq_kv[b] have probability 0 everywhere, so their dK and dV are 0. cuDNN
// bounds those products by seq_kv and need not write the rows past it: this writes them
// (columns [H, 3H) of dqkv, 8 halves per 16-byte store; H is a multiple of 8).
__global__ void zero_padded_key_grads_kernel(uint16_t* __restrict__ dqkv, const int32_t* __restrict__ seq_kv,
                                             int64_t rows, int S, int H) {
  const int vecs = 2 * H / 8;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (int(r % S) < seq_kv[r / S]) continue;
    int4* row = reinterpret_cast<int4*>(dqkv + r * 3 * H + H);
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) row[v] = make_int4(0, 0, 0, 0);
  }
}

cuda::SdpaProblem sdpa_problem(const Tensor& qkv, const AttentionDims& d, const DropoutSpec& drop) {
  return {qkv.dtype, d.batch, d.seq, d.heads, d.head_dim, d.scale, drop.p > 0.0f ? drop.p : 0.0f};
}

void check_fused_tensor(const Tensor& t, DType want, int64_t numel, const char* what) {
  if (t.dtype != want || t.numel() < numel)
    fail("fused attention: {} is {} {}, expected {} with at least {} elements", what, dtype_name(t.dtype),
         t.shape.str(), dtype_name(want), numel);
}

// The scratch pointers of one call, after checking the tensors the fused path reads.
struct FusedCall {
  float* ws;
  FusedScratch f;
  int32_t* seq_q;
  int32_t* seq_kv;
  int64_t* rng;
  void* cudnn_ws;
};

FusedCall fused_call(const Tensor& qkv, const Tensor& mask, const Tensor& stats, const AttentionDims& d,
                     const Tensor& workspace) {
  const int64_t T = int64_t(d.batch) * d.seq, H = d.hidden();
  check_fused_tensor(qkv, qkv.dtype, T * 3 * H, "qkv");
  check_fused_tensor(mask, DType::I32, T, "mask");
  check_fused_tensor(stats, DType::F32, T * d.heads, "stats");
  FusedCall c{};
  c.f = fused_scratch(d);
  check_fused_tensor(workspace, DType::F32, c.f.total, "the attention workspace");
  c.ws = workspace.f32();
  c.seq_q = reinterpret_cast<int32_t*>(c.ws + c.f.seq_q);
  c.seq_kv = reinterpret_cast<int32_t*>(c.ws + c.f.seq_kv);
  c.rng = reinterpret_cast<int64_t*>(c.ws + c.f.rng);
  c.cudnn_ws = c.ws + c.f.cudnn;
  return c;
}

void launch_fused_lengths(cudaStream_t stream, const Tensor& mask, const AttentionDims& d, const DropoutSpec& drop,
                          const FusedCall& c) {
  fused_lengths_kernel<<<d.batch, cuda::kThreads, 0, stream>>>(mask.ptr<int32_t>(), d.seq, c.seq_q, c.seq_kv, c.rng,
                                                                drop);
  HONE_CUDA_LAUNCH_CHECK();
}

void fused_forward(cuda::SdpaCache*& cache, cudaStream_t stream, const Tensor& qkv, const Tensor& mask,
                   const AttentionDims& d, const DropoutSpec& drop, Tensor& stats, Tensor& ctx, Tensor& workspace) {
  const FusedCall c = fused_call(qkv, mask, stats, d, workspace);
  check_fused_tensor(ctx, qkv.dtype, int64_t(d.batch) * d.seq * d.hidden(), "ctx");
  if (!cache) cache = cuda::make_sdpa_cache(stream);  // fails clearly without cuDNN
  launch_fused_lengths(stream, mask, d, drop, c);
  cuda::sdpa_forward(*cache, sdpa_problem(qkv, d, drop),
                     {qkv.data, ctx.data, stats.f32(), c.seq_q, c.seq_kv, c.rng, c.rng + 2, c.cudnn_ws});
}

void fused_backward(cuda::SdpaCache*& cache, cudaStream_t stream, const Tensor& dctx, const Tensor& qkv,
                    const Tensor& ctx, const Tensor& mask, const Tensor& stats, const AttentionDims& d, const DropoutSpec& drop,
                    Tensor& dqkv, Tensor& workspace) {
  const FusedCall c = fused_call(qkv, mask, stats, d, workspace);
  const int64_t T = int64_t(d.batch) * d.seq, H = d.hidden();
  check_fused_tensor(dctx, qkv.dtype, T * H, "dctx");
  check_fused_tensor(ctx, qkv.dtype, T * H, "ctx");
  check_fused_tensor(dqkv, qkv.dtype, T * 3 * H, "dqkv");
  if (!cache) cache = cuda::make_sdpa_cache(stream);
  launch_fused_lengths(stream, mask, d, drop, c);
  const cuda::SdpaProblem p = sdpa_problem(qkv, d, drop);
  float* softmax_sum = c.ws + c.f.softmax_sum;
  cuda::sdpa_backward(*cache, p,
                      {qkv.data, ctx.data, dctx.data, stats.f32(), dqkv.data, softmax_sum, c.ws + c.f.dq_accum, c.seq_q,
                       c.seq_kv, c.rng, c.rng + 2, c.cudnn_ws});
  zero_padded_key_grads_kernel<<<cuda::blocks_for_rows(T), 128, 0, stream>>>(dqkv.ptr<uint16_t>(), c.seq_kv, T,
                                                                               d.seq, int(H));
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace

// Whether this BF16/F16 call runs cuDNN's fused attention: under HONE_ATTENTION=cudnn,
// unless it has a window (hone's flash kernels take those: the cuDNN graph of sdpa.cpp has
// no band mask).
bool CudaBackend::cudnn_runs(const AttentionDims& d) const { return cudnn_attention_ && d.window < 0; }

// F32: two [B, heads, S, S] blocks, the (dropped) probabilities and d(probs). BF16 / F16:
// the flash kernels' scratch (dominated by the dQ accumulator, B*S*H floats), or cuDNN's
// (the same accumulator, and 1 MiB for cuDNN). Under HONE_ATTENTION=cudnn the larger of
// the two, whatever the window, so that a workspace planned from one layer's dims serves
// a model whose local (windowed, flash) and global (cuDNN) layers share it.
int64_t CudaBackend::attention_workspace_elems(const AttentionDims& d, DType t) const {
  if (t == DType::F32) return 2 * int64_t(d.batch) * d.heads * d.seq * d.seq;
  if (t == DType::BF16 || t == DType::F16)
    return cudnn_attention_ ? std::max(fused_scratch(d).total, cuda::flash_scratch(d).total)
                            : cuda::flash_scratch(d).total;
  fail("attention on CUDA: dtype {} is not a floating compute dtype", dtype_name(t));
}

// The flash kernels keep their mask for backward; cuDNN draws its own again, and the F32
// path redraws attention_keep's.
int CudaBackend::attention_keep_words(const AttentionDims& d, DType t) const {
  return t != DType::F32 && !cudnn_runs(d) ? cuda::keep_words(d.seq) : 0;
}

void CudaBackend::attention_forward(const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                                    const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx,
                                    Tensor& workspace) {
  if (qkv.dtype != DType::F32) {
    if (cudnn_runs(d)) return fused_forward(sdpa_, stream_, qkv, mask, d, drop, stats, ctx, workspace);
    return cuda::flash_forward(stream_, qkv, mask, d, drop, stats, keep, ctx, workspace);
  }
  const int S = d.seq, H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const int64_t SS = int64_t(S) * S, rows = int64_t(d.batch) * d.heads * S;
  const bool dropping = drop.p > 0.0f;
  Tensor probs = workspace;
  const float* q = qkv.f32();
  // scores^T = K Q^T per head, straight into probs
  for (int b = 0; b < d.batch; ++b) {
    const SeqOffsets o = seq_offsets(d, b);
    heads_gemm(*this, CUBLAS_OP_T, CUBLAS_OP_N, S, S, hd, d.scale, q + o.qkv + H, ld, hd, q + o.qkv, ld, hd,
               probs.f32() + o.probs, S, SS, d.heads);
  }
  const float keep_scale = dropping ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int32_t* m = mask.ptr<int32_t>();
  if (cuda::vec4_ok(S, {probs.data, m})) {
    const cuda::RowLaunch l = cuda::row_launch("attention_forward", rows, S, 4, kGroups);
    softmax_forward_kernel<4><<<l.grid, l.block, 0, stream_>>>(probs.f32(), m, stats.f32(), dropping, rows, S,
                                                                d.heads * S, d.window, drop, keep_scale);
  } else {
    const cuda::RowLaunch l = cuda::row_launch("attention_forward", rows, S, 1, kGroups);
    softmax_forward_kernel<1><<<l.grid, l.block, 0, stream_>>>(probs.f32(), m, stats.f32(), dropping, rows, S,
                                                                d.heads * S, d.window, drop, keep_scale);
  }
  HONE_CUDA_LAUNCH_CHECK();
  // ctx^T = V^T P^T per head
  const float* p = probs.f32();  // dropout(P), or P without dropout
  for (int b = 0; b < d.batch; ++b) {
    const SeqOffsets o = seq_offsets(d, b);
    heads_gemm(*this, CUBLAS_OP_N, CUBLAS_OP_N, hd, S, S, 1.0f, q + o.qkv + 2 * H, ld, hd, p + o.probs, S, SS,
               ctx.f32() + o.ctx, H, hd, d.heads);
  }
}

bool CudaBackend::packs_attention(const AttentionDims& d, DType t) const {
  return t != DType::F32 && cuda::flash_supports_head_dim(d.head_dim);
}

// Training keeps hone's flash kernels' statistics and keep bits: not where cuDNN runs.
bool CudaBackend::packs_training_attention(const AttentionDims& d, DType t) const {
  return packs_attention(d, t) && !cudnn_runs(d);
}

void CudaBackend::attention_forward_packed(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                                           const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx,
                                           Tensor&) {
  cuda::flash_forward_packed(stream_, qkv, row_start, d, drop, stats, keep, ctx);
}

void CudaBackend::attention_backward_packed(const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                            const Tensor& row_start, const Tensor& stats, const Tensor& keep,
                                            const AttentionDims& d, const DropoutSpec& drop, Tensor& dqkv,
                                            Tensor& workspace) {
  cuda::flash_backward_packed(stream_, dctx, qkv, ctx, row_start, stats, keep, d, drop, dqkv, workspace);
}

void CudaBackend::attention_backward(const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& mask,
                                     const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                                     const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) {
  if (qkv.dtype != DType::F32) {
    if (cudnn_runs(d)) return fused_backward(sdpa_, stream_, dctx, qkv, ctx, mask, stats, d, drop, dqkv, workspace);
    return cuda::flash_backward(stream_, dctx, qkv, ctx, mask, stats, keep, d, drop, dqkv, workspace);
  }
  const int S = d.seq, H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const int64_t SS = int64_t(S) * S, rows = int64_t(d.batch) * d.heads * S;
  const bool dropping = drop.p > 0.0f;
  Tensor probs = workspace;
  float* grad = workspace.f32() + rows * S;
  const float *q = qkv.f32(), *dc = dctx.f32();
  float* dq = dqkv.f32();
  // The forward's scores again, into the probabilities' block (the kernel below turns them
  // into probabilities with the saved statistics).
  for (int b = 0; b < d.batch; ++b) {
    const SeqOffsets o = seq_offsets(d, b);
    heads_gemm(*this, CUBLAS_OP_T, CUBLAS_OP_N, S, S, hd, d.scale, q + o.qkv + H, ld, hd, q + o.qkv, ld, hd,
               probs.f32() + o.probs, S, SS, d.heads);
  }
  // d(dropped probs)^T = V dctx^T per head
  for (int b = 0; b < d.batch; ++b) {
    const SeqOffsets o = seq_offsets(d, b);
    heads_gemm(*this, CUBLAS_OP_T, CUBLAS_OP_N, S, S, hd, 1.0f, q + o.qkv + 2 * H, ld, hd, dc + o.ctx, H, hd,
               grad + o.probs, S, SS, d.heads);
  }
  const float keep_scale = dropping ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int32_t* m = mask.ptr<int32_t>();
  if (cuda::vec4_ok(S, {probs.data, m, grad})) {
    const cuda::RowLaunch l = cuda::row_launch("attention_backward", rows, S, 4, kGroups);
    softmax_backward_kernel<4><<<l.grid, l.block, 0, stream_>>>(probs.f32(), m, stats.f32(), grad, dropping, rows, S,
                                                                 d.heads * S, d.window, drop, keep_scale);
  } else {
    const cuda::RowLaunch l = cuda::row_launch("attention_backward", rows, S, 1, kGroups);
    softmax_backward_kernel<1><<<l.grid, l.block, 0, stream_>>>(probs.f32(), m, stats.f32(), grad, dropping, rows, S,
                                                                 d.heads * S, d.window, drop, keep_scale);
  }
  HONE_CUDA_LAUNCH_CHECK();
  const float* p = probs.f32();  // dropout(P), or P without dropout
  for (int b = 0; b < d.batch; ++b) {
    const SeqOffsets o = seq_offsets(d, b);
    // dV^T = dctx^T P_dropped, dQ^T = scale K^T dS^T, dK^T = scale Q^T dS
    heads_gemm(*this, CUBLAS_OP_N, CUBLAS_OP_T, hd, S, S, 1.0f, dc + o.ctx, H, hd, p + o.probs, S, SS,
               dq + o.qkv + 2 * H, ld, hd, d.heads);
    heads_gemm(*this, CUBLAS_OP_N, CUBLAS_OP_N, hd, S, S, d.scale, q + o.qkv + H, ld, hd, grad + o.probs, S, SS,
               dq + o.qkv, ld, hd, d.heads);
    heads_gemm(*this, CUBLAS_OP_N, CUBLAS_OP_T, hd, S, S, d.scale, q + o.qkv, ld, hd, grad + o.probs, S, SS,
               dq + o.qkv + H, ld, hd, d.heads);
  }
}

}  // namespace hone
