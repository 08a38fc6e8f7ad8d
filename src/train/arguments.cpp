#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cctype>
#include <cmath>
#include <string_view>
#include <utility>

#include "hone/backend.h"
#include "hone/deepspeed.h"
#include "hone/error.h"
#include "hone/optimizer.h"
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
  app.add_flag("--" + name, field, help)->expected(0, 1)->default_str(field ? "true" : "false");
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
constexpr std::array<std::string_view, 3> kDevices = {"auto", "cpu", "cuda"};
constexpr std::array<std::string_view, 3> kEvalStrategies = {"no", "steps", "epoch"};
constexpr std::array<std::string_view, 4> kSaveStrategies = {"no", "steps", "epoch", "best"};
constexpr std::array<std::string_view, 3> kReporters = {"none", "tensorboard", "all"};
constexpr std::array<std::string_view, 2> kCheckpointingPolicies = {"full", "selective"};
constexpr std::array<std::string_view, 7> kMetrics = {"loss", "accuracy", "f1", "matthews_correlation",
                                                      "mse", "pearson", "spearman"};

}  // namespace

void add_training_arguments(CLI::App& app, TrainingArguments& a) {
  add(app, "model_name_or_path", a.model_name_or_path,
      "Model directory with config.json, or a built-in name");
  add(app, "config_name", a.config_name,
      "Configuration to use instead of the model's: a config.json, a directory with one, or a built-in name");
  add(app, "dataset", a.dataset, "synthetic:NxL (N sequences of L tokens), used without --train_file");
  add(app, "output_dir", a.output_dir, "Where checkpoints and logs are written");
  add_bool(app, "overwrite_output_dir", a.overwrite_output_dir,
           "Replace an earlier run's trainer_log.jsonl in output_dir (else it is kept under a numbered name)");
  add(app, "train_file", a.train_file, "Training examples: JSONL, CSV or TSV");
  add(app, "validation_file", a.validation_file, "Evaluation examples: JSONL, CSV or TSV");
  add(app, "test_file", a.test_file, "Examples to predict (hone predict): JSONL, CSV or TSV");
  add(app, "text_column", a.text_column, "Column of the text");
  add(app, "text_pair_column", a.text_pair_column, "Column of the second text of a pair (none: single texts)");
  add(app, "label_column", a.label_column, "Column of the label (class name, class id or number)");
  add(app, "max_seq_length", a.max_seq_length, "Longest tokenized input; longer ones are truncated");
  add(app, "tokenizer_name", a.tokenizer_name, "Tokenizer directory (default: the model directory)");
  add_bool(app, "ignore_mismatched_sizes", a.ignore_mismatched_sizes,
           "Initialise anew the checkpoint's tensors of another shape (a classifier for other labels)");
  add_bool(app, "group_by_length", a.group_by_length, "Batch examples of similar length together");
  add(app, "dataloader_num_workers", a.dataloader_num_workers,
      "Threads preparing batches ahead of the step (0: in the training thread)");
  add_bool(app, "dataloader_pin_memory", a.dataloader_pin_memory, "Page-locked staging memory on a GPU");
  add_bool(app, "do_eval", a.do_eval, "Evaluate on --validation_file after training");
  add(app, "eval_strategy", a.eval_strategy, "When to evaluate during training: no, steps or epoch");
  add(app, "eval_steps", a.eval_steps, "Evaluate every N steps with --eval_strategy steps (0: logging_steps)");
  add(app, "per_device_eval_batch_size", a.per_device_eval_batch_size, "Batch size for evaluation and prediction");
  add(app, "metric_for_best_model", a.metric_for_best_model,
      "loss, accuracy, f1 or matthews_correlation (mse, pearson, spearman for regression)");
  app.add_option_function<std::string>(
      "--greater_is_better",
      [&a](const std::string& v) {
        std::string l = v;
        for (char& ch : l) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        if (l == "true" || l == "1" || l == "yes") a.greater_is_better = true;
        else if (l == "false" || l == "0" || l == "no") a.greater_is_better = false;
        else throw CLI::ValidationError("--greater_is_better", "expected true or false, got " + v);
      },
      "Whether a larger best-model metric is better (default: false for loss and mse)");
  add_bool(app, "load_best_model_at_end", a.load_best_model_at_end, "Finish with the best checkpoint's weights");
  add(app, "save_strategy", a.save_strategy, "When to save checkpoints: no, steps, epoch or best");
  add(app, "save_steps", a.save_steps, "Save every N steps with --save_strategy steps");
  add(app, "save_total_limit", a.save_total_limit, "Keep at most N checkpoints (the best is kept); 0: all");
  add(app, "resume_from_checkpoint", a.resume_from_checkpoint,
      "Continue from a checkpoint directory, or 'last' for the newest in --output_dir");
  add(app, "report_to", a.report_to, "none, tensorboard or all (a JSONL log is always written)");
  add(app, "logging_dir", a.logging_dir, "TensorBoard directory (default: output_dir/runs/DATE_HOST)");
  add(app, "per_device_train_batch_size", a.per_device_train_batch_size, "Batch size per device");
  add_bool(app, "auto_find_batch_size", a.auto_find_batch_size,
           "Train with the largest batch up to --per_device_train_batch_size that fits the GPU's free memory, "
           "found from the memory plan before the first step");
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
  add(app, "optim", a.optim, "Optimizer: " + fmt::format("{}", fmt::join(optimizer_names(), ", ")));
  add(app, "optim_args", a.optim_args, "Optimizer settings as key=value,key=value (e.g. momentum=0.9 for sgd)");
  // Some CLI11 versions read "-1" into an unsigned field as 2^64 - 1.
  add(app, "seed", a.seed, "Random seed")->check([](const std::string& v) {
    return v.starts_with('-') ? "must be >= 0, got " + v : std::string();
  });
  add(app, "logging_steps", a.logging_steps, "Log every N optimizer steps");
  add_bool(app, "logging_first_step", a.logging_first_step, "Also log the first step");
  add_bool(app, "disable_tqdm", a.disable_tqdm, "No progress bar");
  add_bool(app, "tf32", a.tf32, "TF32 tensor cores for fp32 matrix products (CUDA)");
  add_bool(app, "bf16", a.bf16,
           "bf16 mixed precision: on CUDA fp32 master weights, bf16 products and activations; on the CPU bf16 "
           "products (oneDNN, AMX), fp32 otherwise");
  add_bool(app, "fp16", a.fp16, "fp16 mixed precision (CUDA) with dynamic loss scaling");
  add_bool(app, "gradient_checkpointing", a.gradient_checkpointing,
           "Keep only part of each encoder layer's activations and recompute the rest during backward: the same "
           "gradients in less memory, for up to one more forward pass");
  add(app, "gradient_checkpointing_policy", a.gradient_checkpointing_policy,
      "What --gradient_checkpointing keeps of each layer: full (the default; its input alone, as Trainer) or "
      "selective (the matrix products' outputs; only attention and LayerNorm outputs are recomputed)");
  add(app, "device", a.device, "auto, cpu or cuda");
  add(app, "deepspeed", a.deepspeed,
      "DeepSpeed configuration file (ZeRO stage 1/2, offload_optimizer to the CPU, optimizer and scheduler blocks)");
  add_bool(app, "offload_optimizer", a.offload_optimizer,
           "ZeRO-Offload: master weights, gradients for the update and optimizer state in host memory, the update "
           "on the CPU");
  add(app, "zero_stage", a.zero_stage,
      "ZeRO over data-parallel ranks: 1 shards the optimizer state, 2 the gradients too (what a DeepSpeed file's "
      "zero_optimization.stage sets)");
  add_bool(app, "cuda_graphs", a.cuda_graphs,
           "Replay each repeated training step as a CUDA graph, without launching its kernels one by one (CUDA)");
  add(app, "threads", a.threads, "CPU threads; 0 = all cores");
}

nlohmann::ordered_json to_json(const TrainingArguments& a) {
  // Options bound to a copy capture its values as their defaults: one source of names.
  TrainingArguments copy = a;
  CLI::App app;
  add_training_arguments(app, copy);
  nlohmann::ordered_json j;
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_lnames().empty() || o->get_lnames().front() == "help") continue;
    const std::string& name = o->get_lnames().front();
    const std::string v = o->get_default_str();
    // Numbers and booleans as JSON values, the rest as strings.
    nlohmann::json parsed = nlohmann::json::parse(v, nullptr, false);
    j[name] = !v.empty() && !parsed.is_discarded() && (parsed.is_number() || parsed.is_boolean()) ? parsed
                                                                                                   : nlohmann::json(v);
  }
  if (a.greater_is_better) j["greater_is_better"] = *a.greater_is_better;
  return j;
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
  apply_deepspeed(a);
  return a;
}

void apply_deepspeed(TrainingArguments& a) {
  if (a.deepspeed.empty()) return;
  auto ds = std::make_shared<DeepSpeedConfig>(load_deepspeed_config(a.deepspeed, a));
  a.offload_optimizer = a.offload_optimizer || ds->offload_optimizer;
  if (a.zero_stage != 0 && a.zero_stage != ds->zero_stage)
    fail("--zero_stage {} and {}'s zero_optimization.stage {} disagree", a.zero_stage, a.deepspeed, ds->zero_stage);
  a.zero_stage = ds->zero_stage;
  a.deepspeed_config = std::move(ds);
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
  require(a.max_seq_length >= 2, "max_seq_length", ">= 2", a.max_seq_length);
  require(a.dataloader_num_workers >= 0, "dataloader_num_workers", ">= 0", a.dataloader_num_workers);
  require(a.per_device_eval_batch_size >= 1, "per_device_eval_batch_size", ">= 1", a.per_device_eval_batch_size);
  require(a.eval_steps >= 0, "eval_steps", ">= 0 (0: --logging_steps)", a.eval_steps);
  require(a.save_steps >= 1, "save_steps", ">= 1", a.save_steps);
  require(a.save_total_limit >= 0, "save_total_limit", ">= 0 (0: keep all)", a.save_total_limit);
  require(a.zero_stage >= 0 && a.zero_stage <= 2, "zero_stage",
          "0, 1 or 2 (stage 3, parameters sharded, is not implemented)", a.zero_stage);
  if (!one_of(a.eval_strategy, kEvalStrategies))
    fail("--eval_strategy: expected one of {}, got '{}'", fmt::join(kEvalStrategies, ", "), a.eval_strategy);
  if (!one_of(a.save_strategy, kSaveStrategies))
    fail("--save_strategy: expected one of {}, got '{}'", fmt::join(kSaveStrategies, ", "), a.save_strategy);
  if (!one_of(a.report_to, kReporters))
    fail("--report_to: hone supports {}, got '{}'", fmt::join(kReporters, ", "), a.report_to);
  const std::string metric = best_metric_key(a).substr(5);
  if (!one_of(metric, kMetrics))
    fail("--metric_for_best_model: expected one of {}, got '{}'", fmt::join(kMetrics, ", "), a.metric_for_best_model);
  const bool evaluates = a.eval_strategy != "no";
  if ((evaluates || a.do_eval || a.save_strategy == "best" || a.load_best_model_at_end) && a.validation_file.empty())
    fail("evaluation (--do_eval, --eval_strategy {}, --save_strategy {}, --load_best_model_at_end) needs a "
         "--validation_file", a.eval_strategy, a.save_strategy);
  if (a.load_best_model_at_end) {
    // As in Trainer: the best model must be among the saved checkpoints.
    if (!evaluates) fail("--load_best_model_at_end needs --eval_strategy steps or epoch");
    if (a.save_strategy != "best" && a.save_strategy != a.eval_strategy)
      fail("--load_best_model_at_end needs --save_strategy equal to --eval_strategy ({}), got {}", a.eval_strategy,
           a.save_strategy);
    if (a.save_strategy == "steps" && a.save_steps % (a.eval_steps > 0 ? a.eval_steps : a.logging_steps) != 0)
      fail("--load_best_model_at_end needs --save_steps to be a multiple of the evaluation steps");
  }
  if (a.save_strategy == "best" && !evaluates) fail("--save_strategy best needs --eval_strategy steps or epoch");

  // Other HF scheduler names are valid there, so say they are missing here.
  if (!one_of(a.lr_scheduler_type, kSchedulers))
    fail("--lr_scheduler_type: hone does not implement '{}' yet; supported: {}",
         a.lr_scheduler_type, fmt::join(kSchedulers, ", "));
  validate_optimizer(a);
  if (!one_of(a.device, kDevices))
    fail("--device: expected one of {}, got '{}'", fmt::join(kDevices, ", "), a.device);
  if (a.train_file.empty()) parse_synthetic_dataset(a.dataset);
  if (a.bf16 && a.fp16) fail("--bf16 and --fp16: choose one mixed precision");
  if (!a.gradient_checkpointing_policy.empty()) {
    if (!a.gradient_checkpointing) fail("--gradient_checkpointing_policy needs --gradient_checkpointing");
    if (!one_of(a.gradient_checkpointing_policy, kCheckpointingPolicies))
      fail("--gradient_checkpointing_policy: expected one of {}, got '{}'", fmt::join(kCheckpointingPolicies, ", "),
           a.gradient_checkpointing_policy);
  }
}

DType compute_dtype(const TrainingArguments& a) { return a.bf16 ? DType::BF16 : a.fp16 ? DType::F16 : DType::F32; }

DType compute_dtype(const TrainingArguments& a, const Backend& be) {
  return be.bf16_products() ? DType::F32 : compute_dtype(a);
}

std::string best_metric_key(const TrainingArguments& a) {
  std::string m = a.metric_for_best_model.empty() ? "loss" : a.metric_for_best_model;
  return m.starts_with("eval_") ? m : "eval_" + m;
}

bool best_metric_greater(const TrainingArguments& a) {
  if (a.greater_is_better) return *a.greater_is_better;
  const std::string m = best_metric_key(a);
  return m != "eval_loss" && m != "eval_mse";
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
