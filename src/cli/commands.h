#pragma once
// The subcommands of the hone executable.
#include <string>

#include "hone/args.h"

namespace hone::cli {

int train_command(const TrainingArguments& a);
int predict_command(const TrainingArguments& a);
int estimate_command(const TrainingArguments& a, bool list_buffers);

}  // namespace hone::cli
