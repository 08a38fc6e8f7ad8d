#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <string_view>
#include <utility>

#include "hone/error.h"
#include "train/arguments_cli.h"

namespace hone {
namespace {

template <typename T>
CLI::Option* add(CLI::App& app, const std::string& name, T& field, const std::string& help) {
  // argparse (behind HF's parser) keeps the last of repeated flags; CLI11 would throw.
  return app.add_option("--" + name, field, help)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();
}

void add_bool(CLI::App& app, const std::string& name, bool& field, const std::string& help) {
  // HF booleans take an optional value: --flag, --flag=false and --flag False all work.
  app.add_flag("--" + name, field, help)->expected(0, 1);
}

template <typename T>
void require(bool ok, std::string_view flag, std::string_view rule, const T& value) {
  if (!ok) fail("--{} must be {}, got {}", flag, rule, value);
}

template <size_t N>
bool one_of(const std::string& value, const std::array<std::string_view, N>& choices) {
  return std::find(choices.begin(), choices.end(), value) != choices.end();
}

constexpr std::array<std::string_view, 4> kSchedulers = {"linear", "constant",
                                                         "constant_with_warmup", "cosine"};
constexpr std::array<std::string_view, 2> kOptimizers = {"adamw_torch", "adamw_torch_fused"};
constexpr std::array<std::string_view, 3> kDevices = {"auto", "cpu", "cuda"};

}  // namespace

void add_training_arguments(CLI::App& app, TrainingArguments& a) {
  add(app, "model_name_or_path", a.model_name_or_path,
      "Model directory with config.json, or a built-in name");
  add(app, "dataset", a.dataset, "synthetic:NxL (N sequences of L tokens)");
  add(app, "output_dir", a.output_dir, "Where checkpoints and logs are written");
  add(app, "per_device_train_batch_size", a.per_device_train_batch_size, "Batch size per device");
  add(app, "gradient_accumulation_steps", a.gradient_accumulation_steps,
      "Micro-batches accumulated per optimizer step");
  add(app, "num_train_epochs", a.num_train_epochs, "Epochs to train (ignored if --max_steps > 0)");
  add(app, "max_steps", a.max_steps, "Optimizer steps; > 0 overrides --num_train_epochs");
  add(app, "learning_rate", a.learning_rate, "Peak learning rate");
  add(app, "weight_decay", a.weight_decay, "AdamW weight decay");
  add(app, "adam_beta1", a.adam_beta1, "AdamW beta1");
  add(app, "adam_beta2", a.adam_beta2, "AdamW beta2");
  add(app, "adam_epsilon", a.adam_epsilon, "AdamW epsilon");
  add(app, "max_grad_norm", a.max_grad_norm, "Gradient clipping norm; 0 disables clipping");
  add(app, "lr_scheduler_type", a.lr_scheduler_type,
      "linear, constant, constant_with_warmup or cosine");
  add(app, "warmup_ratio", a.warmup_ratio, "Fraction of steps for linear warmup");
  add(app, "warmup_steps", a.warmup_steps, "Warmup steps; > 0 overrides --warmup_ratio");
  add(app, "optim", a.optim, "adamw_torch or adamw_torch_fused");
  // Some CLI11 versions read "-1" into an unsigned field as 2^64 - 1.
  add(app, "seed", a.seed, "Random seed")->check([](const std::string& v) {
    return v.starts_with('-') ? "must be >= 0, got " + v : std::string();
  });
  add(app, "logging_steps", a.logging_steps, "Log every N optimizer steps");
  add_bool(app, "logging_first_step", a.logging_first_step, "Also log the first step");
  add_bool(app, "disable_tqdm", a.disable_tqdm, "No progress bar");
  add_bool(app, "tf32", a.tf32, "TF32 tensor cores for fp32 matrix products (CUDA)");
  add(app, "device", a.device, "auto, cpu or cuda");
  add(app, "threads", a.threads, "CPU threads; 0 = all cores");
}

TrainingArguments parse_training_arguments(const std::vector<std::string>& argv) {
  TrainingArguments a;
  CLI::App app{"hone training arguments"};
  add_training_arguments(app, a);
  // CLI11 consumes a vector from the back.
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::Success&) {
    throw;  // --help: see args.h
  } catch (const CLI::ParseError& e) {
    throw Error(e.what());
  }
  validate(a);
  return a;
}

void validate(const TrainingArguments& a) {
  // Rejecting NaN and infinities first keeps the range checks below simple.
  const std::pair<std::string_view, double> reals[] = {
      {"num_train_epochs", a.num_train_epochs}, {"learning_rate", a.learning_rate},
      {"weight_decay", a.weight_decay},         {"adam_beta1", a.adam_beta1},
      {"adam_beta2", a.adam_beta2},             {"adam_epsilon", a.adam_epsilon},
      {"max_grad_norm", a.max_grad_norm},       {"warmup_ratio", a.warmup_ratio}};
  for (const auto& [flag, value] : reals) require(std::isfinite(value), flag, "finite", value);

  require(a.per_device_train_batch_size >= 1, "per_device_train_batch_size", ">= 1",
          a.per_device_train_batch_size);
  require(a.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", ">= 1",
          a.gradient_accumulation_steps);
  require(a.max_steps > 0 || a.num_train_epochs > 0, "num_train_epochs",
          "> 0 unless --max_steps > 0", a.num_train_epochs);
  require(a.learning_rate >= 0, "learning_rate", ">= 0", a.learning_rate);
  require(a.weight_decay >= 0, "weight_decay", ">= 0", a.weight_decay);
  require(a.adam_beta1 >= 0 && a.adam_beta1 < 1, "adam_beta1", "in [0, 1)", a.adam_beta1);
  require(a.adam_beta2 >= 0 && a.adam_beta2 < 1, "adam_beta2", "in [0, 1)", a.adam_beta2);
  require(a.adam_epsilon >= 0, "adam_epsilon", ">= 0", a.adam_epsilon);
  require(a.max_grad_norm >= 0, "max_grad_norm", ">= 0 (0 disables clipping)", a.max_grad_norm);
  require(a.warmup_ratio >= 0 && a.warmup_ratio <= 1, "warmup_ratio", "in [0, 1]",
          a.warmup_ratio);
  require(a.warmup_steps >= 0, "warmup_steps", ">= 0", a.warmup_steps);
  require(a.logging_steps >= 1, "logging_steps", ">= 1", a.logging_steps);
  require(a.threads >= 0, "threads", ">= 0 (0 = all cores)", a.threads);

  // Other HF scheduler and optimizer names are valid there, so say they are missing here.
  if (!one_of(a.lr_scheduler_type, kSchedulers))
    fail("--lr_scheduler_type: hone does not implement '{}' yet; supported: {}",
         a.lr_scheduler_type, fmt::join(kSchedulers, ", "));
  if (!one_of(a.optim, kOptimizers))
    fail("--optim: hone does not implement '{}' yet; supported: {}", a.optim,
         fmt::join(kOptimizers, ", "));
  if (!one_of(a.device, kDevices))
    fail("--device: expected one of {}, got '{}'", fmt::join(kDevices, ", "), a.device);
  parse_synthetic_dataset(a.dataset);
}

SyntheticSpec parse_synthetic_dataset(const std::string& spec) {
  constexpr std::string_view prefix = "synthetic:";
  const std::string_view s = spec;
  const size_t x = s.find('x', prefix.size());
  SyntheticSpec out{};
  // from_chars rejects spaces, '+' and overflow; `ptr` shows whether all of N and L was read.
  bool ok = s.starts_with(prefix) && x != std::string_view::npos;
  if (ok) {
    const char* end = s.data() + s.size();
    auto n = std::from_chars(s.data() + prefix.size(), s.data() + x, out.n);
    auto len = std::from_chars(s.data() + x + 1, end, out.len);
    ok = n.ec == std::errc{} && n.ptr == s.data() + x && len.ec == std::errc{} && len.ptr == end;
  }
  if (!ok) fail("--dataset: expected synthetic:NxL such as synthetic:512x512, got '{}'", spec);
  if (out.n < 1 || out.len < 2)
    fail("--dataset: synthetic:NxL needs N >= 1 and L >= 2, got '{}'", spec);
  return out;
}

}  // namespace hone
