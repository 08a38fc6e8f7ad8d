#pragma once
// Checkpoints as Trainer lays them out: output_dir/checkpoint-N with the model in
// Hugging Face format (config.json, model.safetensors, tokenizer files), the optimizer
// moments, the scheduler and RNG positions, trainer_state.json and the arguments.
// A checkpoint is written into a temporary sibling directory, every file fsynced, and
// renamed into place in one step: a run killed while saving leaves the previous
// checkpoints as they were and no partial checkpoint-N.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hone/trainer.h"

namespace hone {

std::string checkpoint_path(const std::string& output_dir, int64_t step);

void save_checkpoint(const std::string& dir, TrainingRun& run, const ModelFiles& files, const TrainerState& state,
                     const TrainingArguments& a, const StepCounts& sc);

// ZeRO over several ranks: every rank but 0 calls this first (then all wait at a barrier),
// writing its share of the optimizer state beside dir for rank 0's save_checkpoint, which
// joins the shares into the one optimizer file a single process would write.
void save_optimizer_share(const std::string& dir, TrainingRun& run);

// Restores the weights, optimizer moments and trainer state of `dir` into `run` (under
// ZeRO, each rank its share of the optimizer state, whatever the saving run's ranks). A
// checkpoint of a different model, or one with a missing or malformed file, is an error
// naming the file.
TrainerState load_checkpoint(const std::string& dir, TrainingRun& run);

// The complete checkpoints in output_dir, oldest first, as (step, path).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir);

// --resume_from_checkpoint: a directory, or "last" for the newest one in output_dir.
std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir);

// What an interrupted save leaves in a directory: hone's temporaries `.<name>.tmp.<pid>`
// (a checkpoint or file being written) and `.<name>.old.<pid>` (a checkpoint being
// replaced) whose process is gone. Removes them (never a live process's), except an old
// checkpoint whose replacement never arrived: that is renamed back to <name>. Returns
// what it did, each entry a line for the user.
struct StaleTemporary {
  std::string path;
  uint64_t bytes;           // removed
  std::string restored_as;  // or renamed back to this
  std::string describe() const;
};
std::vector<StaleTemporary> remove_stale_temporaries(const std::string& dir);

// --save_total_limit: removes the oldest checkpoints beyond `limit`, never `keep` (the
// best one). Returns the removed paths.
std::vector<std::string> rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep);

}  // namespace hone
