// Embeddings (word + position + token type) and the first-token row gather/scatter, in
// F32, BF16 or F16 (sums in F32; the parameter gradients stay F32). Row kernels give each
// block a row and its threads the columns, V at a time: V == kVec<T> (one 16-byte access:
// 4 floats or 8 halves) when the width is a multiple of it and every base pointer is
// 16-byte aligned, else 1.
#include <type_traits>

#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/kernels.h"

namespace hone {

namespace {

// V consecutive elements as floats: one element, or whole 16-byte accesses (a row of F32
// master weights read for a half-precision output takes two).
template <typename T, int V>
__device__ __forceinline__ void load_row(const T* p, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = cuda::to_float(*p);
  } else {
    constexpr int N = cuda::kVec<T>;
    static_assert(V % N == 0, "whole 16-byte accesses");
#pragma unroll
    for (int k = 0; k < V; k += N) {
      float part[N];
      cuda::load_floats(p + k, part);
#pragma unroll
      for (int j = 0; j < N; ++j) v[k + j] = part[j];
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_row(T* p, const float (&v)[V]) {
  if constexpr (V == 1) *p = cuda::from_float<T>(v[0]);
  else cuda::store_floats(p, v);
}

// Token t's position row (positions null: its column) and type row (types null: 0).
__device__ __forceinline__ int64_t position_row(const int32_t* positions, int64_t t, int seq) {
  return positions ? positions[t] : t % seq;
}
__device__ __forceinline__ int32_t type_row(const int32_t* types, int64_t t) { return types ? types[t] : 0; }

// type null: no type term (a family without token types); pos null: no position term
// (rotary positions, ModernBERT). Tables T, output O: the same dtype, or F32 tables (mixed
// precision's master weights) summed in F32 and rounded once.
template <typename T, typename O, int V>
__global__ void embedding_forward_kernel(const int32_t* ids, const int32_t* types, const int32_t* positions,
                                         const T* word, const T* pos, const T* type, int64_t tokens, int64_t hidden,
                                         int seq, O* out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const T* w = word + int64_t(ids[t]) * hidden;
    const T* p = pos ? pos + position_row(positions, t, seq) * hidden : nullptr;
    const T* ty = type ? type + int64_t(type_row(types, t)) * hidden : nullptr;
    O* o = out + t * hidden;
    for (int64_t c = int64_t(threadIdx.x) * V; c < hidden; c += int64_t(blockDim.x) * V) {
      float a[V], b[V], e[V];
      load_row(w + c, a);
      if (!p) {
        store_row(o + c, a);
        continue;
      }
      load_row(p + c, b);
      if (ty) {
        load_row(ty + c, e);
#pragma unroll
        for (int k = 0; k < V; ++k) a[k] = a[k] + b[k] + e[k];  // the CPU's order
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) a[k] = a[k] + b[k];
      }
      store_row(o + c, a);
    }
  }
}

// Tokens per block in embedding_backward.
constexpr int64_t kTokenChunk = 32;

// Threads own columns; each block walks a chunk of consecutive tokens. Runs of tokens
// with the same word id, type or position (padding, segments, RoBERTa's padding position)
// are summed in registers and added once, so the atomics to popular rows are far fewer
// than the tokens. dtype null: no type table; dpos null: no position table.
template <typename T>
__global__ void embedding_backward_kernel(const T* dout, const int32_t* ids, const int32_t* types,
                                          const int32_t* positions, int64_t tokens, int64_t hidden, int seq,
                                          float* dword, float* dpos, float* dtype) {
  const int64_t chunks = (tokens + kTokenChunk - 1) / kTokenChunk;
  for (int64_t c = cuda::grid_start(); c < hidden; c += cuda::grid_stride())
    for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
      const int64_t t0 = chunk * kTokenChunk, t1 = t0 + kTokenChunk < tokens ? t0 + kTokenChunk : tokens;
      int32_t word_id = ids[t0], type_id = type_row(types, t0);
      int64_t pos_id = position_row(positions, t0, seq);
      float word_sum = 0.0f, type_sum = 0.0f, pos_sum = 0.0f;
      for (int64_t t = t0; t < t1; ++t) {
        const float g = cuda::to_float(dout[t * hidden + c]);
        const int64_t p = position_row(positions, t, seq);
        if (dpos && p != pos_id) {
          atomicAdd(dpos + pos_id * hidden + c, pos_sum);
          pos_id = p, pos_sum = 0.0f;
        }
        pos_sum += g;
        if (ids[t] != word_id) {
          atomicAdd(dword + int64_t(word_id) * hidden + c, word_sum);
          word_id = ids[t], word_sum = 0.0f;
        }
        word_sum += g;
        if (dtype) {
          const int32_t ty = type_row(types, t);
          if (ty != type_id) {
            atomicAdd(dtype + int64_t(type_id) * hidden + c, type_sum);
            type_id = ty, type_sum = 0.0f;
          }
          type_sum += g;
        }
      }
      if (dpos) atomicAdd(dpos + pos_id * hidden + c, pos_sum);
      atomicAdd(dword + int64_t(word_id) * hidden + c, word_sum);
      if (dtype) atomicAdd(dtype + int64_t(type_id) * hidden + c, type_sum);
    }
}

// One thread per sequence: its running count of non-padding ids (sequences are short
// and few beside the rest of a step).
__global__ void position_ids_after_padding_kernel(const int32_t* ids, int32_t pad, int64_t rows, int seq,
                                                  int32_t* out) {
  for (int64_t r = cuda::grid_start(); r < rows; r += cuda::grid_stride()) {
    int32_t count = 0;
    for (int64_t t = r * seq; t < (r + 1) * seq; ++t) {
      count += ids[t] != pad;
      out[t] = ids[t] != pad ? pad + count : pad;
    }
  }
}

// Gather and scatter only move bits: U is the unit moved, int4 (16 bytes) for aligned
// rows, else an unsigned integer of the element's size; widths are in units.

// out[b] = hidden[b * seq]
template <typename U>
__global__ void gather_first_tokens_kernel(const U* hidden, int64_t batch, int64_t width, int seq, U* out) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const U* h = hidden + b * seq * width;
    U* o = out + b * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) o[c] = h[c];
  }
}

// dst[i] = src[rows[i]]
template <typename U>
__global__ void gather_rows_kernel(const U* src, const int32_t* rows, int64_t n, int64_t width, U* dst) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const U* s = src + int64_t(rows[i]) * width;
    U* d = dst + i * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
  }
}

// dst[rows[i]] = src[i] (the other rows zeroed beforehand)
template <typename U>
__global__ void scatter_rows_kernel(const U* src, const int32_t* rows, int64_t n, int64_t width, U* dst) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const U* s = src + i * width;
    U* d = dst + int64_t(rows[i]) * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
  }
}

// dhidden[r] = dout[r / seq] for r % seq == 0, else 0 (all-zero bits in every dtype):
// one pass writes every row.
template <typename U>
__global__ void scatter_first_tokens_kernel(const U* dout, int64_t rows, int64_t width, int seq, U* dhidden) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const U* d = r % seq == 0 ? dout + (r / seq) * width : nullptr;
    U* h = dhidden + r * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) h[c] = d ? d[c] : U{};
  }
}

// The count of ones in mask row b, in every thread of the block.
__device__ __forceinline__ int attended(const int32_t* mask_row, int seq) {
  __shared__ int scratch[32];
  int n = 0;
  for (int s = threadIdx.x; s < seq; s += blockDim.x) n += mask_row[s] != 0;
  return cuda::block_sum(n, scratch);
}

// Block (x, b): columns x * blockDim.x .. of sequence b; each thread sums its column over
// the attended rows in order, as the CPU does, so F32 results are the CPU's.
template <typename T>
__global__ void mean_pool_forward_kernel(const T* hidden, const int32_t* mask, int seq, int64_t width, T* out) {
  const int b = blockIdx.y;
  const int32_t* m = mask + int64_t(b) * seq;
  const int n = attended(m, seq);
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float sum = 0.0f;
  for (int s = 0; s < seq; ++s)
    if (m[s]) sum += cuda::to_float(hidden[(int64_t(b) * seq + s) * width + c]);
  out[int64_t(b) * width + c] = cuda::from_float<T>(n > 0 ? sum / float(n) : 0.0f);
}

// Block (x, b): as mean_pool_forward_kernel over packed rows row_start[b] .. row_start[b + 1] - 1.
template <typename T>
__global__ void mean_pool_packed_kernel(const T* hidden, const int32_t* row_start, int64_t width, T* out) {
  const int b = blockIdx.y;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const int r0 = row_start[b], r1 = row_start[b + 1];
  float sum = 0.0f;
  for (int r = r0; r < r1; ++r) sum += cuda::to_float(hidden[int64_t(r) * width + c]);
  out[int64_t(b) * width + c] = cuda::from_float<T>(r1 > r0 ? sum / float(r1 - r0) : 0.0f);
}

// Block (x, b): rows x * kPoolRows .. of sequence b, every column.
constexpr int kPoolRows = 32;
template <typename T>
__global__ void mean_pool_backward_kernel(const T* dout, const int32_t* mask, int seq, int64_t width, T* dhidden) {
  const int b = blockIdx.y;
  const int32_t* m = mask + int64_t(b) * seq;
  const float n = float(attended(m, seq));
  const int s1 = min(seq, int(blockIdx.x + 1) * kPoolRows);
  for (int s = blockIdx.x * kPoolRows; s < s1; ++s) {
    T* h = dhidden + (int64_t(b) * seq + s) * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
      h[c] = cuda::from_float<T>(m[s] ? cuda::to_float(dout[int64_t(b) * width + c]) / n : 0.0f);
  }
}

// Runs f(U{}, width in units) with U = int4 when rows of `width` elements of `t` are
// whole 16-byte units at 16-byte aligned bases, else with U the element's bits.
template <typename F>
void with_row_unit(DType t, int64_t width, bool aligned, const char* op, F&& f) {
  cuda::with_dtype(t, op, [&](auto e) {
    using T = decltype(e);
    using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;
    if (aligned && width % cuda::kVec<T> == 0) f(int4{}, width / cuda::kVec<T>);
    else f(Bits{}, width);
  });
}

}  // namespace

void CudaBackend::embedding_forward(const Tensor& ids, const Tensor& types, const Tensor& positions,
                                    const Tensor& word, const Tensor& pos, const Tensor& type, int seq, Tensor& out) {
  const int64_t tokens = ids.numel(), hidden = word.shape[1];
  if (tokens == 0 || hidden == 0) return;
  auto launch = [&](auto table, auto output) {
    using T = decltype(table);
    using O = decltype(output);
    const int32_t *ip = ids.ptr<int32_t>(), *tp = types.ptr<int32_t>(), *pi = positions.ptr<int32_t>();
    const T *wp = word.ptr<T>(), *pp = pos.ptr<T>(), *typ = type.ptr<T>();
    O* op = out.ptr<O>();
    constexpr int V = cuda::kVec<O>;  // one 16-byte store per step
    const bool vec = hidden % V == 0 && cuda::aligned16(wp) && cuda::aligned16(pp) && cuda::aligned16(typ) &&
                     cuda::aligned16(op);
    const int blocks = cuda::blocks_for_rows(tokens);
    if (vec)
      embedding_forward_kernel<T, O, V>
          <<<blocks, cuda::kThreads, 0, stream()>>>(ip, tp, pi, wp, pp, typ, tokens, hidden, seq, op);
    else
      embedding_forward_kernel<T, O, 1>
          <<<blocks, cuda::kThreads, 0, stream()>>>(ip, tp, pi, wp, pp, typ, tokens, hidden, seq, op);
    HONE_CUDA_LAUNCH_CHECK();
  };
  cuda::with_dtype(out.dtype, "embedding_forward", [&](auto o) {
    if (word.dtype == DType::F32) launch(float{}, o);
    else launch(o, o);
  });
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& types,
                                     const Tensor& positions, int seq, Tensor& dword, Tensor& dpos, Tensor& dtype) {
  const int64_t tokens = ids.numel(), hidden = dword.shape[1];
  if (tokens == 0 || hidden == 0) return;
  const int64_t chunks = (tokens + kTokenChunk - 1) / kTokenChunk;
  const dim3 grid(unsigned(std::min<int64_t>((hidden + cuda::kThreads - 1) / cuda::kThreads, 65535)),
                  unsigned(std::min<int64_t>(chunks, 65535)));
  cuda::with_dtype(dout.dtype, "embedding_backward", [&](auto e) {
    using T = decltype(e);
    embedding_backward_kernel<<<grid, cuda::kThreads, 0, stream()>>>(
        dout.ptr<T>(), ids.ptr<int32_t>(), types.ptr<int32_t>(), positions.ptr<int32_t>(), tokens, hidden, seq,
        dword.f32(), dpos.data ? dpos.f32() : nullptr, dtype.data ? dtype.f32() : nullptr);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::position_ids_after_padding(const Tensor& ids, int32_t pad, int seq, Tensor& out) {
  const int64_t rows = ids.numel() / seq;
  if (rows == 0) return;
  position_ids_after_padding_kernel<<<unsigned((rows + cuda::kThreads - 1) / cuda::kThreads), cuda::kThreads, 0,
                                      stream()>>>(ids.ptr<int32_t>(), pad, rows, seq, out.ptr<int32_t>());
  HONE_CUDA_LAUNCH_CHECK();
}

void CudaBackend::gather_first_tokens(const Tensor& hidden, int seq, Tensor& out) {
  const int64_t batch = out.shape[0], width = out.shape[1];
  if (batch == 0 || width == 0) return;
  const bool aligned = cuda::aligned16(hidden.data) && cuda::aligned16(out.data);
  with_row_unit(hidden.dtype, width, aligned, "gather_first_tokens", [&](auto u, int64_t units) {
    using U = decltype(u);
    gather_first_tokens_kernel<<<cuda::blocks_for_rows(batch), cuda::kThreads, 0, stream()>>>(
        hidden.ptr<U>(), batch, units, seq, out.ptr<U>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  const int64_t n = dst.shape[0], width = dst.shape[1];
  if (n == 0 || width == 0) return;
  const bool aligned = cuda::aligned16(src.data) && cuda::aligned16(dst.data);
  with_row_unit(src.dtype, width, aligned, "gather_rows", [&](auto u, int64_t units) {
    using U = decltype(u);
    gather_rows_kernel<<<cuda::blocks_for_rows(n), cuda::kThreads, 0, stream()>>>(src.ptr<U>(), rows.ptr<int32_t>(),
                                                                                 n, units, dst.ptr<U>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  const int64_t n = src.shape[0], width = dst.shape[1];
  if (dst.numel() == 0) return;
  HONE_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, dst.bytes(), stream()));
  if (n == 0) return;
  const bool aligned = cuda::aligned16(src.data) && cuda::aligned16(dst.data);
  with_row_unit(src.dtype, width, aligned, "scatter_rows", [&](auto u, int64_t units) {
    using U = decltype(u);
    scatter_rows_kernel<<<cuda::blocks_for_rows(n), cuda::kThreads, 0, stream()>>>(src.ptr<U>(), rows.ptr<int32_t>(),
                                                                                  n, units, dst.ptr<U>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::mean_pool_forward(const Tensor& hidden, const Tensor& mask, Tensor& out) {
  const int batch = int(mask.shape[0]), seq = int(mask.shape[1]);
  const int64_t width = hidden.shape[1];
  if (batch == 0 || width == 0) return;
  const dim3 grid(unsigned((width + cuda::kThreads - 1) / cuda::kThreads), unsigned(batch));
  cuda::with_dtype(hidden.dtype, "mean_pool_forward", [&](auto e) {
    using T = decltype(e);
    mean_pool_forward_kernel<<<grid, cuda::kThreads, 0, stream()>>>(hidden.ptr<T>(), mask.ptr<int32_t>(), seq,
                                                                     width, out.ptr<T>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::mean_pool_packed(const Tensor& hidden, const Tensor& row_start, Tensor& out) {
  const int batch = int(out.shape[0]);
  const int64_t width = hidden.shape[1];
  if (batch == 0 || width == 0) return;
  const dim3 grid(unsigned((width + cuda::kThreads - 1) / cuda::kThreads), unsigned(batch));
  cuda::with_dtype(hidden.dtype, "mean_pool_packed", [&](auto e) {
    using T = decltype(e);
    mean_pool_packed_kernel<<<grid, cuda::kThreads, 0, stream()>>>(hidden.ptr<T>(), row_start.ptr<int32_t>(), width,
                                                                    out.ptr<T>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::mean_pool_backward(const Tensor& dout, const Tensor& mask, Tensor& dhidden) {
  const int batch = int(mask.shape[0]), seq = int(mask.shape[1]);
  const int64_t width = dout.shape[1];
  if (batch == 0 || width == 0) return;
  const dim3 grid(unsigned((seq + kPoolRows - 1) / kPoolRows), unsigned(batch));
  cuda::with_dtype(dout.dtype, "mean_pool_backward", [&](auto e) {
    using T = decltype(e);
    mean_pool_backward_kernel<<<grid, cuda::kThreads, 0, stream()>>>(dout.ptr<T>(), mask.ptr<int32_t>(), seq,
                                                                      width, dhidden.ptr<T>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::scatter_first_tokens(const Tensor& dout, int seq, Tensor& dhidden) {
  const int64_t rows = dhidden.shape[0], width = dhidden.shape[1];
  if (rows == 0 || width == 0) return;
  const bool aligned = cuda::aligned16(dout.data) && cuda::aligned16(dhidden.data);
  with_row_unit(dhidden.dtype, width, aligned, "scatter_first_tokens", [&](auto u, int64_t units) {
    using U = decltype(u);
    scatter_first_tokens_kernel<<<cuda::blocks_for_rows(rows), cuda::kThreads, 0, stream()>>>(
        dout.ptr<U>(), rows, units, seq, dhidden.ptr<U>());
    HONE_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace hone
