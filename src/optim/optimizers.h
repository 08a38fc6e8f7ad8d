#pragma once
// The optimizers of the registry (registry.cpp) and what their factories share.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hone/optimizer.h"

namespace hone::optim {

// Reads --optim_args values by key, remembering which were read, so that finish() can
// reject the keys no optimizer setting took.
class ArgsReader {
 public:
  ArgsReader(std::string_view optim, const OptimArgs& args) : optim_(optim), args_(args) {}
  double number(const std::string& key, double fallback);
  bool flag(const std::string& key, bool fallback);
  // Throws for keys that were never read, naming those this optimizer takes.
  void finish() const;

 private:
  std::string_view optim_;
  const OptimArgs& args_;
  std::vector<std::string> read_;
};

// Each factory reads its settings from the arguments and --optim_args.
using Factory = std::unique_ptr<Optimizer> (*)(std::string_view name, const TrainingArguments& a, ArgsReader& args);

std::unique_ptr<Optimizer> make_adamw(std::string_view name, const TrainingArguments& a, ArgsReader& args);
std::unique_ptr<Optimizer> make_sgd(std::string_view name, const TrainingArguments& a, ArgsReader& args);
std::unique_ptr<Optimizer> make_adagrad(std::string_view name, const TrainingArguments& a, ArgsReader& args);
std::unique_ptr<Optimizer> make_adafactor(std::string_view name, const TrainingArguments& a, ArgsReader& args);
std::unique_ptr<Optimizer> make_lion(std::string_view name, const TrainingArguments& a, ArgsReader& args);
std::unique_ptr<Optimizer> make_adamw_8bit(std::string_view name, const TrainingArguments& a, ArgsReader& args);
std::unique_ptr<Optimizer> make_lion_8bit(std::string_view name, const TrainingArguments& a, ArgsReader& args);

}  // namespace hone::optim
