// bitsandbytes' blockwise 8-bit AdamW and Lion: the dynamic maps, the per-update values,
// the checked op and the CPU reference. What bitsandbytes computes, and in which order,
// is written down in ops/optim_8bit_math.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"
#include "ops/optim_8bit_math.h"

namespace hone {

namespace bnb {

// Seven exponent bits and no extra linear region: for each power of ten 10^(i - 6), the
// midpoints of float32 linspace(0.1, 1, 2^i + 1) (signed, with their negatives) or of
// linspace(0.1, 1, 2^(i + 1) + 1) (unsigned), times the power of ten in float (torch
// multiplies a float32 tensor by a Python scalar in float); then 0 and 1, sorted.
void dynamic_map(bool is_signed, float* out) {
  std::vector<float> v;
  for (int i = 0; i < 7; ++i) {
    const int points = (is_signed ? 1 << i : 2 << i) + 1;
    // torch.linspace in float32: a float step, then forward from the start in the first
    // half and backward from the end in the second, each point computed in double.
    const float start = 0.1f, end = 1.0f, step = (end - start) / float(points - 1);
    auto point = [&](int j) {
      return float(j < points / 2 ? double(start) + double(step) * j : double(end) - double(step) * (points - 1 - j));
    };
    const float scale = float(std::pow(10.0, i - 6));
    for (int j = 0; j + 1 < points; ++j) {
      const float mean = (point(j) + point(j + 1)) / 2.0f;
      v.push_back(scale * mean);
      if (is_signed) v.push_back(-scale * mean);
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  HONE_CHECK(v.size() == size_t(kMapSize), "dynamic map of {} entries", v.size());
  std::sort(v.begin(), v.end());
  std::copy(v.begin(), v.end(), out);
}

}  // namespace bnb

// bitsandbytes takes lr, the betas, eps and weight decay as C floats and derives the rest
// on the device in float.
Optim8bitScalars optim_8bit_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                    int64_t step) {
  const float lr_f = float(lr), b1 = float(beta1), b2 = float(beta2);
  const float c1 = 1.0f - std::pow(b1, float(step));
  const float c2 = std::sqrt(1.0f - std::pow(b2, float(step)));
  Optim8bitScalars k;
  k.lr = lr_f;
  k.step_size = -lr_f * c2 / c1;
  k.eps_c2 = float(eps) * c2;
  k.b1 = b1;
  k.w1 = 1.0f - b1;
  k.b2 = b2;
  k.w2 = 1.0f - b2;
  k.decay = 1.0f - lr_f * float(weight_decay);
  return k;
}

namespace ops {

void optim_8bit(Backend& be, Optim8bitAlgo algo, const Optim8bitSlice* slices, int count, const Tensor& scalars,
                const Tensor& qmaps, const Tensor& norm_coef) {
  constexpr const char* op = "optim_8bit";
  const bool adamw = algo == Optim8bitAlgo::AdamW;
  int with_copy = -1;  // the first slice with a rounded copy: the others' must share its dtype
  for (int i = 0; i < count; ++i) {
    const Optim8bitSlice& x = slices[i];
    detail::expect_dtype(op, "param", x.param, DType::F32);
    detail::expect_rank(op, "param", x.param, 1);
    const int64_t n = x.param.numel();
    detail::expect(op, "grad", x.grad, DType::F32, {n});
    const bool quantized = x.state1.dtype == DType::U8;
    const DType state_type = quantized ? DType::U8 : DType::F32;
    if (x.state1.dtype != DType::F32) detail::expect(op, "state1", x.state1, DType::U8, {n});
    detail::expect_shape(op, "state1", x.state1, {n});
    if (quantized) detail::expect(op, "absmax1", x.absmax1, DType::F32, {bnb::blocks_of(n)});
    if (adamw) {
      detail::expect(op, "state2", x.state2, state_type, {n});
      if (quantized) detail::expect(op, "absmax2", x.absmax2, DType::F32, {bnb::blocks_of(n)});
    }
    if ((!quantized && x.absmax1.data) || (!(adamw && quantized) && x.absmax2.data) || (!adamw && x.state2.data))
      fail("{}: slice {} has state it does not use", op, i);
    if (x.half.shape.rank > 0) {
      if (x.half.dtype != DType::BF16 && x.half.dtype != DType::F16)
        fail("{}: half has dtype {}, expected BF16 or F16", op, dtype_name(x.half.dtype));
      detail::expect_shape(op, "half", x.half, x.param.shape);
      // Slices without a copy (embedding tables) may sit beside those with one.
      if (with_copy < 0) with_copy = i;
      if (x.half.dtype != slices[with_copy].half.dtype)
        fail("{}: slices {} and {} differ in the dtype of their rounded copy of the parameters", op, with_copy, i);
    }
  }
  detail::expect(op, "scalars", scalars, DType::F32, {kOptim8bitScalarsSize});
  detail::expect(op, "qmaps", qmaps, DType::F32, {(adamw ? 2 : 1) * bnb::kMapSize});
  detail::expect(op, "norm_coef", norm_coef, DType::F32, {kNormCoefSize});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Optimizer, [&] {
    double moved = 0;  // param and the states read and written, grad read, the half copy written
    for (int i = 0; i < count; ++i) {
      const Optim8bitSlice& x = slices[i];
      moved += detail::bytes(x.param, x.param, x.grad, x.half) +
               2 * detail::bytes(x.state1, x.state2, x.absmax1, x.absmax2);
    }
    return OpCost{0, moved};
  });
  for (int first = 0; first < count; first += kMaxTensorList)
    be.optim_8bit(algo, slices + first, std::min(kMaxTensorList, count - first), scalars, qmaps, norm_coef);
}

}  // namespace ops

namespace {

// One block of a quantized tensor, with its padding, as the CUDA kernel's threads do it.
void update_block(Optim8bitAlgo algo, const Optim8bitSlice& x, int64_t block, const float* map1, const float* map2,
                  float clip, const Optim8bitScalars& k, uint16_t (*round)(float)) {
  const bool adamw = algo == Optim8bitAlgo::AdamW;
  const int64_t n = x.param.numel(), first = block * bnb::kBlock;
  const int valid = int(std::min<int64_t>(bnb::kBlock, n - first));
  float* p = x.param.f32() + first;
  const float* grad = x.grad.f32() + first;
  uint8_t* c1 = x.state1.ptr<uint8_t>() + first;
  uint8_t* c2 = adamw ? x.state2.ptr<uint8_t>() + first : nullptr;
  float& absmax1 = x.absmax1.f32()[block];
  float* absmax2 = adamw ? &x.absmax2.f32()[block] : nullptr;
  float s1[bnb::kBlock], s2[bnb::kBlock], param[bnb::kBlock];
  float max1 = -3.402823466e38f, max2 = -3.402823466e38f;
  for (int j = 0; j < bnb::kBlock; ++j) {
    const bool in = j < valid;
    const float g = in ? bnb::mul(grad[j], clip) : 0.0f;
    param[j] = in ? p[j] : 0.0f;
    s1[j] = bnb::dequantize(map1, in ? c1[j] : bnb::kPadCode1, absmax1);
    if (adamw) {
      s2[j] = bnb::dequantize(map2, in ? c2[j] : bnb::kPadCode2, *absmax2);
      if (bnb::finite(g)) {
        bnb::adamw_moments_8bit(s1[j], s2[j], g, k);
        if (in) param[j] = bnb::adamw_param(param[j], s1[j], s2[j], x.decay, k);
      } else {
        s1[j] = s2[j] = 0.0f;
      }
      max2 = std::fmax(max2, std::fabs(s2[j]));
    } else {
      bnb::lion(param[j], s1[j], g, x.decay, k);
    }
    max1 = std::fmax(max1, std::fabs(s1[j]));
  }
  absmax1 = max1;
  if (adamw) *absmax2 = max2;
  uint16_t* half = x.half.ptr<uint16_t>() ? x.half.ptr<uint16_t>() + first : nullptr;
  for (int j = 0; j < valid; ++j) {
    p[j] = param[j];
    if (half) half[j] = round(param[j]);
    c1[j] = bnb::keep_sign(map1, bnb::quantize(map1, true, bnb::div(s1[j], max1)), s1[j]);
    if (adamw) c2[j] = bnb::quantize(map2, false, bnb::div(s2[j], max2));
  }
}

// A tensor with 32-bit states, element by element.
void update_32bit(Optim8bitAlgo algo, const Optim8bitSlice& x, float clip, const Optim8bitScalars& k,
                  uint16_t (*round)(float)) {
  float *p = x.param.f32(), *m = x.state1.f32(), *v = algo == Optim8bitAlgo::AdamW ? x.state2.f32() : nullptr;
  const float* grad = x.grad.f32();
  uint16_t* half = x.half.ptr<uint16_t>();
  const int64_t n = x.param.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float g = bnb::mul(grad[i], clip);
    if (v) {
      bnb::adamw_moments_32bit(m[i], v[i], g, k);
      p[i] = bnb::adamw_param(p[i], m[i], v[i], x.decay, k);
    } else {
      bnb::lion(p[i], m[i], g, x.decay, k);
    }
    if (half) half[i] = round(p[i]);
  }
}

}  // namespace

void CpuBackend::optim_8bit(Optim8bitAlgo algo, const Optim8bitSlice* slices, int count, const Tensor& scalars,
                            const Tensor& qmaps, const Tensor& norm_coef) {
  if (norm_coef.f32()[2] != 0) return;  // a skipped step: the gradients overflowed
  const float clip = norm_coef.f32()[1];
  const Optim8bitScalars k = *reinterpret_cast<const Optim8bitScalars*>(scalars.f32());
  const float* map1 = qmaps.f32();
  const float* map2 = algo == Optim8bitAlgo::AdamW ? map1 + bnb::kMapSize : nullptr;
  for (int t = 0; t < count; ++t) {
    const Optim8bitSlice& x = slices[t];
    uint16_t (*round)(float) = x.half.dtype == DType::F16 ? float_to_f16 : float_to_bf16;
    if (x.state1.dtype != DType::U8) {
      update_32bit(algo, x, clip, k, round);
      continue;
    }
    const int64_t blocks = bnb::blocks_of(x.param.numel());
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) update_block(algo, x, b, map1, map2, clip, k, round);
  }
}

}  // namespace hone
