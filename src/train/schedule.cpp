#include "hone/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "hone/deepspeed.h"
#include "hone/error.h"

namespace hone {
namespace {

// The lr_lambda functions of transformers/optimization.py, with the same operation order
// so the doubles come out identical to PyTorch's LambdaLR (base_lr * lambda(step)).
double schedule_factor(const std::string& type, int64_t step, int64_t warmup, int64_t total) {
  if (type == "constant") return 1.0;  // get_constant_schedule ignores warmup
  if (type != "linear" && type != "constant_with_warmup" && type != "cosine")
    fail("--lr_scheduler_type: hone does not implement '{}' yet", type);
  if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
  if (type == "constant_with_warmup") return 1.0;
  const double decay_steps = double(std::max<int64_t>(1, total - warmup));
  if (type == "linear") return std::max(0.0, double(total - step) / decay_steps);
  constexpr double num_cycles = 0.5;  // get_cosine_schedule_with_warmup's default
  const double progress = double(step - warmup) / decay_steps;
  return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress)));
}

}  // namespace

int64_t resolve_warmup_steps(const TrainingArguments& a, int64_t total_steps) {
  if (a.warmup_steps > 0) return a.warmup_steps;
  return int64_t(std::ceil(double(total_steps) * a.warmup_ratio));
}

double learning_rate_at(const TrainingArguments& a, int64_t step, int64_t total_steps) {
  if (a.deepspeed_config && a.deepspeed_config->scheduler)
    return deepspeed_learning_rate(*a.deepspeed_config->scheduler,
                                   deepspeed_schedule_steps(*a.deepspeed_config, a, total_steps), a.learning_rate,
                                   step + 1);
  const int64_t warmup = resolve_warmup_steps(a, total_steps);
  return a.learning_rate * schedule_factor(a.lr_scheduler_type, step, warmup, total_steps);
}

}  // namespace hone
