// Activations, tanh and dropout. Each thread owns groups of four consecutive elements
// (one float4 when aligned), reading a group before writing it, so outputs may alias
// inputs. Dropout groups coincide with Philox blocks: one philox_block call gives the
// four words of a group, bit for bit the mask of the CPU backend.
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "hone/philox.h"

namespace hone {

namespace {

using cuda::Vec;

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluCubic = 0.044715f;

// The formulas of src/ops/elementwise.cpp.
struct Gelu {
  __device__ float operator()(float x) const { return 0.5f * x * (1.0f + erff(x * kInvSqrt2)); }
};
struct GeluGrad {
  __device__ float operator()(float dy, float x) const {
    return dy * (0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x));
  }
};
struct GeluTanh {
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
  }
};
struct GeluTanhGrad {
  __device__ float operator()(float dy, float x) const {
    const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x));
  }
};
struct Relu {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }  // std::max(x, 0): NaN passes
};
struct ReluGrad {
  __device__ float operator()(float dy, float x) const { return x > 0.0f ? dy : 0.0f; }  // 0 at 0, as torch
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhGrad {  // from the output y; __fmul_rn keeps 1 - y*y from fusing, to round as the CPU
  __device__ float operator()(float dy, float y) const { return dy * (1.0f - __fmul_rn(y, y)); }
};

// y = f(x)
template <typename F>
__global__ void unary_kernel(const float* x, float* y, int64_t n, bool vec, F f) {
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    Vec<4> a = cuda::load4(x, 4 * g, n, vec);
#pragma unroll
    for (int k = 0; k < 4; ++k) a.v[k] = f(a.v[k]);
    cuda::store4(y, 4 * g, n, vec, a);
  }
}

// out = f(a, b)
template <typename F>
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, bool vec, F f) {
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    Vec<4> va = cuda::load4(a, 4 * g, n, vec);
    const Vec<4> vb = cuda::load4(b, 4 * g, n, vec);
#pragma unroll
    for (int k = 0; k < 4; ++k) va.v[k] = f(va.v[k], vb.v[k]);
    cuda::store4(out, 4 * g, n, vec, va);
  }
}

// out = residual + dropout(x), or out = dropout(x) when residual is null. With p == 0
// nothing is dropped and no Philox block is computed. __fmul_rn keeps x * scale from
// fusing with the add, so the sums round exactly as on the CPU.
__global__ void dropout_kernel(const float* x, const float* residual, float* out, int64_t n, bool vec, float p,
                               float scale, uint64_t seed, uint64_t stream) {
  const int64_t groups = cuda::groups_of_4(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    Vec<4> a = cuda::load4(x, 4 * g, n, vec);
    if (p > 0.0f) {
      const Philox4 r = philox_block(seed, stream, uint64_t(g));  // words of elements 4g .. 4g+3
#pragma unroll
      for (int k = 0; k < 4; ++k) a.v[k] = uniform_from_word(r.v[k]) >= p ? __fmul_rn(a.v[k], scale) : 0.0f;
    }
    if (residual) {
      const Vec<4> res = cuda::load4(residual, 4 * g, n, vec);
#pragma unroll
      for (int k = 0; k < 4; ++k) a.v[k] = res.v[k] + a.v[k];
    }
    cuda::store4(out, 4 * g, n, vec, a);
  }
}

template <typename F>
void launch_unary(cudaStream_t s, const Tensor& x, Tensor& y, F f) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const float* xp = x.f32();
  float* yp = y.f32();
  const bool vec = cuda::aligned16(xp) && cuda::aligned16(yp);
  unary_kernel<<<cuda::blocks_for(cuda::groups_of_4(n)), cuda::kThreads, 0, s>>>(xp, yp, n, vec, f);
  HONE_CUDA_LAUNCH_CHECK();
}

template <typename F>
void launch_binary(cudaStream_t s, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const int64_t n = a.numel();
  if (n == 0) return;
  const float *ap = a.f32(), *bp = b.f32();
  float* op = out.f32();
  const bool vec = cuda::aligned16(ap) && cuda::aligned16(bp) && cuda::aligned16(op);
  binary_kernel<<<cuda::blocks_for(cuda::groups_of_4(n)), cuda::kThreads, 0, s>>>(ap, bp, op, n, vec, f);
  HONE_CUDA_LAUNCH_CHECK();
}

// residual may be null (plain dropout).
void launch_dropout(cudaStream_t s, const Tensor& x, const Tensor* residual, const DropoutSpec& d, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const float* xp = x.f32();
  const float* rp = residual ? residual->f32() : nullptr;
  float* op = out.f32();
  const bool vec = cuda::aligned16(xp) && cuda::aligned16(rp) && cuda::aligned16(op);
  const float scale = 1.0f / (1.0f - d.p);  // inf at p == 1, where nothing is kept and it is never used
  dropout_kernel<<<cuda::blocks_for(cuda::groups_of_4(n)), cuda::kThreads, 0, s>>>(xp, rp, op, n, vec, d.p, scale,
                                                                                    d.seed, d.stream);
  HONE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::activation_forward(Activation a, const Tensor& x, Tensor& y) {
  switch (a) {
    case Activation::Gelu: return launch_unary(stream(), x, y, Gelu{});
    case Activation::GeluTanh: return launch_unary(stream(), x, y, GeluTanh{});
    case Activation::Relu: return launch_unary(stream(), x, y, Relu{});
  }
}

void CudaBackend::activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  switch (a) {
    case Activation::Gelu: return launch_binary(stream(), dy, x, dx, GeluGrad{});
    case Activation::GeluTanh: return launch_binary(stream(), dy, x, dx, GeluTanhGrad{});
    case Activation::Relu: return launch_binary(stream(), dy, x, dx, ReluGrad{});
  }
}

void CudaBackend::tanh_forward(const Tensor& x, Tensor& y) { launch_unary(stream(), x, y, Tanh{}); }

void CudaBackend::tanh_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  launch_binary(stream(), dy, y, dx, TanhGrad{});
}

void CudaBackend::dropout(const Tensor& x, const DropoutSpec& d, Tensor& y) {
  if (d.p == 0.0f) {  // the identity
    if (y.data != x.data && x.bytes() > 0)
      HONE_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, x.bytes(), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  launch_dropout(stream(), x, nullptr, d, y);
}

void CudaBackend::dropout_add(const Tensor& x, const Tensor& residual, const DropoutSpec& d, Tensor& out) {
  launch_dropout(stream(), x, &residual, d, out);
}

}  // namespace hone
