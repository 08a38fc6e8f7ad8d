#include "hone/args.h"

#include <gtest/gtest.h>

#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include "hone/error.h"
#include "hone/optimizer.h"
#include "test_util.h"
#include "train/arguments_cli.h"

namespace hone {
namespace {

using Argv = std::vector<std::string>;

// The message of the hone::Error that parsing `argv` throws ("" if it does not throw).
std::string parse_error(const Argv& argv) {
  try {
    parse_training_arguments(argv);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Arguments, DefaultsMatchHuggingFace) {
  const TrainingArguments a = parse_training_arguments({});
  EXPECT_EQ(a.output_dir, "trainer_output");
  EXPECT_EQ(a.per_device_train_batch_size, 8);
  EXPECT_EQ(a.gradient_accumulation_steps, 1);
  EXPECT_EQ(a.num_train_epochs, 3.0);
  EXPECT_EQ(a.max_steps, -1);
  EXPECT_EQ(a.learning_rate, 5e-5);
  EXPECT_EQ(a.weight_decay, 0.0);
  EXPECT_EQ(a.adam_beta1, 0.9);
  EXPECT_EQ(a.adam_beta2, 0.999);
  EXPECT_EQ(a.adam_epsilon, 1e-8);
  EXPECT_EQ(a.max_grad_norm, 1.0);
  EXPECT_EQ(a.lr_scheduler_type, "linear");
  EXPECT_EQ(a.warmup_ratio, 0.0);
  EXPECT_EQ(a.warmup_steps, 0);
  EXPECT_EQ(a.optim, "adamw_torch");
  EXPECT_EQ(a.seed, 42u);
  EXPECT_EQ(a.logging_steps, 500);
  EXPECT_FALSE(a.logging_first_step);
  EXPECT_FALSE(a.disable_tqdm);
  EXPECT_EQ(a.device, "auto");
  EXPECT_EQ(a.threads, 0);
}

TEST(Arguments, SeedCommandLine) {
  const TrainingArguments a = parse_training_arguments(
      {"--model_name_or_path", "bert-large-uncased", "--dataset", "synthetic:512x512",
       "--per_device_train_batch_size", "4", "--num_train_epochs", "1", "--output_dir", "out"});
  EXPECT_EQ(a.model_name_or_path, "bert-large-uncased");
  EXPECT_EQ(a.dataset, "synthetic:512x512");
  EXPECT_EQ(a.per_device_train_batch_size, 4);
  EXPECT_EQ(a.num_train_epochs, 1.0);
  EXPECT_EQ(a.output_dir, "out");
  EXPECT_EQ(a.learning_rate, 5e-5);  // untouched flags keep their defaults
}

TEST(Arguments, EveryFieldAsEqualsForm) {
  const TrainingArguments a = parse_training_arguments({
      "--model_name_or_path=m", "--dataset=synthetic:3x7", "--output_dir=o",
      "--per_device_train_batch_size=2", "--gradient_accumulation_steps=4",
      "--num_train_epochs=0.5", "--max_steps=100", "--learning_rate=1e-4",
      "--weight_decay=0.01", "--adam_beta1=0.8", "--adam_beta2=0.98", "--adam_epsilon=1e-6",
      "--max_grad_norm=0", "--lr_scheduler_type=cosine", "--warmup_ratio=0.1",
      "--warmup_steps=7", "--optim=adamw_torch_fused", "--seed=1234", "--logging_steps=10",
      "--logging_first_step=true", "--disable_tqdm=1", "--device=cpu", "--threads=3"});
  EXPECT_EQ(a.model_name_or_path, "m");
  EXPECT_EQ(a.dataset, "synthetic:3x7");
  EXPECT_EQ(a.output_dir, "o");
  EXPECT_EQ(a.per_device_train_batch_size, 2);
  EXPECT_EQ(a.gradient_accumulation_steps, 4);
  EXPECT_EQ(a.num_train_epochs, 0.5);
  EXPECT_EQ(a.max_steps, 100);
  EXPECT_EQ(a.learning_rate, 1e-4);
  EXPECT_EQ(a.weight_decay, 0.01);
  EXPECT_EQ(a.adam_beta1, 0.8);
  EXPECT_EQ(a.adam_beta2, 0.98);
  EXPECT_EQ(a.adam_epsilon, 1e-6);
  EXPECT_EQ(a.max_grad_norm, 0.0);  // 0 disables clipping, as in HF
  EXPECT_EQ(a.lr_scheduler_type, "cosine");
  EXPECT_EQ(a.warmup_ratio, 0.1);
  EXPECT_EQ(a.warmup_steps, 7);
  EXPECT_EQ(a.optim, "adamw_torch_fused");
  EXPECT_EQ(a.seed, 1234u);
  EXPECT_EQ(a.logging_steps, 10);
  EXPECT_TRUE(a.logging_first_step);
  EXPECT_TRUE(a.disable_tqdm);
  EXPECT_EQ(a.device, "cpu");
  EXPECT_EQ(a.threads, 3);
}

TEST(Arguments, BooleanForms) {
  for (const std::string flag : {"--disable_tqdm", "--logging_first_step"}) {
    const std::pair<Argv, bool> cases[] = {
        {{flag}, true},
        {{flag + "=true"}, true},
        {{flag + "=True"}, true},
        {{flag + "=1"}, true},
        {{flag + "=false"}, false},
        {{flag + "=False"}, false},
        {{flag + "=0"}, false},
        {{flag, "True"}, true},  // HF's `--flag True` spelling
        {{flag, "false"}, false},
        {{flag, "--seed", "1"}, true},
        {{flag, flag + "=false"}, false},
    };
    for (const auto& [argv, expected] : cases) {
      const TrainingArguments a = parse_training_arguments(argv);
      EXPECT_EQ(flag == "--disable_tqdm" ? a.disable_tqdm : a.logging_first_step, expected)
          << fmt::format("{}", fmt::join(argv, " "));
    }
    EXPECT_NE(parse_error({flag + "=maybe"}).find(flag), std::string::npos);
  }
}

TEST(Arguments, RepeatedFlagKeepsLastValueAsArgparse) {
  EXPECT_EQ(parse_training_arguments({"--learning_rate", "1", "--learning_rate=2"}).learning_rate,
            2.0);
}

TEST(Arguments, AcceptsNegativeNumbersAsValues) {
  EXPECT_EQ(parse_training_arguments({"--max_steps", "-1"}).max_steps, -1);
}

TEST(Arguments, MaxStepsReplacesEpochs) {
  EXPECT_EQ(parse_training_arguments({"--num_train_epochs", "0", "--max_steps", "10"}).max_steps,
            10);
}

TEST(Arguments, InvalidValuesNameTheFlag) {
  const std::pair<Argv, std::string> cases[] = {
      {{"--per_device_train_batch_size", "0"}, "--per_device_train_batch_size"},
      {{"--per_device_train_batch_size", "four"}, "--per_device_train_batch_size"},
      {{"--per_device_train_batch_size", "1.5"}, "--per_device_train_batch_size"},
      {{"--gradient_accumulation_steps", "0"}, "--gradient_accumulation_steps"},
      {{"--num_train_epochs", "0"}, "--num_train_epochs"},
      {{"--num_train_epochs", "-1", "--max_steps", "0"}, "--num_train_epochs"},
      {{"--learning_rate", "-1e-5"}, "--learning_rate"},
      {{"--learning_rate", "nan"}, "--learning_rate"},
      {{"--learning_rate", "inf"}, "--learning_rate"},
      {{"--learning_rate"}, "--learning_rate"},  // missing value
      {{"--weight_decay", "-0.1"}, "--weight_decay"},
      {{"--adam_beta1", "1"}, "--adam_beta1"},
      {{"--adam_beta1", "-0.1"}, "--adam_beta1"},
      {{"--adam_beta2", "1.5"}, "--adam_beta2"},
      {{"--adam_epsilon", "-1e-8"}, "--adam_epsilon"},
      {{"--max_grad_norm", "-1"}, "--max_grad_norm"},
      {{"--warmup_ratio", "1.1"}, "--warmup_ratio"},
      {{"--warmup_ratio", "-0.1"}, "--warmup_ratio"},
      {{"--warmup_steps", "-1"}, "--warmup_steps"},
      {{"--logging_steps", "0"}, "--logging_steps"},
      {{"--threads", "-1"}, "--threads"},
      {{"--seed", "abc"}, "--seed"},
      {{"--seed", "-1"}, "--seed"},
      {{"--lr_scheduler_type", "polynomial"}, "--lr_scheduler_type"},
      {{"--optim", "galore_adamw"}, "--optim"},
      {{"--optim_args", "momentum"}, "--optim_args"},
      {{"--optim_args", "momentum=0.9"}, "--optim_args"},
      {{"--device", "tpu"}, "--device"},
      {{"--dataset", "foo"}, "--dataset"},
      {{"--bf16", "--fp16"}, "--fp16"},
  };
  for (const auto& [argv, flag] : cases) {
    const std::string message = parse_error(argv);
    EXPECT_NE(message.find(flag), std::string::npos)
        << fmt::format("argv {}: message '{}'", fmt::join(argv, " "), message);
  }
}

TEST(Arguments, UnknownFlagIsCli11sMessage) {
  const std::string message = parse_error({"--per_device_batch_size", "4"});
  EXPECT_TRUE(message.starts_with("The following arguments were not expected: ")) << message;
  EXPECT_NE(message.find("--per_device_batch_size"), std::string::npos) << message;
  EXPECT_NE(parse_error({"out"}).find("not expected: out"), std::string::npos);
}

TEST(Arguments, UnsupportedChoicesListWhatIsSupported) {
  const std::string optim = parse_error({"--optim", "galore_adamw"});
  EXPECT_TRUE(optim.starts_with("--optim: hone does not implement 'galore_adamw'; supported: ")) << optim;
  for (std::string_view name : optimizer_names()) EXPECT_NE(optim.find(name), std::string::npos) << name;
  EXPECT_EQ(parse_error({"--lr_scheduler_type", "polynomial"}),
            "--lr_scheduler_type: hone does not implement 'polynomial' yet; supported: linear, "
            "constant, constant_with_warmup, cosine");
  EXPECT_EQ(parse_error({"--device", "tpu"}),
            "--device: expected one of auto, cpu, cuda, got 'tpu'");
}

// Trainer's --gradient_checkpointing, and hone's policy, which asks for it.
TEST(Arguments, GradientCheckpointing) {
  const TrainingArguments off = parse_training_arguments({});
  EXPECT_FALSE(off.gradient_checkpointing);
  EXPECT_EQ(off.gradient_checkpointing_policy, "");  // full
  EXPECT_TRUE(parse_training_arguments({"--gradient_checkpointing"}).gradient_checkpointing);
  EXPECT_TRUE(parse_training_arguments({"--gradient_checkpointing", "True"}).gradient_checkpointing);
  for (const char* policy : {"full", "selective"}) {
    const TrainingArguments a =
        parse_training_arguments({"--gradient_checkpointing", "--gradient_checkpointing_policy", policy});
    EXPECT_TRUE(a.gradient_checkpointing);
    EXPECT_EQ(a.gradient_checkpointing_policy, policy);
  }
  for (const Argv& argv : {Argv{"--gradient_checkpointing_policy", "selective"},
                           Argv{"--gradient_checkpointing_policy=full"},
                           Argv{"--gradient_checkpointing=false", "--gradient_checkpointing_policy", "selective"}})
    EXPECT_EQ(parse_error(argv), "--gradient_checkpointing_policy needs --gradient_checkpointing")
        << fmt::format("{}", fmt::join(argv, " "));
  EXPECT_EQ(parse_error({"--gradient_checkpointing", "--gradient_checkpointing_policy", "offload"}),
            "--gradient_checkpointing_policy: expected one of full, selective, got 'offload'");
}

TEST(Arguments, ValidateChecksStructsBuiltInCode) {
  TrainingArguments a;
  EXPECT_NO_THROW(validate(a));
  a.adam_beta2 = 1.0;
  EXPECT_THROW(validate(a), Error);
}

TEST(Arguments, HelpThrowsCallForHelp) {
  EXPECT_THROW(parse_training_arguments({"--help"}), CLI::CallForHelp);
}

TEST(Arguments, AttachesToASubcommand) {
  TrainingArguments a;
  CLI::App app{"hone"};
  add_training_arguments(*app.add_subcommand("train"), a);
  app.parse(std::vector<std::string>{"1e-3", "--learning_rate", "train"});  // reversed argv
  EXPECT_EQ(a.learning_rate, 1e-3);
}

TEST(Arguments, SyntheticDataset) {
  const SyntheticSpec s = parse_synthetic_dataset("synthetic:512x128");
  EXPECT_EQ(s.n, 512);
  EXPECT_EQ(s.len, 128);
  EXPECT_EQ(parse_synthetic_dataset("synthetic:1x2").len, 2);
  EXPECT_EQ(parse_synthetic_dataset("synthetic:10000000000x2").n, 10000000000);

  for (const char* bad : {"foo", "", "synthetic:", "synthetic:512", "synthetic:x512",
                          "synthetic:512x", "synthetic:512x512x1", "synthetic:+5x512",
                          "synthetic: 5x512", "synthetic:5x512 ", "synthetic:5X512",
                          "synthetic:5x99999999999", "real:5x512"}) {
    try {
      parse_synthetic_dataset(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("--dataset: expected synthetic:NxL such as synthetic:512x512, got '{}'",
                            bad));
    }
  }
  for (const char* small : {"synthetic:0x512", "synthetic:5x1", "synthetic:-5x512"}) {
    try {
      parse_synthetic_dataset(small);
      ADD_FAILURE() << "accepted '" << small << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("N >= 1 and L >= 2"), std::string::npos) << e.what();
    }
  }
}

// ZeRO's stage: 0, 1 or 2, from the flag or a DeepSpeed file, and the two must agree.
TEST(Arguments, ZeroStageIsCheckedAndTakenFromADeepSpeedFile) {
  EXPECT_EQ(parse_training_arguments({"--zero_stage", "2"}).zero_stage, 2);
  for (const char* bad : {"3", "-1"})
    EXPECT_NE(parse_error({"--zero_stage", bad}).find("--zero_stage"), std::string::npos) << bad;
  test::TempDir tmp;
  const std::string ds = tmp.path + "/ds.json";
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 1}})";
  EXPECT_EQ(parse_training_arguments({"--deepspeed", ds}).zero_stage, 1);
  const std::string e = parse_error({"--deepspeed", ds, "--zero_stage", "2"});
  EXPECT_NE(e.find("--zero_stage 2 and " + ds + "'s zero_optimization.stage 1 disagree"), std::string::npos) << e;
}

}  // namespace
}  // namespace hone
