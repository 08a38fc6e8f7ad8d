#pragma once
// The subcommands of the hone executable.
#include <string>

#include "hone/args.h"

namespace hone::cli {

int train_command(const TrainingArguments& a);
int predict_command(const TrainingArguments& a);
// memory_budget: empty, a size ("16GB") or "gpu" (see `hone estimate --help`); world_size:
// the data-parallel ranks whose per-rank plans to print.
int estimate_command(const TrainingArguments& a, bool list_buffers, const std::string& memory_budget,
                     int world_size = 1);

}  // namespace hone::cli
