// Activations, tanh and dropout in F32, BF16 or F16 (math in F32). Each thread owns
// groups of kVec<T> consecutive elements (one 16-byte access when aligned: 4 floats or 8
// halves), reading a group before writing it, so outputs may alias inputs. Dropout
// groups are whole Philox blocks: philox_block gives the words of four elements, bit for
// bit the mask of the CPU backend, whatever the storage type.
#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/kernels.h"
#include "hone/philox.h"

namespace hone {

namespace {

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
// An activation and its gradient from one read of x: x becomes act(x), d becomes
// d * act'(x). The erf GELU computes its erf once for both, the arithmetic of Gelu and
// GeluGrad otherwise.
struct GeluWithGrad {
  __device__ void operator()(float& x, float& d) const {
    const float cdf2 = 1.0f + erff(x * kInvSqrt2);  // 2 Phi(x)
    d = d * (0.5f * cdf2 + x * kInvSqrt2Pi * expf(-0.5f * x * x));
    x = 0.5f * x * cdf2;
  }
};
template <typename F, typename G>
struct WithGrad {
  __device__ void operator()(float& x, float& d) const {
    d = G{}(d, x);
    x = F{}(x);
  }
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhGrad {  // from the output y; __fmul_rn keeps 1 - y*y from fusing, to round as the CPU
  __device__ float operator()(float dy, float y) const { return dy * (1.0f - __fmul_rn(y, y)); }
};

// Elements [i, i + V) of a flat array of n, i a multiple of V = kVec<T>: one 16-byte
// access when `vec` (every pointer of the kernel 16-byte aligned) and the group is whole,
// else scalar. Elements at or past n load as 0 and are not stored.
template <typename T, int V>
__device__ __forceinline__ void load_group(const T* p, int64_t i, int64_t n, bool vec, float (&v)[V]) {
  if (vec && i + V <= n) return cuda::load_floats(p + i, v);
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = i + k < n ? cuda::to_float(p[i + k]) : 0.0f;
}

template <typename T, int V>
__device__ __forceinline__ void store_group(T* p, int64_t i, int64_t n, bool vec, const float (&v)[V]) {
  if (vec && i + V <= n) return cuda::store_floats(p + i, v);
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (i + k < n) p[i + k] = cuda::from_float<T>(v[k]);
}

template <typename T>
__host__ __device__ __forceinline__ int64_t groups_of(int64_t n) {
  return (n + cuda::kVec<T> - 1) / cuda::kVec<T>;
}

// y = f(x)
template <typename T, typename F>
__global__ void unary_kernel(const T* x, T* y, int64_t n, bool vec, F f) {
  constexpr int V = cuda::kVec<T>;
  const int64_t groups = groups_of<T>(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    float a[V];
    load_group(x, V * g, n, vec, a);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = f(a[k]);
    store_group(y, V * g, n, vec, a);
  }
}

// out = f(a, b)
template <typename T, typename F>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, bool vec, F f) {
  constexpr int V = cuda::kVec<T>;
  const int64_t groups = groups_of<T>(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    float va[V], vb[V];
    load_group(a, V * g, n, vec, va);
    load_group(b, V * g, n, vec, vb);
#pragma unroll
    for (int k = 0; k < V; ++k) va[k] = f(va[k], vb[k]);
    store_group(out, V * g, n, vec, va);
  }
}

// y = act(x), dx = dx * act'(x): f(x, d) turns an element of x into y's, d into dx's.
template <typename T, typename F>
__global__ void with_grad_kernel(const T* x, T* y, T* dx, int64_t n, bool vec, F f) {
  constexpr int V = cuda::kVec<T>;
  const int64_t groups = groups_of<T>(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    float a[V], d[V];
    load_group(x, V * g, n, vec, a);
    load_group(dx, V * g, n, vec, d);
#pragma unroll
    for (int k = 0; k < V; ++k) f(a[k], d[k]);
    store_group(y, V * g, n, vec, a);
    store_group(dx, V * g, n, vec, d);
  }
}

// out = residual + dropout(x), or out = dropout(x) when residual is null. With p == 0
// nothing is dropped and no Philox block is computed. A group of V elements spans V / 4
// Philox blocks, so element i still takes word i % 4 of block i / 4 whatever T is.
// __fmul_rn keeps x * scale from fusing with the add, so the sums round exactly as on
// the CPU (and a half result is the F32 result rounded).
template <typename T>
__global__ void dropout_kernel(const T* x, const T* residual, T* out, int64_t n, bool vec, float scale,
                               DropoutSpec d) {
  constexpr int V = cuda::kVec<T>;
  const float p = d.p;
  const uint64_t seed = d.seed, stream = dropout_stream(d);
  const int64_t groups = groups_of<T>(n);
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    float a[V];
    load_group(x, V * g, n, vec, a);
    if (p > 0.0f) {
#pragma unroll
      for (int b = 0; b < V / 4; ++b) {
        const Philox4 r = philox_block(seed, stream, uint64_t(g) * (V / 4) + b);  // elements V g + 4 b ...
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float& e = a[4 * b + k];
          e = uniform_from_word(r.v[k]) >= p ? __fmul_rn(e, scale) : 0.0f;
        }
      }
    }
    if (residual) {
      float res[V];
      load_group(residual, V * g, n, vec, res);
#pragma unroll
      for (int k = 0; k < V; ++k) a[k] = res[k] + a[k];
    }
    store_group(out, V * g, n, vec, a);
  }
}

template <typename F>
void launch_unary(cudaStream_t s, const Tensor& x, Tensor& y, F f) {
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::with_dtype(x.dtype, "unary op", [&](auto t) {
    using T = decltype(t);
    const T* xp = x.ptr<T>();
    T* yp = y.ptr<T>();
    const bool vec = cuda::aligned16(xp) && cuda::aligned16(yp);
    unary_kernel<<<cuda::blocks_for(groups_of<T>(n)), cuda::kThreads, 0, s>>>(xp, yp, n, vec, f);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

template <typename F>
void launch_binary(cudaStream_t s, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const int64_t n = a.numel();
  if (n == 0) return;
  cuda::with_dtype(a.dtype, "binary op", [&](auto t) {
    using T = decltype(t);
    const T *ap = a.ptr<T>(), *bp = b.ptr<T>();
    T* op = out.ptr<T>();
    const bool vec = cuda::aligned16(ap) && cuda::aligned16(bp) && cuda::aligned16(op);
    binary_kernel<<<cuda::blocks_for(groups_of<T>(n)), cuda::kThreads, 0, s>>>(ap, bp, op, n, vec, f);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

template <typename F>
void launch_with_grad(cudaStream_t s, const Tensor& x, Tensor& y, Tensor& dx, F f) {
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::with_dtype(x.dtype, "activation with gradient", [&](auto t) {
    using T = decltype(t);
    const T* xp = x.ptr<T>();
    T *yp = y.ptr<T>(), *dxp = dx.ptr<T>();
    const bool vec = cuda::aligned16(xp) && cuda::aligned16(yp) && cuda::aligned16(dxp);
    with_grad_kernel<<<cuda::blocks_for(groups_of<T>(n)), cuda::kThreads, 0, s>>>(xp, yp, dxp, n, vec, f);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

// launch_with_grad's pass over a [rows, cols] matrix that also adds each column's sum of
// the new dx (as stored in T) into dsum, for the bias gradient of the product that made x,
// in the layout of cuda::column_sum_blocks: V columns a thread, one 16-byte access (cols
// a multiple of V, every pointer aligned).
template <typename T, int V, typename F>
__global__ void __launch_bounds__(32 * cuda::kColumnSumWarps)
    with_grad_sum_kernel(const T* __restrict__ x, T* __restrict__ y, T* dx, float* __restrict__ dsum, int64_t rows,
                         int cols, int64_t band, F f) {
  const int c = (blockIdx.x * 32 + threadIdx.x) * V;
  const int64_t r0 = int64_t(blockIdx.y) * band, r1 = r0 + band < rows ? r0 + band : rows;
  float acc[V] = {};
  if (c < cols) {
#pragma unroll 2
    for (int64_t r = r0 + threadIdx.y; r < r1; r += cuda::kColumnSumWarps) {
      float u[V], d[V];
      cuda::load_floats(x + r * cols + c, u);
      cuda::load_floats(dx + r * cols + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) f(u[k], d[k]);
      cuda::store_floats(y + r * cols + c, u);
      cuda::store_floats(dx + r * cols + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += cuda::to_float(cuda::from_float<T>(d[k]));
    }
  }
  cuda::add_column_sums<V>(acc, dsum, c, cols);
}

// with_grad_sum_kernel over x [rows, cols] where its 16-byte layout fits; false otherwise.
template <typename F>
bool launch_with_grad_sum(cudaStream_t s, int sms, const Tensor& x, Tensor& y, Tensor& dx, float* dsum, F f) {
  const int64_t rows = x.shape[0], cols = x.shape[1];
  bool launched = false;
  cuda::with_dtype(x.dtype, "activation with gradient", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::kVec<T>;
    const T* xp = x.ptr<T>();
    T *yp = y.ptr<T>(), *dxp = dx.ptr<T>();
    if (cols % V || !cuda::aligned16(xp) || !cuda::aligned16(yp) || !cuda::aligned16(dxp)) return;
    const cuda::ColumnSumBlocks l = cuda::column_sum_blocks(rows, cols, V, sms);
    with_grad_sum_kernel<T, V><<<l.grid, l.block, 0, s>>>(xp, yp, dxp, dsum, rows, int(cols), l.band, f);
    HONE_CUDA_LAUNCH_CHECK();
    launched = true;
  });
  return launched;
}

// V consecutive elements: one 16-byte access when V > 1 (the caller checked alignment).
template <int V, typename T>
__device__ __forceinline__ void load_cols(const T* p, float (&v)[V]) {
  if constexpr (V == 1) v[0] = cuda::to_float(*p);
  else cuda::load_floats(p, v);
}
template <int V, typename T>
__device__ __forceinline__ void store_cols(T* p, const float (&v)[V]) {
  if constexpr (V == 1) *p = cuda::from_float<T>(v[0]);
  else cuda::store_floats(p, v);
}

// A gated unit over x [rows, 2 half] (input u, then gate v): groups of V columns of one
// row, V = kVec<T> when every row starts 16-byte aligned, else 1. Forward: y = act(u) v.
// Backward: dx = (dy v act'(u), dy act(u)); f is a WithGrad-style functor.
template <typename T, int V, typename F>
__global__ void gated_kernel(const T* x, const T* dy, T* out, int64_t rows, int64_t half, bool backward, F f) {
  const int64_t groups_per_row = half / V, groups = rows * groups_per_row;
  for (int64_t g = cuda::grid_start(); g < groups; g += cuda::grid_stride()) {
    const int64_t r = g / groups_per_row, c = (g % groups_per_row) * V;
    const T* xr = x + r * 2 * half;
    float u[V], v[V], d[V];
    load_cols(xr + c, u);
    load_cols(xr + half + c, v);
    if (!backward) {
      float dummy[V] = {};
#pragma unroll
      for (int k = 0; k < V; ++k) {
        f(u[k], dummy[k]);
        u[k] = u[k] * v[k];
      }
      store_cols(out + r * half + c, u);
      continue;
    }
    load_cols(dy + r * half + c, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float du = d[k] * v[k];
      f(u[k], du);         // u becomes act(u), du becomes dy v act'(u)
      v[k] = d[k] * u[k];  // the gate's gradient
      u[k] = du;
    }
    store_cols(out + r * 2 * half + c, u);
    store_cols(out + r * 2 * half + half + c, v);
  }
}

template <typename F>
void launch_gated(cudaStream_t s, const Tensor& x, const Tensor* dy, Tensor& out, F f) {
  const int64_t rows = x.shape[0], half = x.shape[1] / 2;
  if (rows == 0 || half == 0) return;
  cuda::with_dtype(x.dtype, "gated activation", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::kVec<T>;
    const T* xp = x.ptr<T>();
    const T* dp = dy ? dy->ptr<T>() : nullptr;
    T* op = out.ptr<T>();
    const bool vec = half % V == 0 && cuda::aligned16(xp) && cuda::aligned16(dp) && cuda::aligned16(op);
    if (vec)
      gated_kernel<T, V><<<cuda::blocks_for(rows * (half / V)), cuda::kThreads, 0, s>>>(xp, dp, op, rows, half,
                                                                                       dy != nullptr, f);
    else
      gated_kernel<T, 1><<<cuda::blocks_for(rows * half), cuda::kThreads, 0, s>>>(xp, dp, op, rows, half,
                                                                                  dy != nullptr, f);
    HONE_CUDA_LAUNCH_CHECK();
  });
}

template <typename Launch>
void with_activation_grad(Activation a, Launch launch) {
  switch (a) {
    case Activation::Gelu: return launch(GeluWithGrad{});
    case Activation::GeluTanh: return launch(WithGrad<GeluTanh, GeluTanhGrad>{});
    case Activation::Relu: return launch(WithGrad<Relu, ReluGrad>{});
  }
}

// residual may be null (plain dropout).
void launch_dropout(cudaStream_t s, const Tensor& x, const Tensor* residual, const DropoutSpec& d, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::with_dtype(x.dtype, "dropout", [&](auto t) {
    using T = decltype(t);
    const T* xp = x.ptr<T>();
    const T* rp = residual ? residual->ptr<T>() : nullptr;
    T* op = out.ptr<T>();
    const bool vec = cuda::aligned16(xp) && cuda::aligned16(rp) && cuda::aligned16(op);
    const float scale = 1.0f / (1.0f - d.p);  // inf at p == 1, where nothing is kept and it is never used
    dropout_kernel<<<cuda::blocks_for(groups_of<T>(n)), cuda::kThreads, 0, s>>>(xp, rp, op, n, vec, scale, d);
    HONE_CUDA_LAUNCH_CHECK();
  });
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

void CudaBackend::activation_and_gradient(Activation a, const Tensor& x, Tensor& y, Tensor& dx, Tensor* dsum) {
  if (x.numel() == 0) return;
  const auto run = [&](auto f) {
    if (dsum && x.shape.rank == 2 && launch_with_grad_sum(stream(), sms_, x, y, dx, dsum->f32(), f)) return;
    launch_with_grad(stream(), x, y, dx, f);
    if (dsum) bias_backward(dx, *dsum);
  };
  switch (a) {
    case Activation::Gelu: return run(GeluWithGrad{});
    case Activation::GeluTanh: return run(WithGrad<GeluTanh, GeluTanhGrad>{});
    case Activation::Relu: return run(WithGrad<Relu, ReluGrad>{});
  }
}

void CudaBackend::gated_activation_forward(Activation a, const Tensor& x, Tensor& y) {
  with_activation_grad(a, [&](auto f) { launch_gated(stream(), x, nullptr, y, f); });
}

void CudaBackend::gated_activation_backward(Activation a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  with_activation_grad(a, [&](auto f) { launch_gated(stream(), x, &dy, dx, f); });
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
