// cpu_dropout.h's masks.
#include "ops/cpu_dropout.h"

// GCC 12's AVX-512 headers build some results from deliberately undefined vectors.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "hone/philox.h"

namespace hone::cpu_dropout {

namespace {

#define HONE_AVX512 __attribute__((target("avx512f,avx512bw,bmi2")))

constexpr int kBlocks = 16;  // Philox blocks a vector pass draws

// The high and low 32 bits of a[i] * m for each of the 16 lanes: vpmuludq multiplies the
// even lanes, so the odd ones are shifted down for a second multiply.
HONE_AVX512 void mul_hi_lo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// Words 0..3 of blocks first .. first + 15 (the low halves of their indices do not wrap).
struct Words {
  __m512i v[4];
};

HONE_AVX512 Words philox16(uint64_t seed, uint64_t stream, uint64_t first) {
  const __m512i m0 = _mm512_set1_epi32(int(kPhiloxM0)), m1 = _mm512_set1_epi32(int(kPhiloxM1));
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(int(uint32_t(first))),
                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i c1 = _mm512_set1_epi32(int(uint32_t(first >> 32)));
  __m512i c2 = _mm512_set1_epi32(int(uint32_t(stream)));
  __m512i c3 = _mm512_set1_epi32(int(uint32_t(stream >> 32)));
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    __m512i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32(int(k0)), 0x96);  // three-way xor
    c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32(int(k1)), 0x96);
    c1 = lo1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c0, c1, c2, c3}};
}

// Elements 4 j + w, j < 16, w < 4: word w of block j against p as uniform_from_word does.
HONE_AVX512 void keep64(const Words& r, float p, uint8_t* keep) {
  uint64_t bits = 0;
  for (int w = 0; w < 4; ++w) {
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r.v[w], 8)), _mm512_set1_ps(1.0f / 16777216.0f));
    const __mmask16 kept = _mm512_cmp_ps_mask(u, _mm512_set1_ps(p), _CMP_GE_OQ);
    bits |= _pdep_u64(kept, 0x1111111111111111ull << w);
  }
  _mm512_storeu_si512(keep, _mm512_maskz_set1_epi8(bits, 1));
}

// Elements 8 j + 2 w + h: half h of word w of block j against the threshold.
HONE_AVX512 void attention_keep128(const Words& r, uint32_t threshold, uint8_t* keep) {
  uint64_t low = 0, high = 0;  // blocks 0-7, 8-15
  for (int w = 0; w < 4; ++w)
    for (int h = 0; h < 2; ++h) {
      const __m512i half = _mm512_and_si512(_mm512_srli_epi32(r.v[w], unsigned(16 * h)), _mm512_set1_epi32(0xffff));
      const __mmask16 kept = _mm512_cmpge_epu32_mask(half, _mm512_set1_epi32(int(threshold)));
      const uint64_t lanes = 0x0101010101010101ull << (2 * w + h);
      low |= _pdep_u64(kept & 0xffu, lanes);
      high |= _pdep_u64(kept >> 8, lanes);
    }
  _mm512_storeu_si512(keep, _mm512_maskz_set1_epi8(low, 1));
  _mm512_storeu_si512(keep + 64, _mm512_maskz_set1_epi8(high, 1));
}

// Whether blocks first .. first + 15 share the high half of their index.
bool no_wrap(uint64_t first) { return uint32_t(first) <= 0xFFFFFFFFu - (kBlocks - 1); }

// Fills keep[0, n) for elements begin.. with passes of `per_pass` elements that `pass`
// writes from a block's start; a pass that starts inside a block, or ends early, goes
// through a buffer. Returns how many it wrote: it stops before a pass whose block index
// would wrap.
template <int per_pass, typename Pass>
HONE_AVX512 int64_t by_passes(uint64_t begin, int64_t n, uint8_t* keep, Pass pass) {
  constexpr int per_block = per_pass / kBlocks;
  int64_t k = 0;
  while (k < n) {
    const uint64_t i = begin + uint64_t(k), first = i / per_block;
    if (!no_wrap(first)) break;
    const int64_t skip = int64_t(i % per_block), take = std::min<int64_t>(n - k, per_pass - skip);
    if (take == per_pass) {
      pass(first, keep + k);
    } else {
      alignas(64) uint8_t whole[per_pass];
      pass(first, whole);
      std::memcpy(keep + k, whole + skip, size_t(take));
    }
    k += take;
  }
  return k;
}

// One pass of each mask from block `first`; only scalars cross into the lambdas below,
// which are built without AVX-512.
HONE_AVX512 void dropout_pass(uint64_t seed, uint64_t stream, float p, uint64_t first, uint8_t* out) {
  keep64(philox16(seed, stream, first), p, out);
}

HONE_AVX512 void attention_pass(uint64_t seed, uint64_t stream, uint32_t threshold, uint64_t first, uint8_t* out) {
  attention_keep128(philox16(seed, stream, first), threshold, out);
}

HONE_AVX512 int64_t keep_mask_avx512(uint64_t seed, uint64_t stream, float p, uint64_t begin, int64_t n,
                                     uint8_t* keep) {
  return by_passes<4 * kBlocks>(begin, n, keep,
                                [&](uint64_t first, uint8_t* out) { dropout_pass(seed, stream, p, first, out); });
}

HONE_AVX512 int64_t attention_keep_mask_avx512(uint64_t seed, uint64_t stream, uint32_t threshold, uint64_t begin,
                                               int64_t n, uint8_t* keep) {
  return by_passes<8 * kBlocks>(begin, n, keep,
                                [&](uint64_t first, uint8_t* out) { attention_pass(seed, stream, threshold, first, out); });
}

// Whether the vector forms run here.
bool vectorized() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2");
  }();
  return yes;
}

}  // namespace

void keep_mask(const DropoutSpec& d, uint64_t begin, int64_t n, uint8_t* keep) {
  const uint64_t stream = dropout_stream(d);
  int64_t k = vectorized() ? keep_mask_avx512(d.seed, stream, d.p, begin, n, keep) : 0;
  while (k < n) {  // the rest a block at a time
    const uint64_t i = begin + uint64_t(k);
    const Philox4 r = philox_block(d.seed, stream, i >> 2);
    for (uint64_t w = i & 3; w < 4 && k < n; ++w, ++k) keep[k] = uniform_from_word(r.v[w]) >= d.p;
  }
}

void attention_keep_mask(const DropoutSpec& d, uint64_t begin, int64_t n, uint8_t* keep) {
  const uint64_t stream = dropout_stream(d);
  const uint32_t threshold = attention_keep_threshold(d.p);
  int64_t k = vectorized() ? attention_keep_mask_avx512(d.seed, stream, threshold, begin, n, keep) : 0;
  while (k < n) {  // the rest a block at a time
    const uint64_t i = begin + uint64_t(k);
    const Philox4 r = philox_block(d.seed, stream, i >> 3);
    for (uint64_t e = i & 7; e < 8 && k < n; ++e, ++k)
      keep[k] = attention_half_kept(r.v[e >> 1], uint32_t(e & 1), threshold);
  }
}

}  // namespace hone::cpu_dropout
