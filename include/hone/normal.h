#pragma once
// Normal draws for weight initialisation that the CPU and a GPU compute bit for bit alike,
// so that a run initialised on the device starts from the weights the host would write.
// Box-Muller on one Philox block: pair k of a stream is
//   r = sqrt(-2 log u1), (r cos 2 pi u2, r sin 2 pi u2),
//   u1 = (word0 >> 8 + 1) / 2^24 in (0, 1], u2 = (word1 >> 8) / 2^24 in [0, 1).
// log, cos and sin are polynomials in correctly rounded +, *, / and sqrt only (the
// libraries' own functions differ between the CPU and CUDA in the last bits), with no
// fused multiply-adds: on the GPU through the _rn intrinsics, on the CPU by compiling
// callers with -ffp-contract=off. About 1 ulp from the exact values, which is all a
// random init needs.
#include <cstdint>

#include "hone/philox.h"

#if defined(__CUDA_ARCH__)
#define HONE_NORMAL_MUL(a, b) __fmul_rn(a, b)
#define HONE_NORMAL_ADD(a, b) __fadd_rn(a, b)
#define HONE_NORMAL_DIV(a, b) __fdiv_rn(a, b)
#define HONE_NORMAL_SQRT(a) __fsqrt_rn(a)
#else
#include <cmath>
#define HONE_NORMAL_MUL(a, b) ((a) * (b))
#define HONE_NORMAL_ADD(a, b) ((a) + (b))
#define HONE_NORMAL_DIV(a, b) ((a) / (b))
#define HONE_NORMAL_SQRT(a) std::sqrt(a)
#endif

namespace hone {

struct NormalPair {
  float a, b;
};

// 2^e for e in [-126, 127], exactly.
HONE_HD float pow2(int e) {
  const uint32_t bits = uint32_t(e + 127) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

// The index of m's highest set bit; m > 0.
HONE_HD int top_bit(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(m);
#else
  return 31 - __builtin_clz(m);
#endif
}

// log(m / 2^24) for an integer m in [1, 2^24]: m = 2^e f with f in [sqrt(1/2), sqrt(2)),
// log f = 2 atanh(s), s = (f - 1) / (f + 1), |s| <= 0.172, by its series to s^13.
HONE_HD float log_of_24bit(uint32_t m) {
  int e = top_bit(m);
  float f = HONE_NORMAL_MUL(float(m), pow2(-e));  // [1, 2), exact
  if (f > 1.41421356f) {
    f = HONE_NORMAL_MUL(f, 0.5f);
    e += 1;
  }
  const float s = HONE_NORMAL_DIV(HONE_NORMAL_ADD(f, -1.0f), HONE_NORMAL_ADD(f, 1.0f));
  const float z = HONE_NORMAL_MUL(s, s);
  float p = 1.0f / 13.0f;
  p = HONE_NORMAL_ADD(HONE_NORMAL_MUL(p, z), 1.0f / 11.0f);
  p = HONE_NORMAL_ADD(HONE_NORMAL_MUL(p, z), 1.0f / 9.0f);
  p = HONE_NORMAL_ADD(HONE_NORMAL_MUL(p, z), 1.0f / 7.0f);
  p = HONE_NORMAL_ADD(HONE_NORMAL_MUL(p, z), 1.0f / 5.0f);
  p = HONE_NORMAL_ADD(HONE_NORMAL_MUL(p, z), 1.0f / 3.0f);
  p = HONE_NORMAL_ADD(HONE_NORMAL_MUL(p, z), 1.0f);
  const float log_f = HONE_NORMAL_MUL(HONE_NORMAL_MUL(2.0f, s), p);
  return HONE_NORMAL_ADD(HONE_NORMAL_MUL(float(e - 24), 0.693147181f), log_f);
}

// (cos, sin) of 2 pi m / 2^24 for an integer m in [0, 2^24): the quadrant is m's top two
// bits, and the angle within it, theta = (pi / 2) r with r in [0, 1) exact, goes through
// Taylor polynomials (to theta^14 and theta^15: under 4e-9 at pi / 2).
HONE_HD NormalPair cos_sin_of_24bit(uint32_t m) {
  const uint32_t quadrant = m >> 22;
  const float r = HONE_NORMAL_MUL(float(m & 0x3FFFFFu), pow2(-22));
  const float t = HONE_NORMAL_MUL(r, 1.57079633f);
  const float t2 = HONE_NORMAL_MUL(t, t);
  // cos: 1 - t2/2! + t2^2/4! - ... ; sin: t (1 - t2/3! + t2^2/5! - ...)
  float c = 1.0f / 87178291200.0f;  // 1/14!
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, t2), -1.0f / 479001600.0f);
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, t2), 1.0f / 3628800.0f);
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, t2), -1.0f / 40320.0f);
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, t2), 1.0f / 720.0f);
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, t2), -1.0f / 24.0f);
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, t2), 0.5f);
  c = HONE_NORMAL_ADD(HONE_NORMAL_MUL(c, -t2), 1.0f);
  float s = -1.0f / 1307674368000.0f;  // -1/15!
  s = HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), 1.0f / 6227020800.0f);
  s = HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), -1.0f / 39916800.0f);
  s = HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), 1.0f / 362880.0f);
  s = HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), -1.0f / 5040.0f);
  s = HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), 1.0f / 120.0f);
  s = HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), -1.0f / 6.0f);
  s = HONE_NORMAL_MUL(HONE_NORMAL_ADD(HONE_NORMAL_MUL(s, t2), 1.0f), t);
  switch (quadrant) {
    case 0: return {c, s};
    case 1: return {-s, c};
    case 2: return {-c, -s};
    default: return {s, -c};
  }
}

// Pair k of (seed, stream), scaled by std.
HONE_HD NormalPair normal_pair(uint64_t seed, uint64_t stream, uint64_t k, float std) {
  const Philox4 r = philox_block(seed, stream, k);
  const float radius =
      HONE_NORMAL_MUL(std, HONE_NORMAL_SQRT(HONE_NORMAL_MUL(-2.0f, log_of_24bit((r.v[0] >> 8) + 1))));
  const NormalPair cs = cos_sin_of_24bit(r.v[1] >> 8);
  return {HONE_NORMAL_MUL(radius, cs.a), HONE_NORMAL_MUL(radius, cs.b)};
}

}  // namespace hone

#undef HONE_NORMAL_MUL
#undef HONE_NORMAL_ADD
#undef HONE_NORMAL_DIV
#undef HONE_NORMAL_SQRT
