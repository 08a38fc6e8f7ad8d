// bitsandbytes' blockwise 8-bit optimizers: the dynamic maps against bitsandbytes' own,
// the quantizer, the blockwise absmax, and what their state costs in the memory plan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "hone/trainer.h"
#include "ops/optim_8bit_math.h"

namespace hone {
namespace {

std::vector<float> map_of(bool is_signed) {
  std::vector<float> m(bnb::kMapSize);
  bnb::dynamic_map(is_signed, m.data());
  return m;
}

// sum of (k + 1) * bits(map[k]) mod 2^64.
uint64_t checksum(const std::vector<float>& m) {
  uint64_t sum = 0;
  for (size_t k = 0; k < m.size(); ++k) {
    uint32_t bits;
    std::memcpy(&bits, &m[k], 4);
    sum += (k + 1) * uint64_t(bits);
  }
  return sum;
}

// Expectations printed by bitsandbytes 0.50.2's create_dynamic_map(signed=True / False).
TEST(Optim8bit, DynamicMapsAreBitsandbytes) {
  const std::vector<float> s = map_of(true), u = map_of(false);
  EXPECT_EQ(checksum(s), 51200865550848ull);
  EXPECT_EQ(checksum(u), 34477682547726ull);
  EXPECT_EQ(s[0], -0.992968738079071f);
  EXPECT_EQ(s[127], 0.0f);
  EXPECT_EQ(s[128], 5.500000384017767e-07f);
  EXPECT_EQ(s[255], 1.0f);
  EXPECT_EQ(u[0], 0.0f);
  EXPECT_EQ(u[128], 0.11054687201976776f);
  EXPECT_EQ(u[254], 0.9964843988418579f);
}

TEST(Optim8bit, QuantizesToTheNearestEntry) {
  for (const bool is_signed : {true, false}) {
    const std::vector<float> m = map_of(is_signed);
    for (int c = 0; c < bnb::kMapSize; ++c) EXPECT_EQ(bnb::quantize(m.data(), is_signed, m[size_t(c)]), c) << c;
    // Between two neighbours: the nearer one, on either side of the midpoint.
    for (int c = 0; c + 1 < bnb::kMapSize; ++c) {
      const float lo = m[size_t(c)], hi = m[size_t(c + 1)];
      if (lo == hi) continue;
      const float mid = (lo + hi) / 2;
      EXPECT_EQ(bnb::quantize(m.data(), is_signed, std::nextafter(mid, lo)), c) << c;
      EXPECT_EQ(bnb::quantize(m.data(), is_signed, std::nextafter(mid, hi)), c + 1) << c;
    }
    // Round trip of values in range: no neighbour of the code is nearer, up to the
    // rounding of the midpoint that decides.
    for (float x = is_signed ? -1.0f : 0.0f; x <= 1.0f; x += 1.0f / 1024) {
      const uint8_t c = bnb::quantize(m.data(), is_signed, x);
      const float error = std::fabs(m[c] - x);
      const float below = c > 0 ? std::fabs(m[c - 1u] - x) : 1.0f, above = c < 255 ? std::fabs(m[c + 1u] - x) : 1.0f;
      EXPECT_LE(error, std::fmin(below, above) + 1e-6f) << x;
    }
  }
}

// One Lion step from zero state: the momentum becomes (1 - beta2) * g, each block's absmax
// the largest |momentum| of the block (the padding of the last block adds nothing), and
// every code dequantizes to within one map step of its momentum, with its sign.
TEST(Optim8bit, BlockwiseAbsmaxAndCodes) {
  const int64_t n = 4096 + 300;  // 17 full blocks and a partial one
  const int64_t blocks = bnb::blocks_of(n);
  ASSERT_EQ(blocks, 18);
  std::vector<float> param(size_t(n), 0.5f), grad(size_t(n), 0.0f), absmax(size_t(blocks), 0.0f);
  for (int64_t i = 0; i < n; ++i) grad[size_t(i)] = std::sin(0.37f * float(i)) * float(1 + i % 700);
  std::vector<uint8_t> codes(size_t(n), 0);
  std::vector<float> maps = map_of(true), norm_coef{0.0f, 1.0f, 0.0f};
  const Optim8bitScalars k = optim_8bit_scalars(1e-2, 0.9, 0.99, 1e-8, 0.0, 1);
  std::vector<float> scalars(kOptim8bitScalarsSize);
  std::memcpy(scalars.data(), &k, sizeof k);
  auto cpu = [](auto& v, DType t) { return Tensor{v.data(), t, {int64_t(v.size())}, Device::CPU}; };
  Optim8bitSlice x{cpu(param, DType::F32), cpu(grad, DType::F32), {}, false, cpu(codes, DType::U8), {},
                   cpu(absmax, DType::F32), {}};
  CpuBackend be;
  ops::optim_8bit(be, Optim8bitAlgo::Lion, &x, 1, cpu(scalars, DType::F32), cpu(maps, DType::F32),
                  cpu(norm_coef, DType::F32));
  for (int64_t b = 0; b < blocks; ++b) {
    float want = 0;
    for (int64_t i = b * 256; i < std::min(n, (b + 1) * 256); ++i)
      want = std::fmax(want, std::fabs(k.w2 * grad[size_t(i)]));
    EXPECT_EQ(absmax[size_t(b)], want) << "block " << b;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float m = k.w2 * grad[size_t(i)], a = absmax[size_t(i / 256)];
    const float got = maps[codes[size_t(i)]] * a;
    EXPECT_LE(std::fabs(got - m), 0.02f * a) << i;
    EXPECT_EQ(std::signbit(got), std::signbit(m)) << i;
    const float sign = float((grad[size_t(i)] > 0) - (grad[size_t(i)] < 0));
    EXPECT_EQ(param[size_t(i)], 0.5f - 1e-2f * sign) << i;
  }
}

// The state of a bert-base-like model: per tensor of 4096 elements or more, other than
// the embeddings, one byte per element and state plus 4 bytes per 256 elements; the
// other tensors 4 bytes per element and state; the maps; every buffer 256-byte aligned.
TEST(Optim8bit, PlanHoldsBlockwiseState) {
  const ModelConfig c;  // bert-base
  const ParamLayout layout(c);
  int64_t codes = 0, blocks = 0, small = 0;
  for (const ParamEntry& e : layout.entries()) {
    const int64_t n = e.shape.numel();
    if (n >= 4096 && !e.name.ends_with("_embeddings.weight")) {
      codes += n;
      blocks += (n + 255) / 256;
    } else {
      small += n;
    }
  }
  auto aligned = [](int64_t bytes) { return size_t((bytes + 255) / 256 * 256); };
  const size_t per_state = aligned((codes + 3) / 4 * 4) + aligned(4 * blocks) + aligned(4 * small);
  CpuBackend be;
  TrainingArguments a;
  a.per_device_train_batch_size = 2;
  for (const auto& [optim, states] : {std::pair{"adamw_8bit", 2}, std::pair{"adamw_bnb_8bit", 2},
                                       std::pair{"lion_8bit", 1}}) {
    a.optim = optim;
    const MemoryPlan plan = TrainingRun::plan(a, c, 128, be);
    const size_t bytes = plan.category_bytes[size_t(Category::OptimizerState)];
    EXPECT_EQ(bytes, states * per_state + aligned(4 * 256 * states)) << optim;
    // About one byte per quantized parameter and state.
    EXPECT_LT(double(bytes), states * (1.05 * double(codes) + 4.0 * double(small))) << optim;
  }
}

}  // namespace
}  // namespace hone
