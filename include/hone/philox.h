#pragma once
// Philox4x32-10, the counter-based generator (Salmon et al., SC'11). Every random number
// hone draws (weight init, dropout masks, data order) is a pure function of
// (seed, stream, index), so the CPU and CUDA backends produce the same bits in any
// thread order.
#include <cstdint>

#if defined(__CUDACC__)
#define HONE_HD __host__ __device__ __forceinline__
#else
#define HONE_HD inline
#endif

namespace hone {

struct Philox4 {
  uint32_t v[4];
};

// The round multipliers and the key's increments (Weyl constants).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// The high and low words of m c. On the GPU one PTX mul.wide.u32, which ptxas makes one
// IMAD.WIDE: from a 64-bit product of zero-extended words, or from __umulhi and a plain
// product, it added a zero register to the high word after most multiplies (two adds a
// round, beside two multiplies and two three-way xors, in the dropout kernels).
HONE_HD void philox_multiply(uint32_t m, uint32_t c, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  uint64_t p;
  asm("mul.wide.u32 %0, %1, %2;" : "=l"(p) : "r"(m), "r"(c));
#else
  const uint64_t p = uint64_t(m) * c;
#endif
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

HONE_HD Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_multiply(kPhiloxM0, c0, hi0, lo0);
    philox_multiply(kPhiloxM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c0, c1, c2, c3}};
}

// Four random words for block `block` of stream `stream` under `seed`.
HONE_HD Philox4 philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32(uint32_t(block), uint32_t(block >> 32), uint32_t(stream), uint32_t(stream >> 32),
                    uint32_t(seed), uint32_t(seed >> 32));
}

// Word k (0..3) of a block, chosen without indexing the array (which would put the block in
// local memory in a GPU kernel).
HONE_HD uint32_t pick_word(const Philox4& r, uint32_t k) {
  return k & 2 ? (k & 1 ? r.v[3] : r.v[2]) : (k & 1 ? r.v[1] : r.v[0]);
}

// The 32-bit word for element i: word i % 4 of block i / 4.
HONE_HD uint32_t philox_word(uint64_t seed, uint64_t stream, uint64_t i) {
  return pick_word(philox_block(seed, stream, i >> 2), uint32_t(i & 3));
}

// Uniform in [0, 1) with 24 bits.
HONE_HD float uniform_from_word(uint32_t w) { return float(w >> 8) * (1.0f / 16777216.0f); }

// Dropout keeps element i when its uniform is >= p.
HONE_HD bool dropout_keep(uint64_t seed, uint64_t stream, uint64_t i, float p) {
  return uniform_from_word(philox_word(seed, stream, i)) >= p;
}

// Attention's probabilities are S^2 per head, so their mask draws 16 bits per element,
// eight elements per Philox block, which halves the generator's work: element i takes
// half i % 2 (the low half first) of word (i / 2) % 4 of block i / 8, and is kept when
// that half is >= attention_keep_threshold(p). The kept fraction is then
// 1 - ceil(p 2^16) / 2^16, within 2^-16 of 1 - p.
HONE_HD uint32_t attention_keep_threshold(float p) {
  const float t = p * 65536.0f;  // exact: a power-of-two scale
  const uint32_t whole = uint32_t(t);
  return whole + (float(whole) < t ? 1u : 0u);  // ceil(t), the same on host and device
}

HONE_HD bool attention_half_kept(uint32_t word, uint32_t half, uint32_t threshold) {
  return ((word >> (16 * half)) & 0xffffu) >= threshold;
}

HONE_HD bool attention_keep(uint64_t seed, uint64_t stream, uint64_t i, float p) {
  const Philox4 r = philox_block(seed, stream, i >> 3);
  return attention_half_kept(pick_word(r, uint32_t(i >> 1) & 3u), uint32_t(i & 1), attention_keep_threshold(p));
}

}  // namespace hone
