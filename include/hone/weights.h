#pragma once
// Model files: random initialisation as transformers does it, loading a model.safetensors
// into the flat parameter buffer, and saving a directory that transformers reads.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hone/model.h"
#include "hone/config.h"
#include "hone/safetensors.h"

namespace hone {

// transformers' _init_weights for BERT: Linear and Embedding weights ~ normal(0,
// initializer_range), biases 0, the padding row of word_embeddings 0, LayerNorm weight 1
// and bias 0. Only the entries listed in `only` when it is not empty.
void init_weights(const ModelConfig& c, const ParamLayout& layout, float* weights, uint64_t seed,
                  const std::vector<std::string>& only = {});

// How init_weights sets entry `index` of a layout, so that a backend can do the same on its
// device (TrainingRun::init_weights): every element `value`, or (normal) pair k of
// normal_pair(seed, stream, k, value) (hone/normal.h) in elements 2k and 2k + 1; then
// elements [zero_begin, zero_end) of the entry zeroed (the padding row).
struct ParamInit {
  bool normal = false;
  float value = 0.0f;  // the constant, or the normal's standard deviation
  uint64_t stream = 0;
  int64_t zero_begin = 0, zero_end = 0;
};
ParamInit param_init(const ModelConfig& c, const ParamEntry& e, size_t index);

struct LoadReport {
  std::vector<std::string> initialized;  // newly initialised: the task head the file lacked, and `mismatched`
  std::vector<std::string> unused;       // tensors in the file that the model does not use
  std::vector<std::string> mismatched;   // of `initialized`, those the file has in another shape
};

// Reads `path` (a model.safetensors) into `weights`. Accepts transformers' names, names
// without the "bert." prefix (a BertModel checkpoint) and the legacy LayerNorm
// gamma/beta. A tensor whose shape differs from the config's is an error naming both,
// unless ignore_mismatched_sizes (transformers' flag of that name): then it is
// initialised anew. As in transformers, a missing task head (the pooler, the classifier)
// is initialised as init_weights does; a missing embedding or encoder tensor is an error
// naming the file, how many are missing and the first of them. A NaN or infinite value
// is an error naming the file, the tensor and the element (checked as the tensor is copied).
LoadReport load_weights(const std::string& path, const ModelConfig& c, const ParamLayout& layout, float* weights,
                        uint64_t seed, bool ignore_mismatched_sizes = false);

// What --model_name_or_path names: a directory with config.json (and model.safetensors),
// or a built-in configuration with random weights.
struct ModelSource {
  ModelConfig config;
  std::string weights_path;  // empty: random initialisation
  std::string name;
};
ModelSource resolve_model(const std::string& name_or_path);
// A configuration from a config.json, a directory with one, or a built-in name.
ModelConfig resolve_config(const std::string& name_or_path);

// Checks, from the header of `path` alone, that load_weights would find every tensor of
// the model `c` describes in its shape (the same errors, naming the file and the tensor),
// so that a config.json that does not describe the checkpoint (a vocab_size of 10^9) is
// refused before the model it describes is allocated.
void check_weights_fit(const std::string& path, const ModelConfig& c, bool ignore_mismatched_sizes = false);

// Writes config.json and model.safetensors (transformers' names and order) into `dir`,
// creating it; each file is written atomically.
void save_pretrained(const std::string& dir, const ModelConfig& c, const ParamLayout& layout, const float* weights);
// The same with the parameters streamed: write_parameters appends each entry of the layout,
// in the layout's order, as F32 (TrainingRun::save_model streams them from the device).
void save_pretrained(const std::string& dir, const ModelConfig& c, const ParamLayout& layout,
                     const std::function<void(const ByteWriter&)>& write_parameters);

}  // namespace hone
