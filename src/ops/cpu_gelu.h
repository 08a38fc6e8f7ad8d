// BERT's erf GELU on the CPU, sixteen elements at a time where the CPU has AVX-512.
// The reference computes each element with the C library's erff and expf, one at a time;
// in glibc (Debian 12's 2.36) those are fdlibm's rational approximations for erf and, for
// exp, a 32-entry table with a cubic in double (fused multiply-adds on CPUs with FMA). The
// vector forms do the same operations in the same order on vector lanes, each rounding as
// the scalar one does (the file is built without contracting multiplies and adds), so
// their results are the scalar ones to the bit: tests/cpu_gelu_test.cpp checks a sweep of
// float bit patterns, and every one of the 2^32 with HONE_EXHAUSTIVE=1 (it passed on an
// AVX-512 Xeon under glibc 2.36). A C library whose erff or expf differs (a later glibc's
// correctly rounded ones) would differ from these by an ulp in places: the vector forms run
// only where a probe of 65,538 inputs finds the library's answers. Elsewhere (and without
// AVX-512) the scalar reference runs.
#pragma once

#include <cmath>
#include <cstdint>

namespace hone::cpu_gelu {

// The scalar reference. Each GELU and its gradient share one transcendental, e = 1 + erf:
// the *_from forms take it, so that a pass wanting both computes it once, to the same bits.
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
inline float gelu_e(float x) { return 1.0f + std::erf(x * kInvSqrt2); }
inline float gelu_from(float x, float e) { return 0.5f * x * e; }
inline float gelu_grad_from(float x, float e) { return 0.5f * e + x * kInvSqrt2Pi * std::exp(-0.5f * x * x); }
inline float gelu(float x) { return gelu_from(x, gelu_e(x)); }
inline float gelu_grad(float x) { return gelu_grad_from(x, gelu_e(x)); }

// Whether the vector forms run here: a CPU with AVX-512 F and DQ, and a C library whose
// erff and expf they reproduce (checked once, in about 2 ms).
bool vectorized();

// y[i] = erff(x[i]) and y[i] = expf(x[i]), as the C library computes them.
void erf_n(const float* x, float* y, int64_t n);
void exp_n(const float* x, float* y, int64_t n);

// The GELU 0.5 x (1 + erf(x / sqrt 2)) and its gradient over n elements, as the scalar
// forms compute them: y = gelu(x); dx = dy gelu'(x); y = gelu(x) with g *= gelu'(x).
void forward(const float* x, float* y, int64_t n);
void backward(const float* dy, const float* x, float* dx, int64_t n);
void forward_with_grad(const float* x, float* y, float* g, int64_t n);

}  // namespace hone::cpu_gelu
