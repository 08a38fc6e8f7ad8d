// Fitting a run into memory from its plan: sizes, the largest batch, the configurations.
#include "hone/fit.h"

#include <gtest/gtest.h>

#include "hone/cpu_backend.h"
#include "hone/error.h"

namespace hone {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 128;
  c.max_position_embeddings = 64;
  return c;
}

uint64_t plan_bytes(const TrainingArguments& a, CpuBackend& be) {
  return TrainingRun::plan(a, small_config(), 64, be, gradient_memory_for(a)).total_bytes();
}

TEST(Fit, MemorySizesTakeDecimalAndBinaryUnits) {
  EXPECT_EQ(parse_memory_size("16GB"), 16'000'000'000u);
  EXPECT_EQ(parse_memory_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_memory_size("512mib"), 512ull << 20);
  EXPECT_EQ(parse_memory_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_memory_size("4096"), 4096u);
  for (const char* bad : {"", "GB", "-1GB", "16 GB", "16XB", "nan"})
    EXPECT_THROW(parse_memory_size(bad), Error) << bad;
}

TEST(Fit, LargestBatchIsTheLargestWhosePlanFits) {
  CpuBackend be;
  TrainingArguments a;
  a.per_device_train_batch_size = 16;
  TrainingArguments five = a;
  five.per_device_train_batch_size = 5;
  const uint64_t at_five = plan_bytes(five, be);
  uint64_t bytes = 0;
  EXPECT_EQ(largest_fitting_batch(a, small_config(), 64, be, {}, at_five, &bytes), 5);
  EXPECT_EQ(bytes, at_five);
  EXPECT_EQ(largest_fitting_batch(a, small_config(), 64, be, {}, at_five - 1), 4);
  EXPECT_EQ(largest_fitting_batch(a, small_config(), 64, be, {}, uint64_t(1) << 40), 16);  // never past the request
  EXPECT_EQ(largest_fitting_batch(a, small_config(), 64, be, {}, 1000, &bytes), 0);
  TrainingArguments one = a;
  one.per_device_train_batch_size = 1;
  EXPECT_EQ(bytes, plan_bytes(one, be)) << "what batch 1 would need, for the message";
}

TEST(Fit, ConfigurationsFitKeepSamplesPerUpdateAndComeFastestFirst) {
  CpuBackend be;
  TrainingArguments a;
  a.per_device_train_batch_size = 8;
  a.gradient_accumulation_steps = 2;
  const uint64_t budget = plan_bytes(a, be) / 2;  // the run as asked does not fit
  const std::vector<FitCandidate> fits = fitting_configurations(a, small_config(), 64, be, {}, budget, true);
  ASSERT_FALSE(fits.empty());
  bool checkpointing = false, bf16 = false;
  for (size_t i = 0; i < fits.size(); ++i) {
    const FitCandidate& f = fits[i];
    EXPECT_LE(f.plan_bytes, budget) << f.methods();
    EXPECT_EQ(f.plan_bytes, plan_bytes(f.args, be)) << f.methods();
    EXPECT_EQ(f.args.per_device_train_batch_size * f.args.gradient_accumulation_steps, 16) << f.methods();
    if (i > 0) {
      EXPECT_GE(f.relative_time, fits[i - 1].relative_time);
    }
    checkpointing |= f.args.gradient_checkpointing;
    bf16 |= f.args.bf16;
  }
  EXPECT_EQ(fits.front().relative_time, 1.0);
  EXPECT_TRUE(checkpointing && bf16);
  // Without mixed precision on offer, every candidate keeps fp32.
  for (const FitCandidate& f : fitting_configurations(a, small_config(), 64, be, {}, budget, false))
    EXPECT_FALSE(f.args.bf16) << f.methods();
}

}  // namespace
}  // namespace hone
