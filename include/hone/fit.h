#pragma once
// Fitting a run into memory, from its plan alone: the largest batch that fits a budget
// (--auto_find_batch_size), the methods that would make a run fit, and the configurations
// that fit a card, best first (`hone estimate --memory_budget`). Nothing is allocated:
// each candidate is planned by the same dry run that plans a real run.
#include <cstdint>
#include <string>
#include <vector>

#include "hone/args.h"
#include "hone/backend.h"
#include "hone/config.h"
#include "hone/trainer.h"

namespace hone {

// Bytes a run may plan: `free` less a reserve for what the plan does not hold (the
// allocator's rounding of each arena and the libraries' lazily created state).
uint64_t plannable_bytes(uint64_t free);

// "16GB", "16GiB", "15000MB", "512MiB" or a number of bytes. Decimal units are powers of
// 1000, binary ones of 1024 (as nvidia-smi's MiB). Throws naming the text.
uint64_t parse_memory_size(const std::string& text);

// The largest per-device batch in [1, a.per_device_train_batch_size] whose plan fits in
// `budget` bytes, or 0 if not even batch 1 fits. `bytes` receives its plan's size (or
// batch 1's when none fits).
int largest_fitting_batch(const TrainingArguments& a, const ModelConfig& c, int seq, Backend& be, RunPhases phases,
                          uint64_t budget, uint64_t* bytes = nullptr);

// One way to run: the arguments, the plan's bytes, and the predicted time per sample
// relative to the fastest candidate that fits (1 = fastest).
struct FitCandidate {
  TrainingArguments args;
  uint64_t plan_bytes = 0;
  double seconds_per_sample = 0;  // the speed model's, comparable between candidates only
  double relative_time = 1;
  std::string methods() const;  // "bf16, checkpointing full, adafactor, batch 8 x 2"
};

// Configurations that reach the same samples per update as `a` (batch x accumulation)
// with every combination of checkpointing policy, precision (bf16 only where
// `mixed_precision` is true) and memory-saving optimizer, each at the largest batch
// that fits; those that fit `budget`, fastest first.
std::vector<FitCandidate> fitting_configurations(const TrainingArguments& a, const ModelConfig& c, int seq,
                                                 Backend& be, RunPhases phases, uint64_t budget,
                                                 bool mixed_precision);

// For a run whose plan does not fit: the fitting configurations nearest to it, as a
// sentence for an error message ("--gradient_checkpointing (7.1 GB), ...").
std::string methods_that_fit(const TrainingArguments& a, const ModelConfig& c, int seq, Backend& be, RunPhases phases,
                             uint64_t budget, bool mixed_precision);

}  // namespace hone
