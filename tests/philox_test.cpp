#include "hone/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/cpu_dropout.h"

namespace hone {
namespace {

void expect_words(const Philox4& got, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  EXPECT_EQ(got.v[0], a);
  EXPECT_EQ(got.v[1], b);
  EXPECT_EQ(got.v[2], c);
  EXPECT_EQ(got.v[3], d);
}

// Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
TEST(Philox, KnownAnswerVectors) {
  expect_words(philox4x32(0, 0, 0, 0, 0, 0), 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
  expect_words(philox4x32(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), 0x408f276d,
               0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  expect_words(philox4x32(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0), 0xd16cfe09,
               0x94fdcceb, 0x5001e420, 0x24126ea1);
}

TEST(Philox, BlockLayoutOfSeedStreamAndIndex) {
  const uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull, block = 0x1122334455667788ull;
  const Philox4 want = philox4x32(0x55667788, 0x11223344, 0x76543210, 0xfedcba98, 0x89abcdef, 0x01234567);
  const Philox4 got = philox_block(seed, stream, block);
  expect_words(got, want.v[0], want.v[1], want.v[2], want.v[3]);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(philox_word(seed, stream, block * 4 + w), want.v[w]);
}

// keep(seed, stream, i, p) keeps about 1 - p of a million elements.
void expect_keeps_one_minus_p(bool (*keep)(uint64_t, uint64_t, uint64_t, float)) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    int64_t kept = 0;
    const int64_t n = 1000000;
    for (int64_t i = 0; i < n; ++i) kept += keep(42, 7, uint64_t(i), p);
    EXPECT_NEAR(double(kept) / n, 1.0 - p, 0.003) << "p = " << p;
  }
}

TEST(Philox, DropoutKeepsOneMinusPOfAMillion) { expect_keeps_one_minus_p(dropout_keep); }
TEST(Philox, AttentionKeepsOneMinusPOfAMillion) { expect_keeps_one_minus_p(attention_keep); }

TEST(Philox, DropoutMasksDependOnSeedAndStream) {
  int same_seed = 0, same_stream = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_seed += dropout_keep(1, 0, i, 0.5f) == dropout_keep(2, 0, i, 0.5f);
    same_stream += dropout_keep(1, 0, i, 0.5f) == dropout_keep(1, 1, i, 0.5f);
  }
  EXPECT_NEAR(same_seed, 500, 60);
  EXPECT_NEAR(same_stream, 500, 60);
}

// The CPU draws masks sixteen blocks at a time in vector lanes (cpu_dropout.h), the rest a
// block at a time: that must give the per-element function's bits from any start, aligned
// to a block or not, over lengths that take whole and partial vector passes, where the low
// half of the block index wraps within a pass, and for a seed and stream with both halves
// set, writing nothing past the end.
template <typename Mask>
void expect_mask_matches(Mask mask, bool (*keep)(uint64_t, uint64_t, uint64_t, float), int per_block) {
  const uint64_t wrap = ((uint64_t(1) << 32) - 5) * uint64_t(per_block) + 3;  // 5 blocks before 2^32
  for (const DropoutSpec d : {DropoutSpec{0.3f, 99, 5}, DropoutSpec{0.9f, 0x123456789abcdefull, 0xfedcba987654321ull},
                              DropoutSpec{0.5f, 1, 2}}) {
    for (uint64_t begin : {uint64_t(0), uint64_t(1), uint64_t(3), uint64_t(4), uint64_t(7), uint64_t(8), uint64_t(1001), wrap}) {
      for (int64_t n : {0, 1, 3, 4, 5, 7, 8, 9, 17, 33, 64, 65, 127, 128, 200, 256, 300, 777}) {
        std::vector<uint8_t> seen(size_t(n) + 1, 7);
        mask(d, begin, n, seen.data());
        EXPECT_EQ(seen[size_t(n)], 7) << "written past the end";
        for (int64_t k = 0; k < n; ++k)
          ASSERT_EQ(int(seen[size_t(k)]), int(keep(d.seed, d.stream, begin + uint64_t(k), d.p)))
              << "p " << d.p << " begin " << begin << " k " << k;
      }
    }
  }
}

TEST(Philox, DropoutMaskMatchesDropoutKeep) { expect_mask_matches(cpu_dropout::keep_mask, dropout_keep, 4); }

TEST(Philox, AttentionMaskMatchesAttentionKeep) {
  expect_mask_matches(cpu_dropout::attention_keep_mask, attention_keep, 8);
}

// Attention's mask: 16 bits per element, eight elements per block, the low half first.
TEST(Philox, AttentionKeepLayout) {
  const uint64_t seed = 77, stream = 9;
  const float p = 0.3f;
  const uint32_t threshold = attention_keep_threshold(p);
  EXPECT_EQ(threshold, 19661u);  // ceil(0.3f * 65536)
  for (uint64_t i = 0; i < 64; ++i) {
    const uint32_t word = philox_block(seed, stream, i / 8).v[(i / 2) % 4];
    const uint32_t half = i % 2 ? word >> 16 : word & 0xffffu;
    EXPECT_EQ(attention_keep(seed, stream, i, p), half >= threshold) << i;
  }
}

TEST(Philox, AttentionKeepThresholdIsTheCeilingOfP16) {
  EXPECT_EQ(attention_keep_threshold(0.0f), 0u);  // keeps everything
  EXPECT_EQ(attention_keep_threshold(0.25f), 16384u);  // exact
  EXPECT_EQ(attention_keep_threshold(0.1f), 6554u);  // 6553.6 rounded up
  EXPECT_EQ(attention_keep_threshold(std::nextafter(1.0f, 0.0f)), 65536u);  // keeps nothing
}

}  // namespace
}  // namespace hone
