// Gradient clipping (torch.nn.utils.clip_grad_norm_) and torch.optim.AdamW.
#include <omp.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/cpu_quotient.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

void sum_squares(Backend& be, const Tensor& x, Tensor& out) { sum_squares(be, &x, 1, out); }

void sum_squares(Backend& be, const Tensor* xs, int count, Tensor& out) {
  for (int i = 0; i < count; ++i) detail::expect_dtype("sum_squares", "x", xs[i], DType::F32);
  detail::expect("sum_squares", "out", out, DType::F32, {1});
  if (be.dry_run) return;
  detail::OpScope scope(be, "sum_squares", OpClass::Optimizer, [&] {
    double read = 0;
    for (int i = 0; i < count; ++i) read += double(xs[i].bytes());
    return OpCost{read / 2, read};
  });
  for (int first = 0; first < count; first += kMaxTensorList)
    be.sum_squares(xs + first, std::min(kMaxTensorList, count - first), out);
}

void clip_coefficient(Backend& be, const Tensor& sumsq, float max_norm, Tensor& norm_coef, Tensor* scaler,
                      const LossScaling& ls) {
  detail::expect("clip_coefficient", "sumsq", sumsq, DType::F32, {1});
  detail::expect("clip_coefficient", "norm_coef", norm_coef, DType::F32, {kNormCoefSize});
  if (scaler) detail::expect("clip_coefficient", "scaler", *scaler, DType::F32, {kScalerSize});
  if (!(ls.growth_factor > 1 && ls.backoff_factor > 0 && ls.backoff_factor < 1 && ls.growth_interval >= 1))
    fail("clip_coefficient: loss scaling needs growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1");
  if (be.dry_run) return;
  detail::OpScope scope(be, "clip_coefficient", OpClass::Optimizer);
  be.clip_coefficient(sumsq, max_norm, norm_coef, scaler, ls);
}

void adamw(Backend& be, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
           const Tensor& norm_coef) {
  const AdamWSlice slice{param, grad, m, v, s.weight_decay, Tensor{}};
  adamw(be, &slice, 1, s, norm_coef);
}

void adamw(Backend& be, const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef) {
  for (int i = 0; i < count; ++i) {
    const AdamWSlice& x = slices[i];
    detail::expect_dtype("adamw", "param", x.param, DType::F32);
    detail::expect("adamw", "grad", x.grad, DType::F32, x.param.shape);
    detail::expect("adamw", "m", x.m, DType::F32, x.param.shape);
    detail::expect("adamw", "v", x.v, DType::F32, x.param.shape);
    if (x.half.shape.rank > 0) {  // a half-precision copy to write
      if (x.half.dtype != DType::BF16 && x.half.dtype != DType::F16)
        fail("adamw: half has dtype {}, expected BF16 or F16", dtype_name(x.half.dtype));
      detail::expect_shape("adamw", "half", x.half, x.param.shape);
    }
  }
  detail::expect("adamw", "norm_coef", norm_coef, DType::F32, {kNormCoefSize});
  if (s.step < 1) fail("adamw: step is {}, expected >= 1", s.step);
  if (s.scalars) {
    detail::expect("adamw", "scalars", *s.scalars, DType::F32, {kAdamWScalarsSize});
    for (int i = 0; i < count; ++i)
      if (slices[i].weight_decay != 0 && slices[i].weight_decay != s.weight_decay)
        fail("adamw: slice {} has weight decay {}; with scalars in memory each slice has 0 or the step's {}", i,
             slices[i].weight_decay, s.weight_decay);
  }
  if (be.dry_run) return;
  detail::OpScope scope(be, "adamw", OpClass::Optimizer, [&] {
    double moved = 0;  // each element: param, m and v read and written, grad read, the half copy written
    for (int i = 0; i < count; ++i) moved += detail::bytes(slices[i].param) * 7 + detail::bytes(slices[i].half);
    return OpCost{0, moved};
  });
  for (int first = 0; first < count; first += kMaxTensorList)
    be.adamw(slices + first, std::min(kMaxTensorList, count - first), s, norm_coef);
}

}  // namespace ops

AdamWScalars adamw_scalars(const AdamWStep& s) {
  AdamWScalars k;
  k.step_size = float(s.lr / (1.0 - std::pow(s.beta1, double(s.step))));
  k.bias2_sqrt = float(std::sqrt(1.0 - std::pow(s.beta2, double(s.step))));
  k.w1 = float(1.0 - s.beta1);
  k.w2 = float(1.0 - s.beta2);
  k.b2 = float(s.beta2);
  k.eps = float(s.eps);
  k.decay = float(1.0 - s.lr * s.weight_decay);
  k.first = s.step == 1 ? 1.0f : 0.0f;
  return k;
}

void CpuBackend::sum_squares(const Tensor* xs, int count, Tensor& out) {
  float* o = out.f32();
  for (int t = 0; t < count; ++t) {
    const float* xp = xs[t].f32();
    const int64_t n = xs[t].numel();
    double acc = 0;
#pragma omp parallel reduction(+ : acc)
    {
      // Each thread reads its range as four sequential streams at once, eight running sums
      // each, so that the adds do not wait on each other and more of memory's lines are in
      // flight than one stream's prefetching keeps: on 2 cores, 23-30 GB/s against 11-18 for
      // one stream. Each square is exact in double, so the order changes only the last bits
      // of the double sum.
      constexpr int kStreams = 4;
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = n * t / nt, hi = n * (t + 1) / nt, len = (hi - lo) / kStreams / 8 * 8;
      double lanes[kStreams][8] = {};
      for (int64_t i = lo; i < lo + len; i += 8)
        for (int s = 0; s < kStreams; ++s)
          for (int j = 0; j < 8; ++j) {
            const double v = xp[i + s * len + j];
            lanes[s][j] += v * v;
          }
      for (int64_t i = lo + kStreams * len; i < hi; ++i) lanes[0][0] += double(xp[i]) * xp[i];
      for (const auto& stream : lanes)
        for (const double l : stream) acc += l;
    }
    o[0] = float(double(o[0]) + acc);
  }
}

void CpuBackend::clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm_coef, Tensor* scaler,
                                  const LossScaling& ls) {
  // Without a scaler inv_scale is 1 and the products by it are exact.
  float* state = scaler ? scaler->f32() : nullptr;
  const float s = sumsq.f32()[0];
  const double inv_scale = state ? 1.0 / double(state[0]) : 1.0;
  const double norm = std::sqrt(double(s)) * inv_scale;
  double coef = 1.0;
  if (max_norm > 0) {
    coef = double(max_norm) / (norm + 1e-6);
    if (coef > 1.0) coef = 1.0;  // written so that a NaN norm stays NaN, as torch's clamp
  }
  const bool overflow = state && !std::isfinite(s);
  float* out = norm_coef.f32();
  out[0] = float(norm);
  out[1] = float(coef * inv_scale);
  out[2] = overflow ? 1.0f : 0.0f;
  if (!state) return;
  // torch's _amp_update_scale_: back off on an overflow, grow after growth_interval clean
  // steps in a row (unless the grown scale would overflow float).
  if (overflow) {
    state[0] *= ls.backoff_factor;
    state[1] = 0.0f;
  } else if (const float clean = state[1] + 1.0f; clean >= float(ls.growth_interval)) {
    const float grown = state[0] * ls.growth_factor;
    if (std::isfinite(grown)) state[0] = grown;
    state[1] = 0.0f;
  } else {
    state[1] = clean;
  }
}

namespace {

// bf16 rounding as float_to_bf16 does it, inline and without branches, so that the update
// loop vectorises.
inline uint16_t round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
  const uint32_t quiet = (bits >> 16) | 0x40;
  return uint16_t(f != f ? quiet : rounded);
}

enum class HalfCopy { None, BF16, F16 };

// Whether every value in [p, p + n) is +0 or -0. Most blocks that are not fail on their
// first value; the others are read whole, 16 bytes at a time rather than a float.
bool all_zero(const float* p, int64_t n) {
  if (n == 0) return true;
  if (p[0] != 0.0f) return false;
  uint32_t bits = 0;  // the sign shifted out
#pragma omp simd reduction(| : bits)
  for (int64_t i = 0; i < n; ++i) bits |= std::bit_cast<uint32_t>(p[i]) << 1;
  return bits == 0;
}

// Whether the moments [i, i + n) are zero: with a zero gradient, their update only scales
// the parameter by the decay, and the moments stay zero.
bool untouched(const float* mp, const float* vp, int64_t n) { return all_zero(mp, n) && all_zero(vp, n); }

// The update of elements [lo, hi), their rounded copy to hp[0, hi - lo): the loop is the
// same for each copy kind, instantiated apart so that none calls through a pointer.
// `fresh`: the first step, whose moments are zero and are not read (the same values:
// 0 + w1 (g - 0) and 0 b2 + w2 g^2), so that their pages are first met by a write.
template <HalfCopy kind, bool fresh>
HONE_VECTOR_CLONES void adamw_range(float* pp, float* mp, float* vp, const float* gp, uint16_t* hp, int64_t lo,
                                    int64_t hi, float clip, float decay, const AdamWScalars& k) {
  const float step_size = k.step_size, w1 = k.w1, w2 = k.w2, b2 = k.b2, eps = k.eps;
  // sqrt(v) / bias2_sqrt to the division's bits without a second division an element.
  const float bias2_sqrt = k.bias2_sqrt, inverse_bias2_sqrt = 1.0f / bias2_sqrt;
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float g = gp[i] * clip;
    float p = pp[i] * decay;
    const float m = fresh ? w1 * g : mp[i] + w1 * (g - mp[i]);  // exp_avg.lerp_(grad, 1 - beta1)
    const float v = fresh ? w2 * g * g : vp[i] * b2 + w2 * g * g;
    const float denom = cpu::rounded_quotient(std::sqrt(v), bias2_sqrt, inverse_bias2_sqrt) + eps;
    p -= step_size * (m / denom);
    pp[i] = p;
    mp[i] = m;
    vp[i] = v;
    if constexpr (kind == HalfCopy::BF16) hp[i - lo] = round_bf16(p);
    if constexpr (kind == HalfCopy::F16) hp[i - lo] = float_to_f16(p);
  }
}

// The rounded copy lives in page-locked memory that only the GPU's copy engine reads next:
// streaming stores spare it the read for ownership a cached store costs (2 of the 32 bytes
// a parameter moves). The fence orders them before the update's end, after which the
// upload is issued.
void stream_halves(uint16_t* dst, const uint16_t* src, int64_t n) {
#if defined(__SSE2__)
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; ++i) dst[i] = src[i];
  for (; i + 8 <= n; i += 8)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
#else
  std::memcpy(dst, src, size_t(n) * sizeof(uint16_t));
#endif
}

template <HalfCopy kind>
void adamw_slice(float* pp, float* mp, float* vp, const float* gp, uint16_t* hp, int64_t n, float clip, float decay,
                 const AdamWScalars& k, bool fresh) {
  // A page of moments at a time (1024 floats). A block no step has touched yet (a word
  // embedding's unused rows) leaves its moments unwritten, so that their pages stay the
  // kernel's zero page rather than resident memory; the parameters take the update they
  // would have (m / denom is +-0: only the decay), to the bit. A non-finite clip factor
  // (a NaN norm) reaches every element, as before.
  constexpr int64_t kBlock = 1024;
  const auto update_block = [&](int64_t b) {
    const int64_t e = std::min(n, b + kBlock);
    // A page read before it is written costs the kernel two faults: the first step reads
    // no moments, and the check reads them only behind a zero gradient.
    if (!std::isfinite(clip) || !all_zero(gp + b, e - b) || !(fresh || untouched(mp + b, vp + b, e - b))) {
      alignas(64) uint16_t halves[kBlock];
      if (fresh)
        adamw_range<kind, true>(pp, mp, vp, gp, halves, b, e, clip, decay, k);
      else
        adamw_range<kind, false>(pp, mp, vp, gp, halves, b, e, clip, decay, k);
      if constexpr (kind != HalfCopy::None) stream_halves(hp + b, halves, e - b);
      return;
    }
    if (decay == 1.0f && kind == HalfCopy::None) return;  // nothing changes
    for (int64_t i = b; i < e; ++i) {
      const float p = pp[i] * decay;
      pp[i] = p;
      if constexpr (kind == HalfCopy::BF16) hp[i] = round_bf16(p);
      if constexpr (kind == HalfCopy::F16) hp[i] = float_to_f16(p);
    }
  };
  // Each thread takes a contiguous range of blocks (as a static schedule would) and walks its
  // two halves in turn, a block of each: eight streams of memory in flight rather than four,
  // which one core's prefetching keeps fuller (20M parameters on one core of an AMD EPYC VM:
  // median 12.15 ms against 12.9 walking the range in order; four halves were slower; level
  // on a 16-core H200 host, where the host's bandwidth bounds either order). Every element's
  // update is its own, so the order changes no bits.
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = blocks * t / nt, hi = blocks * (t + 1) / nt, half = (hi - lo + 1) / 2;
    for (int64_t i = 0; i < half; ++i) {
      update_block((lo + i) * kBlock);
      if (lo + half + i < hi) update_block((lo + half + i) * kBlock);
    }
  }
}

}  // namespace

void CpuBackend::adamw(const AdamWSlice* slices, int count, const AdamWStep& s, const Tensor& norm_coef) {
  const AdamWScalars k = s.scalars ? *reinterpret_cast<const AdamWScalars*>(s.scalars->f32()) : adamw_scalars(s);
  if (norm_coef.f32()[2] != 0) return;  // a skipped step: the gradients overflowed
  const float clip = norm_coef.f32()[1];
  const bool fresh = k.first != 0.0f;  // the first update: zero moments, not read
  for (int t = 0; t < count; ++t) {
    const AdamWSlice& x = slices[t];
    const float decay = x.weight_decay == 0 ? 1.0f : s.scalars ? k.decay : float(1.0 - s.lr * x.weight_decay);
    float *pp = x.param.f32(), *mp = x.m.f32(), *vp = x.v.f32();
    const float* gp = x.grad.f32();
    const int64_t n = x.param.numel();
    // The rounded copy, if any: BF16 or F16 bits.
    uint16_t* hp = x.half.ptr<uint16_t>();
    if (!hp)
      adamw_slice<HalfCopy::None>(pp, mp, vp, gp, hp, n, clip, decay, k, fresh);
    else if (x.half.dtype == DType::BF16)
      adamw_slice<HalfCopy::BF16>(pp, mp, vp, gp, hp, n, clip, decay, k, fresh);
    else if (x.half.dtype == DType::F16)
      adamw_slice<HalfCopy::F16>(pp, mp, vp, gp, hp, n, clip, decay, k, fresh);
    else
      fail("adamw: the rounded copy of the parameters is {}, not BF16 or F16", dtype_name(x.half.dtype));
  }
}

}  // namespace hone
