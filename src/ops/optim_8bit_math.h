#pragma once
// bitsandbytes' blockwise 8-bit AdamW and Lion (version 0.50.2, optim_bits=8, as Trainer
// builds them for --optim adamw_bnb_8bit / adamw_8bit / lion_8bit), element by element.
// The CPU reference (optim_8bit.cpp) and the CUDA kernel (cuda/optim_8bit.cu) both call
// these functions, so they compute the same operations in the same order; on the device
// the _rn intrinsics keep nvcc from contracting them into FMAs, and the CPU reference is
// built without FMA, so both round alike.
//
// What bitsandbytes does, and hone with it:
// - Each parameter tensor is its own optimizer state. A tensor of fewer than 4096
//   elements keeps 32-bit states (its kOptimizer32bit kernels), and so does every
//   embedding matrix, which Trainer registers with bitsandbytes' GlobalOptimManager for
//   optim_bits=32; any other keeps each state as one byte per element, a code into a
//   256-entry map, plus one F32 absmax per block of 256 elements counted from the
//   tensor's first element. State1 (AdamW's first
//   moment, Lion's momentum) uses the signed dynamic map, state2 (AdamW's second moment)
//   the unsigned one (create_dynamic_map: 7 exponent bits, linear fractions between 0.1
//   and 1 for each power of ten). Codes and absmax start at zero.
// - An update of a block: dequantize (map[code] * absmax), update the states, take the
//   block's new absmax (the max of |state|), update the parameter, quantize each state
//   over the new absmax to a code. The last block of a tensor is padded: its elements past
//   the end count in the absmax as gradient 0 and codes 128 (state1) and 0 (state2).
// - Quantizing: a binary search of the sorted map from entry 127 (seven halvings), then
//   the nearer of the entry it ended on and the last neighbour passed on that side (bounds
//   start at -1 or 0 below and 1 above, not at the map's ends), a tie keeping the entry it
//   ended on. A signed state whose code has the other sign moves one code toward its own.
// - AdamW: m = m * b1 + (1 - b1) * g; v = v * b2 + (1 - b2) * g * g; then
//   p += -lr * c2 / c1 * m / (sqrt(v) + eps * c2) with c1 = 1 - b1^t, c2 = sqrt(1 - b2^t),
//   and only then the decoupled decay p *= 1 - lr * wd. (The 32-bit kernel groups
//   (1 - b2) * (g * g).) In 8-bit, an element whose gradient is not finite keeps its
//   parameter and gets zero states.
// - Lion: p *= 1 - lr * wd; p -= lr * sign(m * b1 + (1 - b1) * g); m = m * b2 + (1 - b2) * g
//   (Trainer passes --adam_beta1/2 as Lion's betas).
// - Where bitsandbytes' kernels use fast approximations (__powf, __fdividef), hone uses
//   correctly rounded operations. The two differ by a few units in the last place, which
//   can move a state across a midpoint between two codes, except in 1 - beta2^step, where
//   the approximate power's error cancels into a relative 3e-5 on the first AdamW step
//   (less on later ones).
#include <cmath>
#include <cstdint>

#include "hone/backend.h"

namespace hone::bnb {

constexpr int kBlock = 256;    // elements per absmax
constexpr int kMapSize = 256;  // entries of a dynamic map
constexpr uint8_t kPadCode1 = 128, kPadCode2 = 0;  // codes of a block's padding

inline int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

// create_dynamic_map(signed) as bitsandbytes computes it (host).
void dynamic_map(bool is_signed, float* out);

#ifdef __CUDA_ARCH__
HONE_HD float add(float a, float b) { return __fadd_rn(a, b); }
HONE_HD float mul(float a, float b) { return __fmul_rn(a, b); }
HONE_HD float div(float a, float b) { return __fdiv_rn(a, b); }
HONE_HD float root(float a) { return __fsqrt_rn(a); }
HONE_HD bool sign_bit(float a) { return signbit(a); }
HONE_HD bool finite(float a) { return isfinite(a); }
#else
HONE_HD float add(float a, float b) { return a + b; }
HONE_HD float mul(float a, float b) { return a * b; }
HONE_HD float div(float a, float b) { return a / b; }
HONE_HD float root(float a) { return std::sqrt(a); }
HONE_HD bool sign_bit(float a) { return std::signbit(a); }
HONE_HD bool finite(float a) { return std::isfinite(a); }
#endif

// The code of x (a state over its block's absmax) as bitsandbytes picks it; NaN gets 0.
HONE_HD uint8_t quantize(const float* map, bool is_signed, float x) {
  int at = 127, below = 0, above = kMapSize - 1;
  float low = is_signed ? -1.0f : 0.0f, high = 1.0f;
  for (int step = 64; step > 0; step >>= 1) {
    const float v = map[at];
    if (x > v) {
      below = at, low = v, at += step;
    } else {
      above = at, high = v, at -= step;
    }
  }
  const float v = map[at];
  if (x > v) return uint8_t(x > mul(add(high, v), 0.5f) ? above : at);
  return uint8_t(x < mul(add(low, v), 0.5f) ? below : at);
}

// A signed state's code, moved one step toward the state's sign if the map's entry has
// the other one (codes wrap as bytes do).
HONE_HD uint8_t keep_sign(const float* map, uint8_t code, float state) {
  if (sign_bit(map[code]) == sign_bit(state)) return code;
  return uint8_t(state > 0.0f ? code + 1 : code - 1);
}

HONE_HD float dequantize(const float* map, uint8_t code, float absmax) { return mul(map[code], absmax); }

// AdamW's moments as the 8-bit kernel groups them, and as the 32-bit one does.
HONE_HD void adamw_moments_8bit(float& m, float& v, float g, const Optim8bitScalars& k) {
  v = add(mul(v, k.b2), mul(mul(k.w2, g), g));
  m = add(mul(m, k.b1), mul(k.w1, g));
}
HONE_HD void adamw_moments_32bit(float& m, float& v, float g, const Optim8bitScalars& k) {
  m = add(mul(m, k.b1), mul(k.w1, g));
  v = add(mul(v, k.b2), mul(k.w2, mul(g, g)));
}

// The step, then the decoupled weight decay.
HONE_HD float adamw_param(float p, float m, float v, bool decay, const Optim8bitScalars& k) {
  p = add(p, mul(k.step_size, div(m, add(root(v), k.eps_c2))));
  return decay ? mul(p, k.decay) : p;
}

// Lion, one element: decay, the signed step, then the momentum.
HONE_HD void lion(float& p, float& m, float g, bool decay, const Optim8bitScalars& k) {
  if (decay) p = mul(p, k.decay);
  const float blend = add(mul(m, k.b1), mul(k.w1, g));
  const float sign = float((0.0f < blend) - (blend < 0.0f));
  m = add(mul(m, k.b2), mul(k.w2, g));
  p = add(p, -mul(k.lr, sign));
}

}  // namespace hone::bnb
