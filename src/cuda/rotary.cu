// Rotary position embeddings on the query and key columns of qkv, in place. A thread owns
// one (token, i) pair of columns i and i + d/2 and turns it in every query and key head,
// so each angle's cos and sin are computed once per token. Arithmetic as the CPU's
// (src/ops/rotary.cpp), in F32 whatever the storage type.
#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/kernels.h"
#include "hone/rotary.h"

namespace hone {

namespace {

template <typename T>
__global__ void rotary_kernel(T* qkv, const int32_t* rows, int64_t tokens, int seq, int heads, int head_dim,
                              float theta, bool inverse) {
  const int half = head_dim / 2;
  const int64_t hidden = int64_t(heads) * head_dim, n = tokens * half;
  for (int64_t k = cuda::grid_start(); k < n; k += cuda::grid_stride()) {
    const int64_t t = k / half;
    const int i = int(k % half);
    const int64_t pos = (rows ? rows[t] : t) % seq;
    const float angle = rotary_angle(pos, rotary_inv_freq(theta, i, head_dim));
    float s, c;
    sincosf(angle, &s, &c);
    if (inverse) s = -s;
    T* row = qkv + t * 3 * hidden;
    for (int h = 0; h < 2 * heads; ++h) {  // the query's heads, then the key's
      T* x = row + int64_t(h) * head_dim;
      const float x1 = cuda::to_float(x[i]), x2 = cuda::to_float(x[i + half]);
      // __fmul_rn keeps the products from fusing into the sums, to round as the CPU does.
      x[i] = cuda::from_float<T>(__fmul_rn(x1, c) - __fmul_rn(x2, s));
      x[i + half] = cuda::from_float<T>(__fmul_rn(x2, c) + __fmul_rn(x1, s));
    }
  }
}

}  // namespace

void CudaBackend::rotary(Tensor& qkv, const Tensor& rows, int seq, int heads, int head_dim, float theta,
                         bool inverse) {
  const int64_t tokens = qkv.shape[0];
  if (tokens == 0) return;
  cuda::with_dtype(qkv.dtype, "rotary", [&](auto e) {
    using T = decltype(e);
    rotary_kernel<<<cuda::blocks_for(tokens * (head_dim / 2)), cuda::kThreads, 0, stream()>>>(
        qkv.ptr<T>(), rows.ptr<int32_t>(), tokens, seq, heads, head_dim, theta, inverse);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace hone
