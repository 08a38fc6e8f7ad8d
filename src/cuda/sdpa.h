#pragma once
// Fused (flash) scaled-dot-product attention for BF16 / F16 through cuDNN's backend graph
// API (cudnnBackend*, no cudnn-frontend): hone builds the composite operation graphs that
// cuDNN recognises as its SDPA forward and backward (docs/design/fused-attention.md lists
// every operation), finalizes one execution plan per problem on first use and caches it.
//
// Layout: Q, K and V are strided views into hone's qkv [B*S, 3H] (Q in columns [0, H), K in
// [H, 2H), V in [2H, 3H), head h at h*head_dim), the context is [B*S, H] and dq, dk, dv land
// in the same views of dqkv. Nothing is copied.
// Masking: per-sequence lengths, seq_q[b] (every query row of hone's attention is live, so
// S) and seq_kv[b] (keys [0, seq_kv[b]) are attended to, the rest get probability 0), both
// I32 device arrays of B. So a mask must be right-padded.
// Dropout on the probabilities with Philox, keyed by INT64 device scalars seed and offset;
// the backward regenerates the forward's mask from the same pair.
//
// This header does not need cuDNN: without it (HONE_HAVE_CUDNN undefined) the entry points
// fail with a message saying that fused attention needs cuDNN.
#include <cuda_runtime.h>

#include <cstdint>

#include "hone/dtype.h"

namespace hone::cuda {

// A backend's cuDNN handle (on the backend's stream) and its cache of execution plans.
struct SdpaCache;
// Whether BF16/F16 attention runs here rather than in hone's own kernels
// (flash_attention.h): the environment's HONE_ATTENTION, unset or "flash" for hone's
// kernels (the default: compiled into the binary, nothing to build at run time), "cudnn"
// for these. Any other value is an error.
bool cudnn_attention_selected();
// False when HONE_ATTENTION=flash2 asks for the mma.sync kernels on Hopper too.
bool hopper_attention_allowed();
// Creates the handle and checks the library (cuDNN >= 9.10.2) and the GPU (SM 8.0+).
SdpaCache* make_sdpa_cache(cudaStream_t stream);
void destroy_sdpa_cache(SdpaCache* cache) noexcept;  // null is fine

// Bytes of cuDNN workspace the caller reserves (the plans of 9.14 ask for 256 bytes); a
// plan that needs more is not used, and when every candidate does, building fails.
constexpr int64_t kSdpaWorkspaceBytes = int64_t(1) << 20;

struct SdpaProblem {
  DType dtype = DType::BF16;  // BF16 or F16: qkv, ctx, dctx, dqkv
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 1.0f;      // on Q K^T; passed by value, so not part of the plan
  float dropout_p = 0.0f;  // 0: the graphs without dropout; the plan is specific to p
};

// Device pointers of one forward call. All 16-byte aligned.
struct SdpaForward {
  const void* qkv;        // [B*S, 3H]
  void* ctx;              // [B*S, H], overwritten
  float* lse;             // F32 [B, heads, S]: log-sum-exp of each query row's scores
  const int32_t* seq_q;   // [B]
  const int32_t* seq_kv;  // [B]
  const int64_t* seed;    // [1], read only with dropout
  const int64_t* offset;  // [1], read only with dropout
  void* workspace;        // kSdpaWorkspaceBytes
};

// Device pointers of one backward call. All 16-byte aligned.
struct SdpaBackward {
  const void* qkv;        // [B*S, 3H]
  const void* ctx;        // [B*S, H]: the forward's output
  const void* dctx;       // [B*S, H]
  const float* lse;       // F32 [B, heads, S] from the forward
  void* dqkv;             // [B*S, 3H], overwritten where cuDNN writes (see attention.cu)
  float* softmax_sum;     // F32 [B, heads, S] scratch
  float* dq_accum;        // F32 [B, heads, S, head_dim] scratch (no initialisation needed)
  const int32_t* seq_q;
  const int32_t* seq_kv;
  const int64_t* seed;
  const int64_t* offset;
  void* workspace;        // kSdpaWorkspaceBytes
};

// Enqueue on the cache's stream; the plan for the problem is built on first use.
void sdpa_forward(SdpaCache& cache, const SdpaProblem& p, const SdpaForward& a);
void sdpa_backward(SdpaCache& cache, const SdpaProblem& p, const SdpaBackward& a);

}  // namespace hone::cuda
