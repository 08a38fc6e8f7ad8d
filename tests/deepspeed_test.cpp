// --deepspeed's configuration file: "auto" filled from the flags, other values checked against
// them, fields hone lacks named, and DeepSpeed's schedulers stepped as its engine steps them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "hone/deepspeed.h"
#include "hone/error.h"
#include "test_util.h"

namespace hone {
namespace {

struct Ds {
  test::TempDir dir;
  std::string write(const std::string& text) {
    const std::string path = dir.path + "/ds_config.json";
    std::ofstream(path) << text;
    return path;
  }
  DeepSpeedConfig load(const std::string& text, const TrainingArguments& a = {}) {
    return load_deepspeed_config(write(text), a);
  }
  // The error message of loading `text`, or "" when it loads.
  std::string error(const std::string& text, const TrainingArguments& a = {}) {
    try {
      load(text, a);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(DeepSpeedConfig, AutoValuesTakeTheFlagsAndOffloadIsRead) {
  Ds ds;
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.gradient_accumulation_steps = 8;
  a.bf16 = true;
  const DeepSpeedConfig c = ds.load(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "overlap_comm": true, "reduce_bucket_size": "auto", "contiguous_gradients": true}})",
                                    a);
  EXPECT_EQ(c.zero_stage, 2);
  EXPECT_TRUE(c.offload_optimizer);
  EXPECT_TRUE(c.pin_memory);
  EXPECT_TRUE(c.overlap_comm);
  EXPECT_EQ(c.optimizer_type, "AdamW");
  EXPECT_FALSE(c.scheduler);
  EXPECT_EQ(c.no_effect, (std::vector<std::string>{"zero_optimization.contiguous_gradients",
                                                    "zero_optimization.reduce_bucket_size"}));
  // Explicit values that agree with the flags are fine too.
  EXPECT_EQ(ds.error(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                         "bf16": {"enabled": true}})",
                     a),
            "");
}

TEST(DeepSpeedConfig, EveryValueThatDisagreesWithTheFlagsIsListed) {
  Ds ds;
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  const std::string e = ds.error(R"({"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.5,
      "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.98]}}})",
                                 a);
  for (const char* part : {"ds_config.json", "train_micro_batch_size_per_gpu=8 vs hone per_device_train_batch_size=4",
                           "gradient_clipping=0.5 vs hone max_grad_norm=1", "bf16.enabled=true vs hone bf16=false",
                           "optimizer.params.lr=3e-05 vs hone learning_rate=5e-05",
                           "optimizer.params.betas[1]=0.98 vs hone adam_beta2=0.999", "\"auto\""})
    EXPECT_TRUE(has(e, part)) << part << "\n" << e;
  EXPECT_FALSE(has(e, "betas[0]")) << e;
  // train_batch_size is the micro batch times accumulation on one GPU.
  EXPECT_TRUE(has(ds.error(R"({"train_batch_size": 16})", a), "train_batch_size=16")) << ds.error(R"({"train_batch_size": 16})", a);
}

TEST(DeepSpeedConfig, WhatHoneDoesNotImplementIsNamed) {
  Ds ds;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"zero_optimization": {"stage": 3}})", "zero_optimization.stage: stage 3"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})", "NVMe"},
      {R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", "zero_optimization.offload_param"},
      {R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})", "needs stage 1 or 2"},
      {R"({"activation_checkpointing": {}})", "activation_checkpointing: hone does not implement"},
      {R"({"optimizer": {"type": "Lamb"}})", "optimizer.type: 'Lamb'"},
      {R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", "L2 weight decay"},
      {R"({"scheduler": {"type": "OneCycle"}})", "scheduler.type: 'OneCycle'"},
      {R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})", "total_num_steps"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})", "expected log or linear"},
      {R"({"zero_optimization": {"stage": "two"}})", "zero_optimization.stage: expected an integer"},
      {R"({"gradient_clipping": "1.0"})", "gradient_clipping: expected a number or \"auto\""},
      {R"([1, 2])", "expected a JSON object"},
      {R"({"zero_optimization": )", "not valid JSON"},
  };
  for (const auto& [text, part] : cases) {
    const std::string e = ds.error(text);
    EXPECT_TRUE(has(e, part)) << text << "\n" << e;
  }
  TrainingArguments fp16;
  fp16.fp16 = true;
  EXPECT_TRUE(has(ds.error(R"({"fp16": {"enabled": true, "hysteresis": 2}})", fp16), "fp16.hysteresis"));
  TrainingArguments adafactor;
  adafactor.optim = "adafactor";
  EXPECT_TRUE(has(ds.error(R"({"optimizer": {"type": "AdamW"}})", adafactor), "only one optimizer"));
  EXPECT_TRUE(has(ds.error("", {}), "not valid JSON"));
  EXPECT_TRUE(has([] {
    try {
      load_deepspeed_config("/nonexistent/ds.json", {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), "cannot open"));
}

TEST(DeepSpeedConfig, SchedulerStepCountsFillFromTheRunAndExplicitOnesMustAgree) {
  Ds ds;
  TrainingArguments a;
  a.warmup_ratio = 0.1;
  const DeepSpeedConfig c = ds.load(
      R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
          "warmup_num_steps": "auto", "total_num_steps": "auto"}}})",
      a);
  const DeepSpeedSteps steps = deepspeed_schedule_steps(c, a, 95);
  EXPECT_EQ(steps.warmup, 10);  // ceil(0.1 x 95)
  EXPECT_EQ(steps.total, 95);
  EXPECT_EQ(c.scheduler->warmup_max_lr, a.learning_rate);

  const DeepSpeedConfig explicit_counts = ds.load(
      R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100}}})", a);
  try {
    deepspeed_schedule_steps(explicit_counts, a, 95);
    ADD_FAILURE() << "total_num_steps 100 for a run of 95 updates was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "total_num_steps=100 vs hone updates of this run=95")) << e.what();
  }
  // Absent, warmup_num_steps is DeepSpeed's default and is not checked.
  const DeepSpeedConfig absent = ds.load(R"({"scheduler": {"type": "WarmupLR"}})", a);
  EXPECT_EQ(deepspeed_schedule_steps(absent, a, 95).warmup, 1000);
}

// DeepSpeed's engine steps its scheduler after each update, starting at iteration -1: the
// first update runs at the initial value, update k >= 2 at iteration k - 2.
TEST(DeepSpeedSchedule, LearningRatesAreDeepSpeedsPerUpdate) {
  DeepSpeedScheduler log_warmup;
  log_warmup.type = "WarmupLR";
  log_warmup.warmup_min_lr = 0;
  log_warmup.warmup_max_lr = 1e-3;
  const DeepSpeedSteps ten{10, 0};
  EXPECT_EQ(deepspeed_learning_rate(log_warmup, ten, 1e-3, 1), 0.0);
  EXPECT_EQ(deepspeed_learning_rate(log_warmup, ten, 1e-3, 2), 0.0);                          // log(1) = 0
  EXPECT_NEAR(deepspeed_learning_rate(log_warmup, ten, 1e-3, 3), 1e-3 * 0.301029995663981, 1e-15);  // log 2 / log 10
  EXPECT_EQ(deepspeed_learning_rate(log_warmup, ten, 1e-3, 12), 1e-3);
  EXPECT_EQ(deepspeed_learning_rate(log_warmup, ten, 1e-3, 500), 1e-3);

  DeepSpeedScheduler decay = log_warmup;
  decay.type = "WarmupDecayLR";
  decay.warmup_type = "linear";
  decay.warmup_min_lr = 1e-5;
  const DeepSpeedSteps four_of_ten{4, 10};
  EXPECT_EQ(deepspeed_learning_rate(decay, four_of_ten, 1e-3, 1), 1e-5);
  EXPECT_NEAR(deepspeed_learning_rate(decay, four_of_ten, 1e-3, 4), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-15);  // it 2 of 4
  EXPECT_NEAR(deepspeed_learning_rate(decay, four_of_ten, 1e-3, 6), 1e-3, 1e-15);                        // it 4: (10-4)/6
  EXPECT_NEAR(deepspeed_learning_rate(decay, four_of_ten, 1e-3, 9), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-15);  // it 7: 3/6
  EXPECT_EQ(deepspeed_learning_rate(decay, four_of_ten, 1e-3, 20), 1e-5);                               // past the end

  DeepSpeedScheduler cosine;
  cosine.type = "WarmupCosineLR";
  cosine.warmup_type = "linear";
  cosine.warmup_min_ratio = 0.1;
  EXPECT_EQ(deepspeed_learning_rate(cosine, four_of_ten, 2e-4, 1), 0.0);
  EXPECT_NEAR(deepspeed_learning_rate(cosine, four_of_ten, 2e-4, 3), 2e-4 * (0.1 + 0.25 * 0.9), 1e-18);  // it 1 of 4
  const double half = (1 + std::cos(M_PI / 6)) / 2;                                         // it 4: step 1 of 6
  EXPECT_NEAR(deepspeed_learning_rate(cosine, four_of_ten, 2e-4, 6), 2e-4 * (1e-4 + (1 - 1e-4) * half), 1e-18);
  EXPECT_NEAR(deepspeed_learning_rate(cosine, four_of_ten, 2e-4, 11), 2e-4 * 1e-4, 1e-18);  // it 9: the cosine's end
}

}  // namespace
}  // namespace hone
