#pragma once
// A float quotient rounded as IEEE division rounds it, from one product and two FMAs
// (Markstein's correction): with y = 1 / b rounded to float, q = s y is within an ulp of
// s / b, the FMA gives the residual s - b q exactly, and q + (s - b q) y rounds to the
// correctly rounded s / b. A vector division costs as much as the square root beside it;
// this costs three multiply-adds. The residual is exact while it stays a normal float:
// for b in (0, 1] and s from 2^-75 up (every square root of a positive float), checked
// against the division for every such s at the bias corrections of several betas and
// steps, and sampled in the tests. s = +inf takes the division's +inf (the residual is a
// NaN there); 0 and NaN come through as they are. Where the CPU has no FMA instruction
// (x86-64's baseline copy of the vector clones), std::fma is the C library's fmaf: exact,
// and slow, on CPUs from before 2013 only.
#include <cmath>

namespace hone::cpu {

inline float rounded_quotient(float s, float b, float y) {
  const float q = s * y;
  const float corrected = std::fma(std::fma(-b, q, s), y, q);
  // b <= 1, so the quotient is at least s; where s = +inf the residual is a NaN, which
  // compares false, and s is the answer. One vector max, where a select on s == inf made
  // the compiler mask the product on a second comparison.
  return corrected > s ? corrected : s;
}

}  // namespace hone::cpu
