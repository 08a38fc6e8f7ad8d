#pragma once
#include <cstdint>

#include "hone/args.h"

namespace hone {

// Warmup steps as Trainer resolves them: warmup_steps if > 0, else ceil(warmup_ratio * total).
int64_t resolve_warmup_steps(const TrainingArguments& a, int64_t total_steps);

// Learning rate for optimizer step `step` (0-based) of `total_steps`, as the
// transformers schedulers (get_scheduler(lr_scheduler_type)) give it: linear,
// constant, constant_with_warmup, cosine; or as the scheduler block of a --deepspeed file
// (hone/deepspeed.h) gives it.
double learning_rate_at(const TrainingArguments& a, int64_t step, int64_t total_steps);

}  // namespace hone
