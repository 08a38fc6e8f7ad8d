#pragma once
// Training arguments with Hugging Face TrainingArguments' names and defaults.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hone/dtype.h"

namespace hone {

struct DeepSpeedConfig;
class Backend;

struct TrainingArguments {
  // model and data
  std::string model_name_or_path = "bert-tiny";  // a directory with config.json, or a built-in name
  std::string config_name;  // a config.json, a directory with one, or a built-in name; default: the model's
  std::string dataset = "synthetic:512x512";     // synthetic:NxL, used when there is no --train_file
  std::string output_dir = "trainer_output";     // transformers 5 default
  // A new run in an output_dir with an earlier run's trainer_log.jsonl replaces it (without
  // this flag the earlier log is kept under a numbered name).
  bool overwrite_output_dir = false;
  // text data (the names of transformers' run_classification.py)
  std::string train_file, validation_file, test_file;  // JSONL, CSV or TSV
  std::string text_column = "sentence";
  std::string text_pair_column;  // empty: single sentences
  std::string label_column = "label";
  int max_seq_length = 128;
  std::string tokenizer_name;    // default: the model directory
  bool ignore_mismatched_sizes = false;  // checkpoint tensors of another shape are initialised anew
  bool group_by_length = false;
  int dataloader_num_workers = 0;
  bool dataloader_pin_memory = true;
  // evaluation
  bool do_eval = false;                // evaluate after training (implied by --eval_strategy)
  std::string eval_strategy = "no";    // no | steps | epoch
  int64_t eval_steps = 0;              // 0: logging_steps
  int per_device_eval_batch_size = 8;
  std::string metric_for_best_model;   // default "loss" when --load_best_model_at_end
  std::optional<bool> greater_is_better;  // default: false for a loss, true otherwise
  bool load_best_model_at_end = false;
  // checkpoints
  std::string save_strategy = "steps";  // no | steps | epoch | best
  int64_t save_steps = 500;
  int64_t save_total_limit = 0;         // 0: keep all
  std::string resume_from_checkpoint;   // a checkpoint directory, or "last" for the newest in output_dir
  // reporting
  std::string report_to = "none";       // none | tensorboard | all
  std::string logging_dir;              // default: output_dir/runs/<date>_<host>
  // schedule
  int per_device_train_batch_size = 8;
  // The largest batch up to per_device_train_batch_size whose plan fits the GPU's free
  // memory (Trainer instead halves the batch after each out-of-memory failure).
  bool auto_find_batch_size = false;
  int gradient_accumulation_steps = 1;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 overrides num_train_epochs
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  std::string lr_scheduler_type = "linear";  // linear | constant | constant_with_warmup | cosine
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;                  // > 0 overrides warmup_ratio
  std::string optim = "adamw_torch";         // see optimizer_names() (src/optim/registry.cpp)
  std::string optim_args;                    // "key=value,key=value" for the optimizer
  uint64_t seed = 42;
  // logging and output
  int64_t logging_steps = 500;
  bool logging_first_step = false;
  bool disable_tqdm = false;
  bool tf32 = false;  // TF32 tensor cores for fp32 matrix products (CUDA); off by default, as in HF
  // Mixed precision (CUDA): fp32 master weights and optimizer state, half-precision
  // products and activations. fp16 adds dynamic loss scaling as torch.amp.GradScaler.
  bool bf16 = false;
  bool fp16 = false;
  // Each encoder layer keeps less for backward and recomputes the rest there: the same
  // gradients, bit for bit, in less memory. The policy (hone's own flag) says what is kept:
  // full (empty means full: the layer's input alone, as Trainer) or selective (the
  // products' outputs); it needs gradient_checkpointing. See Checkpointing in bert.h.
  bool gradient_checkpointing = false;
  std::string gradient_checkpointing_policy;
  // A DeepSpeed configuration file (hone/deepspeed.h), read by parse_training_arguments:
  // its offload_optimizer sets offload_optimizer, its optimizer and scheduler blocks replace
  // --optim's parameter groups and --lr_scheduler_type.
  std::string deepspeed;
  std::shared_ptr<const DeepSpeedConfig> deepspeed_config;
  // hone-specific
  // ZeRO-Offload on one GPU, without a DeepSpeed file: the fp32 master weights, the
  // gradients the optimizer reads and its state in page-locked host memory, the update on
  // the CPU (docs/design/offload.md).
  bool offload_optimizer = false;
  // ZeRO across data-parallel ranks (hone/trainer.h's Sharding), as a DeepSpeed file's
  // zero_optimization.stage sets it: 0 none, 1 optimizer state sharded, 2 gradients too.
  int zero_stage = 0;
  std::string device = "auto";  // auto | cpu | cuda
  bool cuda_graphs = true;      // replay repeated training steps as CUDA graphs
  int threads = 0;              // CPU threads; 0 = all cores
};

// Parses `hone train`/`hone estimate` style flags, without the program and subcommand names:
// --name value or --name=value; boolean flags also as --flag, --flag=false or --flag False.
// Unknown flags and invalid values throw hone::Error with a message naming the flag; a
// repeated flag keeps its last value, as with argparse. Reads --deepspeed's file.
// `-h`/`--help` throws CLI::CallForHelp (a CLI11 exception, not hone::Error): a program that
// prints help attaches the flags to its own CLI::App with add_training_arguments
// (src/train/arguments_cli.h) and lets CLI11 render it. Calls validate() on the result.
TrainingArguments parse_training_arguments(const std::vector<std::string>& argv);

// Checks values (positive batch size, rates in range, known scheduler/optimizer names,
// the --dataset spec) and throws hone::Error naming the offending flag.
void validate(const TrainingArguments& a);

// Reads --deepspeed's file (hone/deepspeed.h) into a.deepspeed_config, checked against the
// other flags, and sets offload_optimizer when the file offloads it. Called by
// parse_training_arguments after validate.
void apply_deepspeed(TrainingArguments& a);

// F32, or BF16 / F16 under --bf16 / --fp16: the dtype of activations and of the weights
// the model reads.
DType compute_dtype(const TrainingArguments& a);
// The same on backend be: F32 where be rounds the products' operands alone (the CPU's
// --bf16). A plan-only CPU backend (hone estimate) plans the GPU's layout.
DType compute_dtype(const TrainingArguments& a, const Backend& be);

// Every argument by its flag name, as training_args.json holds them.
nlohmann::ordered_json to_json(const TrainingArguments& a);

// The metric that picks the best checkpoint, with its "eval_" prefix, and whether
// larger is better.
std::string best_metric_key(const TrainingArguments& a);
bool best_metric_greater(const TrainingArguments& a);

// The parts of a --dataset "synthetic:NxL" spec: N sequences of L tokens (N >= 1, L >= 2).
struct SyntheticSpec {
  int64_t n;
  int len;
};
SyntheticSpec parse_synthetic_dataset(const std::string& spec);

}  // namespace hone
