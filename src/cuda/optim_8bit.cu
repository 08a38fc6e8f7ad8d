// bitsandbytes' blockwise 8-bit AdamW and Lion (ops/optim_8bit_math.h says what they
// compute). One launch covers a list of parameter tensors: blockIdx.y picks the tensor,
// and each CUDA block of 256 threads takes whole quantization blocks of 256 elements in
// turn, one element a thread, as bitsandbytes' kernel does; tensors with 32-bit states go
// through the same loop without quantizing.
#include <algorithm>
#include <type_traits>

#include "cuda/cuda_backend.h"
#include "cuda/half.h"
#include "cuda/kernels.h"
#include "ops/optim_8bit_math.h"

namespace hone {

namespace {

static_assert(cuda::kThreads == bnb::kBlock, "one thread per element of a quantization block");

struct Optim8bitList {
  float* param[kMaxTensorList];
  const float* grad[kMaxTensorList];
  void* half[kMaxTensorList];
  void* state1[kMaxTensorList];  // U8 codes when quantized, else F32
  void* state2[kMaxTensorList];
  float* absmax1[kMaxTensorList];
  float* absmax2[kMaxTensorList];
  int64_t n[kMaxTensorList];
  bool quantized[kMaxTensorList];
  bool decay[kMaxTensorList];
};

struct NoHalfCopy {};  // no rounded copy of the parameters to write

// half null: this tensor has no copy (an embedding table, which forward reads in F32).
template <typename H>
__device__ __forceinline__ void store_half(void* half, int64_t i, float p) {
  if constexpr (!std::is_same_v<H, NoHalfCopy>)
    if (half) static_cast<H*>(half)[i] = cuda::from_float<H>(p);
}

// Lion when !kAdamW. H: the rounded copy's storage type, or NoHalfCopy.
template <bool kAdamW, typename H>
__global__ void __launch_bounds__(bnb::kBlock)
    optim_8bit_kernel(Optim8bitList list, const Optim8bitScalars* scalars, const float* qmaps, const float* norm_coef) {
  const int t = blockIdx.y;
  const int64_t n = list.n[t];
  if (norm_coef[2] != 0.0f || int64_t(blockIdx.x) * bnb::kBlock >= n) return;  // skipped step, or nothing here
  constexpr int kMaps = kAdamW ? 2 : 1;
  __shared__ float maps[kMaps * bnb::kMapSize];
  __shared__ float scratch[32];
  for (int i = threadIdx.x; i < kMaps * bnb::kMapSize; i += blockDim.x) maps[i] = qmaps[i];
  __syncthreads();
  const float* map1 = maps;
  const float* map2 = maps + bnb::kMapSize;
  const Optim8bitScalars k = *scalars;
  const float clip = norm_coef[1];
  const bool decay = list.decay[t];
  float* param = list.param[t];
  const float* grad = list.grad[t];
  const int64_t blocks = (n + bnb::kBlock - 1) / bnb::kBlock;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t i = b * bnb::kBlock + threadIdx.x;
    const bool in = i < n;
    const float g = in ? bnb::mul(grad[i], clip) : 0.0f;
    float p = in ? param[i] : 0.0f;
    if (!list.quantized[t]) {
      if (!in) continue;
      float& m = static_cast<float*>(list.state1[t])[i];
      if constexpr (kAdamW) {
        float& v = static_cast<float*>(list.state2[t])[i];
        bnb::adamw_moments_32bit(m, v, g, k);
        p = bnb::adamw_param(p, m, v, decay, k);
      } else {
        bnb::lion(p, m, g, decay, k);
      }
      param[i] = p;
      store_half<H>(list.half[t], i, p);
      continue;
    }
    uint8_t* c1 = static_cast<uint8_t*>(list.state1[t]);
    float s1 = bnb::dequantize(map1, in ? c1[i] : bnb::kPadCode1, list.absmax1[t][b]);
    float s2 = 0.0f;
    if constexpr (kAdamW) {
      const uint8_t* c2 = static_cast<const uint8_t*>(list.state2[t]);
      s2 = bnb::dequantize(map2, in ? c2[i] : bnb::kPadCode2, list.absmax2[t][b]);
      if (bnb::finite(g)) {
        bnb::adamw_moments_8bit(s1, s2, g, k);
        p = bnb::adamw_param(p, s1, s2, decay, k);
      } else {
        s1 = s2 = 0.0f;
      }
    } else {
      bnb::lion(p, s1, g, decay, k);
    }
    // Every thread has read the block's absmax before the reductions' barriers; thread 0
    // overwrites it after them.
    const float max1 = cuda::block_max(fabsf(s1), scratch);
    const float max2 = kAdamW ? cuda::block_max(fabsf(s2), scratch) : 0.0f;
    if (threadIdx.x == 0) {
      list.absmax1[t][b] = max1;
      if constexpr (kAdamW) list.absmax2[t][b] = max2;
    }
    if (!in) continue;
    param[i] = p;
    store_half<H>(list.half[t], i, p);
    c1[i] = bnb::keep_sign(map1, bnb::quantize(map1, true, bnb::div(s1, max1)), s1);
    if constexpr (kAdamW)
      static_cast<uint8_t*>(list.state2[t])[i] = bnb::quantize(map2, false, bnb::div(s2, max2));
  }
}

template <bool kAdamW>
void launch(const Optim8bitList& list, int count, int64_t longest, DType half, const Tensor& scalars,
            const Tensor& qmaps, const Tensor& norm_coef, cudaStream_t stream) {
  // Blocks past a short tensor's end return at once; a cap keeps them few.
  constexpr int64_t kMaxBlocksPerTensor = 2048;
  const dim3 grid(unsigned(std::clamp<int64_t>(bnb::blocks_of(longest), 1, kMaxBlocksPerTensor)), unsigned(count));
  const auto* k = reinterpret_cast<const Optim8bitScalars*>(scalars.f32());
  auto run = [&](auto kernel) {
    kernel<<<grid, bnb::kBlock, 0, stream>>>(list, k, qmaps.f32(), norm_coef.f32());
    HONE_CUDA_LAUNCH_CHECK();
  };
  switch (half) {
    case DType::BF16: return run(optim_8bit_kernel<kAdamW, __nv_bfloat16>);
    case DType::F16: return run(optim_8bit_kernel<kAdamW, __half>);
    default: return run(optim_8bit_kernel<kAdamW, NoHalfCopy>);
  }
}

}  // namespace

void CudaBackend::optim_8bit(Optim8bitAlgo algo, const Optim8bitSlice* slices, int count, const Tensor& scalars,
                             const Tensor& qmaps, const Tensor& norm_coef) {
  Optim8bitList list{};
  int64_t longest = 0;
  for (int t = 0; t < count; ++t) {
    const Optim8bitSlice& x = slices[t];
    list.param[t] = x.param.f32();
    list.grad[t] = x.grad.f32();
    list.half[t] = x.half.data;
    list.state1[t] = x.state1.data;
    list.state2[t] = x.state2.data;
    list.absmax1[t] = static_cast<float*>(x.absmax1.data);
    list.absmax2[t] = static_cast<float*>(x.absmax2.data);
    list.n[t] = x.param.numel();
    list.quantized[t] = x.state1.dtype == DType::U8;
    list.decay[t] = x.decay;
    longest = std::max(longest, list.n[t]);
  }
  if (count == 0 || longest == 0) return;
  // The ops wrapper checked that the slices with a rounded copy agree on its dtype.
  DType half = DType::F32;
  for (int t = 0; t < count; ++t)
    if (slices[t].half.data) half = slices[t].half.dtype;
  if (algo == Optim8bitAlgo::AdamW)
    launch<true>(list, count, longest, half, scalars, qmaps, norm_coef, stream());
  else
    launch<false>(list, count, longest, half, scalars, qmaps, norm_coef, stream());
}

}  // namespace hone
