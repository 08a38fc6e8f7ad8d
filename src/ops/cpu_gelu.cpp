// cpu_gelu.h's vector forms. Built with -ffp-contract=off (CMakeLists.txt): a multiply
// and an add stay two roundings, as in the scalar code on x86-64, and the fused
// multiply-adds below are those glibc's expf makes on CPUs with FMA (which every AVX-512
// CPU has).
#include "ops/cpu_gelu.h"

// GCC 12's AVX-512 headers build some results from deliberately undefined vectors.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <vector>

namespace hone::cpu_gelu {

#if defined(__x86_64__) && defined(__GNUC__)
#define HONE_GELU_VECTOR 1
#define HONE_AVX512 __attribute__((target("avx512f,avx512dq")))

namespace {

// exp's table: the bits of 2^(i/32) less i << 47, so that adding k << 47 for k = i mod 32
// scales it by 2^(k div 32).
struct ExpTable {
  alignas(64) uint64_t bits[32];
};
const ExpTable& exp_table() {
  static const ExpTable table = [] {
    ExpTable t{};
    for (int i = 0; i < 32; ++i) {
      const double v = double(std::exp2(static_cast<long double>(i) / 32.0L));
      t.bits[i] = std::bit_cast<uint64_t>(v) - (uint64_t(i) << 47);
    }
    return t;
  }();
  return table;
}

HONE_AVX512 __m512 splat(float v) { return _mm512_set1_ps(v); }

// c[0] + z (c[1] + z (c[2] + ...)), innermost first, each product and sum rounded.
template <int N>
HONE_AVX512 __m512 horner(__m512 z, const float (&c)[N]) {
  __m512 acc = _mm512_mul_ps(z, splat(c[N - 1]));
  for (int i = N - 2; i > 0; --i) acc = _mm512_mul_ps(z, _mm512_add_ps(splat(c[i]), acc));
  return _mm512_add_ps(splat(c[0]), acc);
}

// expf of 8 lanes in double: k = round(x 32 / ln 2), r = x 32 / ln 2 - k, and
// 2^(k/32) (1 + c2 r + c1 r^2 + c0 r^3), rounded once to float.
HONE_AVX512 __m256 exp8(__m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d shift = _mm512_set1_pd(0x1.8p+52), scale = _mm512_set1_pd(0x1.71547652b82fep+0 * 32);
  __m512d kd = _mm512_add_pd(_mm512_mul_pd(scale, xd), shift);
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  const __m512d r = _mm512_fmsub_pd(scale, xd, kd);  // glibc's build contracts this one (not k's)
  const __m512i index = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  __m512i t = _mm512_i64gather_epi64(index, exp_table().bits, 8);
  t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
  const __m512d s = _mm512_castsi512_pd(t);
  const __m512d c0 = _mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32);
  const __m512d c1 = _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32);
  const __m512d c2 = _mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32);
  const __m512d p = _mm512_fmadd_pd(c0, r, c1);
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(p, r2, y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

// expf of 16 lanes, with the C library's answers past the table's range: +inf above
// log(FLT_MAX), 0 below log of half the least subnormal, NaN for NaN.
HONE_AVX512 __m512 exp16(__m512 x) {
  const __m256 lo = exp8(_mm512_castps512_ps256(x)), hi = exp8(_mm512_extractf32x8_ps(x, 1));
  __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, splat(0x1.62e42ep6f), _CMP_GT_OQ), splat(INFINITY));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, splat(-0x1.9fe368p6f), _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_add_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x);
}

HONE_AVX512 __mmask16 less(__m512i v, uint32_t bound) { return _mm512_cmplt_epi32_mask(v, _mm512_set1_epi32(int(bound))); }

// fdlibm's erff on 16 lanes: every range's formula on every lane, the lane's own kept.
HONE_AVX512 __m512 erf16(__m512 x) {
  static constexpr float pp[] = {1.2837916613e-01f, -3.2504209876e-01f, -2.8481749818e-02f, -5.7702702470e-03f,
                                 -2.3763017452e-05f};
  static constexpr float qq[] = {1.0f, 3.9791721106e-01f, 6.5022252500e-02f, 5.0813062117e-03f, 1.3249473704e-04f,
                                 -3.9602282413e-06f};
  static constexpr float pa[] = {-2.3621185683e-03f, 4.1485610604e-01f, -3.7220788002e-01f, 3.1834661961e-01f,
                                 -1.1089469492e-01f, 3.5478305072e-02f, -2.1663755178e-03f};
  static constexpr float qa[] = {1.0f, 1.0642088205e-01f, 5.4039794207e-01f, 7.1828655899e-02f, 1.2617121637e-01f,
                                 1.3637083583e-02f, 1.1984500103e-02f};
  static constexpr float ra[] = {-9.8649440333e-03f, -6.9385856390e-01f, -1.0558626175e+01f, -6.2375331879e+01f,
                                 -1.6239666748e+02f, -1.8460508728e+02f, -8.1287437439e+01f, -9.8143291473e+00f};
  static constexpr float sa[] = {1.0f, 1.9651271820e+01f, 1.3765776062e+02f, 4.3456588745e+02f, 6.4538726807e+02f,
                                 4.2900814819e+02f, 1.0863500214e+02f, 6.5702495575e+00f, -6.0424413532e-02f};
  static constexpr float rb[] = {-9.8649431020e-03f, -7.9928326607e-01f, -1.7757955551e+01f, -1.6063638306e+02f,
                                 -6.3756646729e+02f, -1.0250950928e+03f, -4.8351919556e+02f};
  static constexpr float sb[] = {1.0f, 3.0338060379e+01f, 3.2579251099e+02f, 1.5367296143e+03f, 3.1998581543e+03f,
                                 2.5530502930e+03f, 4.7452853394e+02f, -2.2440952301e+01f};
  constexpr float efx = 1.2837916613e-01f, erx = 8.4506291151e-01f, tiny = 1e-30f;
  const __m512 one = splat(1.0f);
  const __m512i hx = _mm512_castps_si512(x), ix = _mm512_and_si512(hx, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 negative = _mm512_cmplt_epi32_mask(hx, _mm512_setzero_si512());
  const __m512 ax = _mm512_castsi512_ps(ix);

  // 1.25 <= |x| < 6: 1 - exp(-z^2 - 0.5625) exp((z - x)(z + x) + R/S) / |x|, z |x| cut to 12
  // bits. Its two exps cost the most: skipped where no lane is in the range.
  __m512 y = _mm512_setzero_ps();
  if (_mm512_kandn(less(ix, 0x3fa00000), less(ix, 0x40c00000))) {
    const __m512 s = _mm512_div_ps(one, _mm512_mul_ps(ax, ax));
    const __mmask16 near = less(ix, 0x4036DB6E);
    const __m512 R = _mm512_mask_mov_ps(horner(s, rb), near, horner(s, ra));
    const __m512 S = _mm512_mask_mov_ps(horner(s, sb), near, horner(s, sa));
    const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(ix, _mm512_set1_epi32(int(0xfffff000u))));
    const __m512 e1 = exp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), z), z), splat(0.5625f)));
    const __m512 e2 =
        exp16(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(z, ax), _mm512_add_ps(z, ax)), _mm512_div_ps(R, S)));
    const __m512 q = _mm512_div_ps(_mm512_mul_ps(e1, e2), ax);
    y = _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, q), _mm512_sub_ps(q, one));
  }

  // 6 <= |x| < inf: +-(1 - tiny).
  const __mmask16 far = ~less(ix, 0x40c00000);
  y = _mm512_mask_mov_ps(y, far, _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, splat(tiny)),
                                                      _mm512_sub_ps(splat(tiny), one)));
  // inf and NaN: (1 - 2 sign) + 1 / x.
  if (const __mmask16 special = ~less(ix, 0x7f800000)) {
    const __m512 unit = _mm512_mask_blend_ps(negative, one, splat(-1.0f));
    y = _mm512_mask_mov_ps(y, special, _mm512_add_ps(unit, _mm512_div_ps(one, x)));
  }

  // 0.84375 <= |x| < 1.25: +-(erx + P/Q) in |x| - 1.
  const __m512 t = _mm512_sub_ps(ax, one);
  const __m512 pq = _mm512_div_ps(horner(t, pa), horner(t, qa));
  const __m512 middle = _mm512_mask_blend_ps(negative, _mm512_add_ps(splat(erx), pq),
                                             _mm512_sub_ps(splat(-erx), pq));
  y = _mm512_mask_mov_ps(y, less(ix, 0x3fa00000), middle);

  // |x| < 0.84375: x + x r/s in x^2; below 2^-28, x + efx x (scaled by 16 below 2^-120).
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 small = _mm512_add_ps(x, _mm512_mul_ps(x, _mm512_div_ps(horner(x2, pp), horner(x2, qq))));
  y = _mm512_mask_mov_ps(y, less(ix, 0x3f580000), small);
  y = _mm512_mask_mov_ps(y, less(ix, 0x31800000), _mm512_add_ps(x, _mm512_mul_ps(splat(efx), x)));
  const __m512 scaled = _mm512_mul_ps(
      splat(0.0625f), _mm512_add_ps(_mm512_mul_ps(splat(16.0f), x), _mm512_mul_ps(splat(16.0f * efx), x)));
  return _mm512_mask_mov_ps(y, less(ix, 0x04000000), scaled);
}

struct Gelu {
  __m512 x, e;  // e = 1 + erf(x / sqrt 2)
};
HONE_AVX512 Gelu gelu_e16(__m512 x) { return {x, _mm512_add_ps(splat(1.0f), erf16(_mm512_mul_ps(x, splat(kInvSqrt2))))}; }
HONE_AVX512 __m512 value(const Gelu& g) { return _mm512_mul_ps(_mm512_mul_ps(splat(0.5f), g.x), g.e); }
HONE_AVX512 __m512 slope(const Gelu& g) {
  const __m512 bell = exp16(_mm512_mul_ps(_mm512_mul_ps(splat(-0.5f), g.x), g.x));
  return _mm512_add_ps(_mm512_mul_ps(splat(0.5f), g.e), _mm512_mul_ps(_mm512_mul_ps(g.x, splat(kInvSqrt2Pi)), bell));
}

// The lanes of elements [i, n) in a group of 16 starting at i: all but in the last group.
inline __mmask16 lanes_from(int64_t i, int64_t n) {
  return __mmask16(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
}

HONE_AVX512 void erf_avx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_from(i, n);
    _mm512_mask_storeu_ps(y + i, m, erf16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
HONE_AVX512 void exp_avx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_from(i, n);
    _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
HONE_AVX512 void forward_avx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_from(i, n);
    _mm512_mask_storeu_ps(y + i, m, value(gelu_e16(_mm512_maskz_loadu_ps(m, x + i))));
  }
}
HONE_AVX512 void backward_avx512(const float* dy, const float* x, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_from(i, n);
    const __m512 d = _mm512_maskz_loadu_ps(m, dy + i);
    _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(d, slope(gelu_e16(_mm512_maskz_loadu_ps(m, x + i)))));
  }
}
HONE_AVX512 void forward_with_grad_avx512(const float* x, float* y, float* g, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_from(i, n);
    const Gelu v = gelu_e16(_mm512_maskz_loadu_ps(m, x + i));
    _mm512_mask_storeu_ps(y + i, m, value(v));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + i), slope(v)));
  }
}

}  // namespace
#endif

#ifdef HONE_GELU_VECTOR
namespace {

// Whether this C library's erff and expf are the ones the vector forms reproduce: a sweep
// of 65,536 float bit patterns, and two inputs on which expf's fused multiply-adds decide
// the last bit. (A library with other algorithms differs on many of them.)
bool same_as_the_c_library() {
  std::vector<float> x;
  for (uint64_t b = 5; b < (uint64_t(1) << 32); b += 65537) x.push_back(std::bit_cast<float>(uint32_t(b)));
  x.push_back(32.564632415771484f);
  x.push_back(-63.099460601806641f);
  const int64_t n = int64_t(x.size());
  std::vector<float> got(x.size());
  erf_avx512(x.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float want = std::erf(x[size_t(i)]);
    if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(got[size_t(i)])) return false;
  }
  exp_avx512(x.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float want = std::exp(x[size_t(i)]);
    if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(got[size_t(i)])) return false;
  }
  return true;
}

}  // namespace
#endif

bool vectorized() {
#ifdef HONE_GELU_VECTOR
  static const bool yes =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && same_as_the_c_library();
  return yes;
#else
  return false;
#endif
}

void erf_n(const float* x, float* y, int64_t n) {
#ifdef HONE_GELU_VECTOR
  if (vectorized()) return erf_avx512(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
}

void exp_n(const float* x, float* y, int64_t n) {
#ifdef HONE_GELU_VECTOR
  if (vectorized()) return exp_avx512(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

void forward(const float* x, float* y, int64_t n) {
#ifdef HONE_GELU_VECTOR
  if (vectorized()) return forward_avx512(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}

void backward(const float* dy, const float* x, float* dx, int64_t n) {
#ifdef HONE_GELU_VECTOR
  if (vectorized()) return backward_avx512(dy, x, dx, n);
#endif
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_grad(x[i]);
}

void forward_with_grad(const float* x, float* y, float* g, int64_t n) {
#ifdef HONE_GELU_VECTOR
  if (vectorized()) return forward_with_grad_avx512(x, y, g, n);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const float e = gelu_e(x[i]);
    y[i] = gelu_from(x[i], e);
    g[i] = g[i] * gelu_grad_from(x[i], e);
  }
}

}  // namespace hone::cpu_gelu
