#include "hone/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "hone/error.h"

namespace hone {
namespace {

TrainingArguments schedule(const std::string& type, int64_t warmup_steps, double lr = 1e-3) {
  TrainingArguments a;
  a.lr_scheduler_type = type;
  a.warmup_steps = warmup_steps;
  a.learning_rate = lr;
  return a;
}

TEST(Schedule, LinearWithWarmup) {
  const TrainingArguments a = schedule("linear", 2);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 0, 10), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1, 10), 0.5 * 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 2, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 5, 10), 5.0 / 8.0 * 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 9, 10), 1.0 / 8.0 * 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 10, 10), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 12, 10), 0.0);  // clamped, never negative
}

TEST(Schedule, LinearWithoutWarmupStartsAtFullRate) {
  const TrainingArguments a = schedule("linear", 0);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 0, 4), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1, 4), 0.75e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 3, 4), 0.25e-3);
}

TEST(Schedule, WarmupAsLongAsTrainingDoesNotDivideByZero) {
  const TrainingArguments a = schedule("linear", 5);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 4, 5), 0.8e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 5, 5), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(schedule("cosine", 5), 5, 5), 1e-3);  // progress 0
}

TEST(Schedule, ConstantIgnoresWarmup) {
  const TrainingArguments a = schedule("constant", 3);
  for (int64_t step : {0, 1, 3, 9, 20}) EXPECT_DOUBLE_EQ(learning_rate_at(a, step, 10), 1e-3);
}

TEST(Schedule, ConstantWithWarmup) {
  const TrainingArguments a = schedule("constant_with_warmup", 4);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 0, 10), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1, 10), 0.25e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 3, 10), 0.75e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 4, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 10, 10), 1e-3);
}

TEST(Schedule, CosineWithWarmup) {
  const TrainingArguments a = schedule("cosine", 2);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 0, 10), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1, 10), 0.5e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 2, 10), 1e-3);
  // progress 2/8: 0.5 * (1 + cos(pi / 4)) = 0.5 + sqrt(2) / 4
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 4, 10), 0.8535533905932737e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 6, 10), 0.5e-3);  // progress 1/2
  // progress 6/8: 0.5 - sqrt(2) / 4
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 8, 10), 0.14644660940672624e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 10, 10), 0.0);
}

TEST(Schedule, ResolveWarmupSteps) {
  TrainingArguments a;
  EXPECT_EQ(resolve_warmup_steps(a, 100), 0);
  a.warmup_ratio = 0.1;
  EXPECT_EQ(resolve_warmup_steps(a, 100), 10);
  EXPECT_EQ(resolve_warmup_steps(a, 15), 2);  // ceil(1.5)
  a.warmup_ratio = 0.07;
  EXPECT_EQ(resolve_warmup_steps(a, 100), 8);  // 100 * 0.07 is 7.000000000000001, as in Python
  a.warmup_steps = 3;
  EXPECT_EQ(resolve_warmup_steps(a, 10), 3);  // warmup_steps > 0 overrides the ratio
}

TEST(Schedule, WarmupRatioFeedsTheSchedule) {
  TrainingArguments a = schedule("linear", 0);
  a.warmup_ratio = 0.2;  // 2 of 10 steps
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1, 10), 0.5e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 5, 10), 5.0 / 8.0 * 1e-3);
}

TEST(Schedule, UnknownTypeThrows) {
  EXPECT_THROW(learning_rate_at(schedule("polynomial", 0), 0, 10), Error);
}

}  // namespace
}  // namespace hone
