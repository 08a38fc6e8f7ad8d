#pragma once
// DeepSpeed's JSON configuration as Trainer takes it (--deepspeed ds_config.json). As
// HfTrainerDeepSpeedConfig does, an "auto" value is filled from the flags and any other
// value must agree with the flag it mirrors: every disagreement is listed in one error.
// A field hone does not implement is an error that names it; fields that change nothing
// on one GPU (bucket sizes, overlap_comm, ...) are accepted and listed as such.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hone/args.h"

namespace hone {

// DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py) that hone implements.
struct DeepSpeedScheduler {
  std::string type;  // WarmupLR | WarmupDecayLR | WarmupCosineLR
  double warmup_min_lr = 0, warmup_max_lr = 0.001;
  // WarmupCosineLR: ratios of the optimizer's learning rate instead of the two above.
  double warmup_min_ratio = 0, cos_min_ratio = 1e-4;
  // Empty while "auto": Trainer's warmup and the run's number of updates, known once the
  // data is (check_deepspeed_schedule then checks explicit values against them).
  std::optional<int64_t> warmup_num_steps = 1000, total_num_steps;
  bool warmup_in_file = false, total_in_file = false;  // explicit values, which must agree
  std::string warmup_type = "log";  // log | linear
};

struct DeepSpeedConfig {
  std::string path;
  int zero_stage = 0;
  bool offload_optimizer = false;  // zero_optimization.offload_optimizer.device == "cpu"
  bool pin_memory = false;         // offload_optimizer.pin_memory
  bool overlap_comm = false;
  // The "optimizer" block: DeepSpeed builds its own AdamW over all parameters in one group
  // (weight decay on biases and LayerNorm parameters too, unlike Trainer's). Empty: the
  // optimizer --optim names.
  std::string optimizer_type;
  std::optional<DeepSpeedScheduler> scheduler;  // empty: --lr_scheduler_type
  std::vector<std::string> no_effect;           // fields accepted that change nothing on one GPU
};

// Reads the configuration at `path`, fills its "auto" values from `a` and checks the other
// values against `a` (so the optimizer block's hyper-parameters are the flags'). Throws
// hone::Error naming the file and the fields.
DeepSpeedConfig load_deepspeed_config(const std::string& path, const TrainingArguments& a);

// The scheduler's step counts for a run of total_updates updates ("auto": Trainer's
// warmup, the run's updates); an explicit value that disagrees is an error, as Trainer
// makes it when training starts.
struct DeepSpeedSteps {
  int64_t warmup, total;
};
DeepSpeedSteps deepspeed_schedule_steps(const DeepSpeedConfig& c, const TrainingArguments& a, int64_t total_updates);

// The learning rate of update `update` (1-based) as DeepSpeed's engine steps its scheduler:
// once after each applied update, so update 1 runs at the scheduler's initial value.
// `lr` is the optimizer's (--learning_rate).
double deepspeed_learning_rate(const DeepSpeedScheduler& s, const DeepSpeedSteps& steps, double lr, int64_t update);

}  // namespace hone
