// BERT embeddings (word + position + token type) and the [CLS] row gather/scatter.
// Row kernels give each block a row and its threads the columns, V at a time: V == 4
// (float4) when the width is a multiple of 4 and every base pointer is 16-byte aligned.
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

using cuda::Vec;

template <int V>
__global__ void embedding_forward_kernel(const int32_t* ids, const int32_t* types, const float* word, const float* pos,
                                         const float* type, int64_t tokens, int64_t hidden, int seq, float* out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const float* w = word + int64_t(ids[t]) * hidden;
    const float* p = pos + (t % seq) * hidden;
    const float* ty = type + int64_t(types[t]) * hidden;
    float* o = out + t * hidden;
    for (int64_t c = int64_t(threadIdx.x) * V; c < hidden; c += int64_t(blockDim.x) * V) {
      Vec<V> a = cuda::load_vec<V>(w + c);
      const Vec<V> b = cuda::load_vec<V>(p + c), e = cuda::load_vec<V>(ty + c);
#pragma unroll
      for (int k = 0; k < V; ++k) a.v[k] = a.v[k] + b.v[k] + e.v[k];  // the CPU's order
      cuda::store_vec<V>(o + c, a);
    }
  }
}

// Tokens per block in embedding_backward.
constexpr int64_t kTokenChunk = 32;

// Threads own columns; each block walks a chunk of consecutive tokens. Runs of tokens
// with the same word id or type (padding, segments) are summed in registers and added
// once, so the atomics to popular rows (type 0, the padding id) are far fewer than the
// tokens. Positions are all distinct within a chunk and are added directly.
__global__ void embedding_backward_kernel(const float* dout, const int32_t* ids, const int32_t* types,
                                          int64_t tokens, int64_t hidden, int seq, float* dword, float* dpos,
                                          float* dtype) {
  const int64_t chunks = (tokens + kTokenChunk - 1) / kTokenChunk;
  for (int64_t c = cuda::grid_start(); c < hidden; c += cuda::grid_stride())
    for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
      const int64_t t0 = chunk * kTokenChunk, t1 = t0 + kTokenChunk < tokens ? t0 + kTokenChunk : tokens;
      int32_t word_id = ids[t0], type_id = types[t0];
      float word_sum = 0.0f, type_sum = 0.0f;
      for (int64_t t = t0; t < t1; ++t) {
        const float g = dout[t * hidden + c];
        atomicAdd(dpos + (t % seq) * hidden + c, g);
        if (ids[t] != word_id) {
          atomicAdd(dword + int64_t(word_id) * hidden + c, word_sum);
          word_id = ids[t], word_sum = 0.0f;
        }
        word_sum += g;
        if (types[t] != type_id) {
          atomicAdd(dtype + int64_t(type_id) * hidden + c, type_sum);
          type_id = types[t], type_sum = 0.0f;
        }
        type_sum += g;
      }
      atomicAdd(dword + int64_t(word_id) * hidden + c, word_sum);
      atomicAdd(dtype + int64_t(type_id) * hidden + c, type_sum);
    }
}

// out[b] = hidden[b * seq]
template <int V>
__global__ void gather_first_tokens_kernel(const float* hidden, int64_t batch, int64_t width, int seq, float* out) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* h = hidden + b * seq * width;
    float* o = out + b * width;
    for (int64_t c = int64_t(threadIdx.x) * V; c < width; c += int64_t(blockDim.x) * V)
      cuda::store_vec<V>(o + c, cuda::load_vec<V>(h + c));
  }
}

// dhidden[r] = dout[r / seq] for r % seq == 0, else 0: one pass writes every row.
template <int V>
__global__ void scatter_first_tokens_kernel(const float* dout, int64_t rows, int64_t width, int seq,
                                            float* dhidden) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* d = r % seq == 0 ? dout + (r / seq) * width : nullptr;
    float* h = dhidden + r * width;
    for (int64_t c = int64_t(threadIdx.x) * V; c < width; c += int64_t(blockDim.x) * V)
      cuda::store_vec<V>(h + c, d ? cuda::load_vec<V>(d + c) : Vec<V>{});
  }
}

}  // namespace

void CudaBackend::embedding_forward(const Tensor& ids, const Tensor& types, const Tensor& word, const Tensor& pos,
                                    const Tensor& type, int seq, Tensor& out) {
  const int64_t tokens = ids.numel(), hidden = word.shape[1];
  if (tokens == 0 || hidden == 0) return;
  const int32_t *ip = ids.ptr<int32_t>(), *tp = types.ptr<int32_t>();
  const float *wp = word.f32(), *pp = pos.f32(), *typ = type.f32();
  float* op = out.f32();
  const bool vec = hidden % 4 == 0 && cuda::aligned16(wp) && cuda::aligned16(pp) && cuda::aligned16(typ) &&
                   cuda::aligned16(op);
  const int blocks = cuda::blocks_for_rows(tokens);
  if (vec)
    embedding_forward_kernel<4><<<blocks, cuda::kThreads, 0, stream()>>>(ip, tp, wp, pp, typ, tokens, hidden, seq, op);
  else
    embedding_forward_kernel<1><<<blocks, cuda::kThreads, 0, stream()>>>(ip, tp, wp, pp, typ, tokens, hidden, seq, op);
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& types, int seq,
                                     Tensor& dword, Tensor& dpos, Tensor& dtype) {
  const int64_t tokens = ids.numel(), hidden = dword.shape[1];
  if (tokens == 0 || hidden == 0) return;
  const int64_t chunks = (tokens + kTokenChunk - 1) / kTokenChunk;
  const dim3 grid(unsigned(std::min<int64_t>((hidden + cuda::kThreads - 1) / cuda::kThreads, 65535)),
                  unsigned(std::min<int64_t>(chunks, 65535)));
  embedding_backward_kernel<<<grid, cuda::kThreads, 0, stream()>>>(dout.f32(), ids.ptr<int32_t>(),
                                                                   types.ptr<int32_t>(), tokens, hidden, seq,
                                                                   dword.f32(), dpos.f32(), dtype.f32());
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::gather_first_tokens(const Tensor& hidden, int seq, Tensor& out) {
  const int64_t batch = out.shape[0], width = out.shape[1];
  if (batch == 0 || width == 0) return;
  const float* hp = hidden.f32();
  float* op = out.f32();
  const int blocks = cuda::blocks_for_rows(batch);
  if (width % 4 == 0 && cuda::aligned16(hp) && cuda::aligned16(op))
    gather_first_tokens_kernel<4><<<blocks, cuda::kThreads, 0, stream()>>>(hp, batch, width, seq, op);
  else
    gather_first_tokens_kernel<1><<<blocks, cuda::kThreads, 0, stream()>>>(hp, batch, width, seq, op);
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::scatter_first_tokens(const Tensor& dout, int seq, Tensor& dhidden) {
  const int64_t rows = dhidden.shape[0], width = dhidden.shape[1];
  if (rows == 0 || width == 0) return;
  const float* dp = dout.f32();
  float* hp = dhidden.f32();
  const int blocks = cuda::blocks_for_rows(rows);
  if (width % 4 == 0 && cuda::aligned16(dp) && cuda::aligned16(hp))
    scatter_first_tokens_kernel<4><<<blocks, cuda::kThreads, 0, stream()>>>(dp, rows, width, seq, hp);
  else
    scatter_first_tokens_kernel<1><<<blocks, cuda::kThreads, 0, stream()>>>(dp, rows, width, seq, hp);
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace hone
