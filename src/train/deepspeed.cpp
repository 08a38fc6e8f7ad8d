#include "hone/deepspeed.h"
#include "hone/distributed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>

#include "hone/error.h"
#include "hone/schedule.h"

namespace hone {
namespace {

using nlohmann::json;

// The fields each block may hold. Values of kNoEffect fields are read (so their types are
// checked) and change nothing on one GPU.
const std::set<std::string> kTopLevel = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer",        "scheduler",                      "fp16",                        "bf16",
    "zero_optimization", "steps_per_print",               "wall_clock_breakdown",        "zero_allow_untested_optimizer",
    "prescale_gradients", "gradient_predivide_factor"};
const std::set<std::string> kZero = {"stage",
                                     "offload_optimizer",
                                     "overlap_comm",
                                     "contiguous_gradients",
                                     "reduce_bucket_size",
                                     "allgather_bucket_size",
                                     "allgather_partitions",
                                     "reduce_scatter",
                                     "round_robin_gradients"};
const std::set<std::string> kNoEffect = {"steps_per_print",
                                         "wall_clock_breakdown",
                                         "zero_allow_untested_optimizer",
                                         "prescale_gradients",
                                         "gradient_predivide_factor",
                                         "zero_optimization.contiguous_gradients",
                                         "zero_optimization.reduce_bucket_size",
                                         "zero_optimization.allgather_bucket_size",
                                         "zero_optimization.allgather_partitions",
                                         "zero_optimization.reduce_scatter",
                                         "zero_optimization.round_robin_gradients"};

class Reader {
 public:
  Reader(std::string path, const json& root) : path_(std::move(path)), root_(root) {}

  [[noreturn]] void error(const std::string& key, const std::string& what) const {
    fail("{}: {}: {}", path_, key, what);
  }

  // Every key of the object at `prefix` is one of `known`; else an error naming the others.
  void only(const json& obj, const std::string& prefix, const std::set<std::string>& known) const {
    if (!obj.is_object()) error(prefix.empty() ? "(top level)" : prefix, "expected a JSON object");
    for (const auto& [key, value] : obj.items()) {
      if (known.count(key)) continue;
      const std::string full = prefix.empty() ? key : prefix + "." + key;
      error(full, fmt::format("hone does not implement this DeepSpeed field (it takes {})", fmt::join(known, ", ")));
    }
  }

  const json* find(const std::string& dotted) const {
    const json* node = &root_;
    std::stringstream parts(dotted);
    for (std::string part; std::getline(parts, part, '.');) {
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
    }
    return node;
  }
  static bool is_auto(const json* v) { return v && v->is_string() && v->get<std::string>() == "auto"; }

  // A number field that "auto" fills with `flag_value`, and that must otherwise equal it.
  void match(const std::string& key, double flag_value, const std::string& flag) {
    const json* v = find(key);
    if (!v || is_auto(v)) return;
    if (!v->is_number()) error(key, fmt::format("expected a number or \"auto\", got {}", v->dump()));
    if (v->get<double>() != flag_value) mismatch(key, v->dump(), flag, flag_value);
  }
  template <typename T>
  void mismatch(const std::string& key, const std::string& value, const std::string& flag, const T& flag_value) {
    mismatches_.push_back(fmt::format("- ds {}={} vs hone {}={}", key, value, flag, flag_value));
  }
  void match_bool(const std::string& key, bool flag_value, const std::string& flag) {
    const json* v = find(key);
    if (!v || is_auto(v)) return;
    if (!v->is_boolean()) error(key, fmt::format("expected true, false or \"auto\", got {}", v->dump()));
    if (v->get<bool>() != flag_value) mismatch(key, v->dump(), flag, flag_value);
  }

  double number(const std::string& key, double fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) error(key, fmt::format("expected a number, got {}", v->dump()));
    return v->get<double>();
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number_integer()) error(key, fmt::format("expected an integer, got {}", v->dump()));
    return v->get<int64_t>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) error(key, fmt::format("expected true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) error(key, fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }

  void finish() const {
    if (mismatches_.empty()) return;
    fail("{}: DeepSpeed config values that disagree with the flags:\n{}\nSet them to \"auto\" (or pass the flags) "
         "so that they agree.",
         path_, fmt::join(mismatches_, "\n"));
  }

 private:
  std::string path_;
  const json& root_;
  std::vector<std::string> mismatches_;
};

json parse_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("--deepspeed {}: cannot open the file", path);
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    fail("--deepspeed {}: not valid JSON: {}", path, e.what());
  }
}

DeepSpeedScheduler read_scheduler(Reader& r, const TrainingArguments& a) {
  DeepSpeedScheduler s;
  s.type = r.string("scheduler.type", "");
  if (s.type != "WarmupLR" && s.type != "WarmupDecayLR" && s.type != "WarmupCosineLR")
    r.error("scheduler.type", fmt::format("'{}' is not one hone implements (WarmupLR, WarmupDecayLR, WarmupCosineLR)",
                                          s.type));
  const json* params = r.find("scheduler.params");
  const std::set<std::string> known =
      s.type == "WarmupCosineLR"
          ? std::set<std::string>{"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                                  "warmup_type"}
          : s.type == "WarmupDecayLR"
                ? std::set<std::string>{"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                        "warmup_type"}
                : std::set<std::string>{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  if (params) r.only(*params, "scheduler.params", known);
  // "auto" values as HfTrainerDeepSpeedConfig fills them.
  if (!Reader::is_auto(r.find("scheduler.params.warmup_min_lr")))
    s.warmup_min_lr = r.number("scheduler.params.warmup_min_lr", 0.0);
  r.match("scheduler.params.warmup_max_lr", a.learning_rate, "learning_rate");
  s.warmup_max_lr = Reader::is_auto(r.find("scheduler.params.warmup_max_lr"))
                        ? a.learning_rate
                        : r.number("scheduler.params.warmup_max_lr", s.type == "WarmupLR" ? a.learning_rate : 0.001);
  s.warmup_min_ratio = r.number("scheduler.params.warmup_min_ratio", 0.0);
  s.cos_min_ratio = r.number("scheduler.params.cos_min_ratio", 1e-4);
  s.warmup_type = r.string("scheduler.params.warmup_type", "log");
  if (s.warmup_type != "log" && s.warmup_type != "linear")
    r.error("scheduler.params.warmup_type", fmt::format("'{}': expected log or linear", s.warmup_type));
  for (const char* key : {"warmup_num_steps", "total_num_steps"}) {
    const std::string full = std::string("scheduler.params.") + key;
    std::optional<int64_t>& field = std::string(key) == "total_num_steps" ? s.total_num_steps : s.warmup_num_steps;
    if (Reader::is_auto(r.find(full))) {
      field.reset();
    } else if (r.find(full)) {
      field = r.integer(full, 0);
      if (*field < 0) r.error(full, "must be >= 0");
      (std::string(key) == "total_num_steps" ? s.total_in_file : s.warmup_in_file) = true;
    }
  }
  if (s.type != "WarmupLR" && !r.find("scheduler.params.total_num_steps"))
    r.error("scheduler.params.total_num_steps", fmt::format("{} needs it (a number or \"auto\")", s.type));
  return s;
}

}  // namespace

DeepSpeedConfig load_deepspeed_config(const std::string& path, const TrainingArguments& a) {
  const json root = parse_file(path);
  Reader r(path, root);
  r.only(root, "", kTopLevel);
  DeepSpeedConfig c;
  c.path = path;
  for (const std::string& key : kNoEffect)
    if (r.find(key)) c.no_effect.push_back(key);

  // Batch sizes: train_batch_size = micro batch x accumulation x world size (the
  // launcher's, as DeepSpeed reads it).
  const int world = process_group_from_env().world_size;
  r.match("train_micro_batch_size_per_gpu", a.per_device_train_batch_size, "per_device_train_batch_size");
  r.match("gradient_accumulation_steps", a.gradient_accumulation_steps, "gradient_accumulation_steps");
  r.match("train_batch_size", double(a.per_device_train_batch_size) * a.gradient_accumulation_steps * world,
          world > 1 ? "train_batch_size (per_device_train_batch_size x gradient_accumulation_steps x world size)"
                    : "train_batch_size (per_device_train_batch_size x gradient_accumulation_steps)");
  r.match("gradient_clipping", a.max_grad_norm, "max_grad_norm");

  // Precision.
  for (const char* block : {"bf16", "fp16"})
    if (const json* b = r.find(block)) r.only(*b, block, std::string(block) == "bf16"
                                                              ? std::set<std::string>{"enabled"}
                                                              : std::set<std::string>{"enabled", "loss_scale",
                                                                                      "initial_scale_power",
                                                                                      "loss_scale_window", "hysteresis",
                                                                                      "min_loss_scale"});
  r.match_bool("bf16.enabled", a.bf16, "bf16");
  r.match_bool("fp16.enabled", a.fp16, "fp16");
  if (a.fp16 && r.find("fp16"))
    for (const char* key : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"})
      if (r.find(std::string("fp16.") + key))
        r.error(std::string("fp16.") + key,
                "hone scales fp16 losses as torch.amp.GradScaler does (Trainer's fp16 without DeepSpeed); "
                "DeepSpeed's loss scaler settings are not implemented");

  // ZeRO.
  if (const json* z = r.find("zero_optimization")) {
    r.only(*z, "zero_optimization", kZero);
    c.zero_stage = int(r.integer("zero_optimization.stage", 0));
    if (c.zero_stage == 3)
      r.error("zero_optimization.stage", "stage 3 (parameters sharded over GPUs) is not implemented; use 1 or 2");
    if (c.zero_stage < 0 || c.zero_stage > 3) r.error("zero_optimization.stage", "expected 0, 1, 2 or 3");
    c.overlap_comm = r.boolean("zero_optimization.overlap_comm", false);
    if (const json* o = r.find("zero_optimization.offload_optimizer")) {
      r.only(*o, "zero_optimization.offload_optimizer", {"device", "pin_memory"});
      const std::string device = r.string("zero_optimization.offload_optimizer.device", "none");
      if (device == "nvme")
        r.error("zero_optimization.offload_optimizer.device", "offloading to NVMe is not implemented (cpu or none)");
      if (device != "cpu" && device != "none")
        r.error("zero_optimization.offload_optimizer.device", fmt::format("'{}': expected cpu or none", device));
      c.offload_optimizer = device == "cpu";
      c.pin_memory = r.boolean("zero_optimization.offload_optimizer.pin_memory", false);
      if (c.offload_optimizer && c.zero_stage == 0)
        r.error("zero_optimization.offload_optimizer", "offloading the optimizer needs stage 1 or 2");
    }
  }

  // The optimizer block: DeepSpeed's own AdamW, its hyper-parameters the flags'.
  if (r.find("optimizer")) {
    r.only(*r.find("optimizer"), "optimizer", {"type", "params"});
    c.optimizer_type = r.string("optimizer.type", "");
    if (c.optimizer_type != "AdamW" && c.optimizer_type != "Adam")
      r.error("optimizer.type", fmt::format("'{}' is not one hone implements (AdamW, Adam)", c.optimizer_type));
    if (const json* p = r.find("optimizer.params"))
      r.only(*p, "optimizer.params", {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"});
    if (!r.boolean("optimizer.params.adam_w_mode", true))
      r.error("optimizer.params.adam_w_mode", "Adam with L2 weight decay is not implemented; hone's is AdamW's");
    if (a.optim != "adamw_torch")
      r.error("optimizer", fmt::format("--optim {} and an optimizer block: only one optimizer can be configured",
                                       a.optim));
    r.match("optimizer.params.lr", a.learning_rate, "learning_rate");
    r.match("optimizer.params.eps", a.adam_epsilon, "adam_epsilon");
    r.match("optimizer.params.weight_decay", a.weight_decay, "weight_decay");
    if (const json* betas = r.find("optimizer.params.betas"); betas && !Reader::is_auto(betas)) {
      if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() || !(*betas)[1].is_number())
        r.error("optimizer.params.betas", fmt::format("expected [beta1, beta2] or \"auto\", got {}", betas->dump()));
      for (int i : {0, 1})
        if (const double beta = (*betas)[size_t(i)].get<double>(); beta != (i ? a.adam_beta2 : a.adam_beta1))
          r.mismatch(fmt::format("optimizer.params.betas[{}]", i), (*betas)[size_t(i)].dump(),
                     i ? "adam_beta2" : "adam_beta1", i ? a.adam_beta2 : a.adam_beta1);
    }
  }
  if (r.find("scheduler")) {
    r.only(*r.find("scheduler"), "scheduler", {"type", "params"});
    c.scheduler = read_scheduler(r, a);
  }
  r.finish();
  return c;
}

DeepSpeedSteps deepspeed_schedule_steps(const DeepSpeedConfig& c, const TrainingArguments& a, int64_t total_updates) {
  HONE_CHECK(c.scheduler.has_value(), "schedule steps of a DeepSpeed config without a scheduler");
  const DeepSpeedScheduler& s = *c.scheduler;
  std::vector<std::string> mismatches;
  auto resolve = [&](const std::optional<int64_t>& field, bool in_file, int64_t value, const char* key,
                     const char* what) {
    if (!field) return value;
    if (in_file && *field != value)
      mismatches.push_back(fmt::format("- ds scheduler.params.{}={} vs hone {}={}", key, *field, what, value));
    return *field;
  };
  const DeepSpeedSteps steps{
      resolve(s.warmup_num_steps, s.warmup_in_file, resolve_warmup_steps(a, total_updates), "warmup_num_steps",
              "warmup steps (--warmup_steps, or --warmup_ratio of the updates)"),
      s.type == "WarmupLR" ? total_updates
                           : resolve(s.total_num_steps, s.total_in_file, total_updates, "total_num_steps",
                                     "updates of this run")};
  if (!mismatches.empty())
    fail("{}: DeepSpeed config values that disagree with the run:\n{}\nSet them to \"auto\" so that they agree.",
         c.path, fmt::join(mismatches, "\n"));
  return steps;
}

double deepspeed_learning_rate(const DeepSpeedScheduler& s, const DeepSpeedSteps& steps, double lr, int64_t update) {
  // The scheduler's iteration when update `update` runs: -1 (its initial value) for the first.
  const int64_t it = update - 2;
  const int64_t warmup = std::max<int64_t>(2, steps.warmup);
  const int64_t total = steps.total;
  auto warm = [&] {
    return s.warmup_type == "log" ? std::log(double(it + 1)) / std::log(double(warmup)) : double(it) / double(warmup);
  };
  if (s.type == "WarmupCosineLR") {
    if (it < 0) return 0.0;
    if (it < warmup) return lr * (s.warmup_min_ratio + warm() * (1.0 - s.warmup_min_ratio));
    const double cosine = (1 + std::cos(std::numbers::pi * double(it - warmup + 1) / double(total - warmup))) / 2;
    return lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
  }
  if (it < 0) return s.warmup_min_lr;
  double gamma = 1.0;
  if (it < warmup)
    gamma = warm();
  else if (s.type == "WarmupDecayLR")
    gamma = std::max(0.0, double(total - it) / double(std::max<int64_t>(1, total - warmup)));
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

}  // namespace hone
