#pragma once
// The TrainingArguments flags as CLI11 options, shared by parse_training_arguments and
// the CLI's `train` and `estimate` subcommands so both accept exactly the same flags.
#include "hone/args.h"

namespace CLI {
class App;
}

namespace hone {

// Binds every field of `a` as --field_name (Hugging Face spelling); `a` must outlive the
// parse. Values are not range-checked here: call validate(a) after parsing.
void add_training_arguments(CLI::App& app, TrainingArguments& a);

}  // namespace hone
