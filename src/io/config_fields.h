#pragma once
// config.json fields beyond BertConfig's that some families have (ModelFamily::fields:
// ModernBERT's biases, pooling, local attention and rotary bases), read, written and
// checked apart from the BERT fields in config.cpp.
#include <nlohmann/json.hpp>
#include <string>

#include "hone/config.h"

namespace hone::config_fields {

// Reads field `key` of the family's fields; `all` is every field of the file (with the
// family's defaults), for the rotary bases that rope_parameters gives per layer type.
void read(ModelConfig& c, const std::string& key, const nlohmann::json& v, const nlohmann::json& all,
          const std::string& source);
// After every field is read: layer_types from global_attn_every_n_layers when the file
// gives no layer_types.
void finish(ModelConfig& c, const nlohmann::json& all, const std::string& source);
// Writes them as transformers 5 does (layer_types and rope_parameters, not the older keys).
void write(const ModelConfig& c, nlohmann::json& j);
void validate(const ModelConfig& c, const std::string& source);

}  // namespace hone::config_fields
