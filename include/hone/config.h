#pragma once
// ModelConfig with Hugging Face's field names and defaults (transformers.ModelConfig).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hone/backend.h"
#include "hone/family.h"

namespace hone {

struct ModelConfig {
  std::string model_type = "bert";  // one of family_names()
  int vocab_size = 30522;
  int hidden_size = 768;
  int num_hidden_layers = 12;
  int num_attention_heads = 12;
  int intermediate_size = 3072;
  std::string hidden_act = "gelu";
  float hidden_dropout_prob = 0.1f;
  float attention_probs_dropout_prob = 0.1f;
  int max_position_embeddings = 512;
  int type_vocab_size = 2;
  float initializer_range = 0.02f;
  float layer_norm_eps = 1e-12f;
  int pad_token_id = 0;
  std::string position_embedding_type = "absolute";
  std::optional<float> classifier_dropout;  // null: hidden_dropout_prob is used
  int num_labels = 2;
  std::vector<std::string> id2label = {"LABEL_0", "LABEL_1"};  // size num_labels; "LABEL_i" when not given
  int embedding_size = 0;  // ELECTRA's embedding width; 0: hidden_size
  std::string problem_type;  // "", "regression", "single_label_classification"
  // The fields of families other than BERT's (ModelFamily::fields; ModernBERT's): families
  // without them run these values.
  bool norm_bias = true, attention_bias = true, mlp_bias = true, classifier_bias = true;
  std::string classifier_pooling = "cls";  // or "mean": the attended tokens' mean
  std::string classifier_activation;       // the head's activation where the family reads it here
  int local_attention = 0;                 // a sliding layer's keys: within local_attention / 2 each way
  std::vector<std::string> layer_types;    // per layer, "full_attention" or "sliding_attention"; empty: all full
  float global_rope_theta = 160000.0f, local_rope_theta = 10000.0f;  // rotary bases of full and sliding layers
  std::optional<float> embedding_dropout;  // null: hidden_dropout_prob
  nlohmann::json extra = nlohmann::json::object();  // fields hone does not use, written back unchanged

  // Parses a config.json object and validates it; `source` names the file in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig load(const std::string& path);  // reads, parses and validates a config.json
  nlohmann::json to_json() const;                   // as transformers writes it
  void save(const std::string& path) const;         // atomically

  // Throws hone::Error naming `source`, the field and its value for a value out of its
  // range or inconsistent with the others.
  void validate(const std::string& source) const;
  const ModelFamily& family() const { return find_family(model_type, "config"); }
  int embedding_width() const { return embedding_size > 0 ? embedding_size : hidden_size; }
  // Whether the embeddings are projected to hidden_size (ELECTRA with embedding_size != hidden_size).
  bool projects_embeddings() const { return !family().projection.empty() && embedding_width() != hidden_size; }
  // The longest sequence the position embeddings cover (RoBERTa's start after the padding index).
  int max_sequence_length() const;
  Activation activation() const;
  int head_dim() const { return hidden_size / num_attention_heads; }
  float effective_classifier_dropout() const { return classifier_dropout.value_or(hidden_dropout_prob); }
  float effective_embedding_dropout() const { return embedding_dropout.value_or(hidden_dropout_prob); }
  // The head's activation for HeadActivation::Config.
  Activation head_activation() const;
  bool sliding(int layer) const { return !layer_types.empty() && layer_types[size_t(layer)] == "sliding_attention"; }
  // Layer l's attention window (AttentionDims::window): local_attention / 2 when it slides, else -1.
  int attention_window(int layer) const { return sliding(layer) ? local_attention / 2 : -1; }
  float rope_theta(int layer) const { return sliding(layer) ? local_rope_theta : global_rope_theta; }
  // "regression" when num_labels == 1, else single-label classification, unless set.
  std::string resolved_problem_type() const;
};

// Configurations hone knows without any file, as their Hub checkpoints' config.json has
// them: bert-tiny ... bert-large-uncased, roberta-base/large, xlm-roberta-base/large,
// distilbert-base-uncased, electra-small/base/large-discriminator, modernbert-base/large,
// also under their Hub names (google-bert/bert-base-uncased, prajjwal1/bert-tiny,
// FacebookAI/roberta-base, answerdotai/ModernBERT-large, ...).
std::optional<ModelConfig> builtin_config(std::string_view name);
std::vector<std::string> builtin_config_names();

}  // namespace hone
