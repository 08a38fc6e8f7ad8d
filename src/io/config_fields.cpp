#include "io/config_fields.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "hone/error.h"

namespace hone::config_fields {
namespace {

using nlohmann::json;

bool as_bool(const json& v, const std::string& source, const std::string& key) {
  if (!v.is_boolean()) fail("{}: field '{}' must be true or false, got {}", source, key, v.dump());
  return v.get<bool>();
}

std::string as_string(const json& v, const std::string& source, const std::string& key) {
  if (!v.is_string()) fail("{}: field '{}' must be a string, got {}", source, key, v.dump());
  return v.get<std::string>();
}

float as_float(const json& v, const std::string& source, const std::string& key) {
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    fail("{}: field '{}' must be a number, got {}", source, key, v.dump());
  return float(v.get<double>());
}

int as_int(const json& v, const std::string& source, const std::string& key) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t(1) << 30))
    fail("{}: field '{}' must be an integer in [0, 2^30], got {}", source, key, v.dump());
  return int(v.get<int64_t>());
}

// rope_parameters[layer_type].rope_theta, or `fallback` when the file gives none there.
float rope_theta(const json& all, const char* layer_type, float fallback, const std::string& source) {
  if (!all.contains("rope_parameters") || all["rope_parameters"].is_null()) return fallback;
  const json& rp = all["rope_parameters"];
  if (!rp.is_object()) fail("{}: field 'rope_parameters' must be an object, got {}", source, rp.dump());
  if (!rp.contains(layer_type) || rp[layer_type].is_null()) return fallback;
  const json& p = rp[layer_type];
  const std::string where = fmt::format("rope_parameters.{}", layer_type);
  if (!p.is_object()) fail("{}: field '{}' must be an object, got {}", source, where, p.dump());
  if (p.contains("rope_type") && p["rope_type"] != "default")
    fail("{}: {}.rope_type {} is not supported (hone implements \"default\")", source, where, p["rope_type"].dump());
  for (const auto& [k, v] : p.items())
    if (k != "rope_type" && k != "rope_theta")
      fail("{}: {}.{} is not supported (hone implements the default rotary embedding)", source, where, k);
  return p.contains("rope_theta") ? as_float(p["rope_theta"], source, where + ".rope_theta") : fallback;
}

}  // namespace

void read(ModelConfig& c, const std::string& key, const json& v, const json& all, const std::string& source) {
  if (key == "norm_bias") c.norm_bias = as_bool(v, source, key);
  else if (key == "attention_bias") c.attention_bias = as_bool(v, source, key);
  else if (key == "mlp_bias") c.mlp_bias = as_bool(v, source, key);
  else if (key == "classifier_bias") c.classifier_bias = as_bool(v, source, key);
  else if (key == "classifier_pooling") c.classifier_pooling = as_string(v, source, key);
  else if (key == "classifier_activation") c.classifier_activation = as_string(v, source, key);
  else if (key == "local_attention") c.local_attention = as_int(v, source, key);
  else if (key == "embedding_dropout") c.embedding_dropout = as_float(v, source, key);
  else if (key == "layer_types") {
    if (v.is_null()) return;  // from global_attn_every_n_layers below
    if (!v.is_array()) fail("{}: field 'layer_types' must be a list of strings, got {}", source, v.dump());
    c.layer_types.clear();
    for (const json& t : v) c.layer_types.push_back(as_string(t, source, "layer_types[]"));
  } else if (key == "global_attn_every_n_layers") {
    as_int(v, source, key);  // layer_types' older form, read by finish
  } else if (key == "rope_parameters") {
    c.global_rope_theta = rope_theta(all, "full_attention", c.global_rope_theta, source);
    c.local_rope_theta = rope_theta(all, "sliding_attention", c.local_rope_theta, source);
  } else if (key == "global_rope_theta" || key == "local_rope_theta") {
    // The older keys, which rope_parameters overrides (read after them: keys are sorted).
    (key == "global_rope_theta" ? c.global_rope_theta : c.local_rope_theta) = as_float(v, source, key);
  } else {
    fail("{}: field '{}' has no reader (hone bug)", source, key);
  }
}

void finish(ModelConfig& c, const json& all, const std::string& source) {
  const ModelFamily& f = c.family();
  if (std::ranges::find(f.fields, "layer_types") == f.fields.end() || !c.layer_types.empty()) return;
  // transformers' older form: layer l is full when l % n == 0 (n = 3 by default).
  const int n = all.contains("global_attn_every_n_layers")
                    ? as_int(all["global_attn_every_n_layers"], source, "global_attn_every_n_layers")
                    : 3;
  if (n < 1) fail("{}: global_attn_every_n_layers must be >= 1, got {}", source, n);
  for (int l = 0; l < c.num_hidden_layers; ++l) c.layer_types.push_back(l % n ? "sliding_attention" : "full_attention");
}

void write(const ModelConfig& c, json& j) {
  const ModelFamily& f = c.family();
  auto has = [&](const char* k) { return std::ranges::find(f.fields, k) != f.fields.end(); };
  if (has("norm_bias")) j["norm_bias"] = c.norm_bias;
  if (has("attention_bias")) j["attention_bias"] = c.attention_bias;
  if (has("mlp_bias")) j["mlp_bias"] = c.mlp_bias;
  if (has("classifier_bias")) j["classifier_bias"] = c.classifier_bias;
  if (has("classifier_pooling")) j["classifier_pooling"] = c.classifier_pooling;
  if (has("classifier_activation")) j["classifier_activation"] = c.classifier_activation;
  if (has("local_attention")) j["local_attention"] = c.local_attention;
  if (has("embedding_dropout"))
    j["embedding_dropout"] = std::strtod(fmt::format("{}", c.effective_embedding_dropout()).c_str(), nullptr);
  if (has("layer_types")) j["layer_types"] = c.layer_types;
  if (has("rope_parameters")) {
    auto rope = [](float theta) {
      return json{{"rope_type", "default"}, {"rope_theta", std::strtod(fmt::format("{}", theta).c_str(), nullptr)}};
    };
    j["rope_parameters"] = {{"full_attention", rope(c.global_rope_theta)},
                            {"sliding_attention", rope(c.local_rope_theta)}};
  }
}

void validate(const ModelConfig& c, const std::string& source) {
  if (c.classifier_pooling != "cls" && c.classifier_pooling != "mean")
    fail("{}: classifier_pooling '{}' is not supported (supported: cls, mean)", source, c.classifier_pooling);
  if (c.family().head.activation == HeadActivation::Config) c.head_activation();  // names a bad value
  if (!c.layer_types.empty()) {
    if (int(c.layer_types.size()) != c.num_hidden_layers)
      fail("{}: layer_types has {} entries for {} layers", source, c.layer_types.size(), c.num_hidden_layers);
    for (const std::string& t : c.layer_types)
      if (t != "full_attention" && t != "sliding_attention")
        fail("{}: layer_types entry '{}' is not supported (supported: full_attention, sliding_attention)", source, t);
  }
  if (c.family().positions == PositionIds::Rotary) {
    if (c.head_dim() % 2 != 0)
      fail("{}: rotary embeddings need an even head size, got {} (hidden_size / num_attention_heads)", source,
           c.head_dim());
    if (!(c.global_rope_theta > 0.0f) || !(c.local_rope_theta > 0.0f))
      fail("{}: rope_theta must be positive (full_attention {}, sliding_attention {})", source, c.global_rope_theta,
           c.local_rope_theta);
  }
  if (c.embedding_dropout && !(*c.embedding_dropout >= 0.0f && *c.embedding_dropout < 1.0f))
    fail("{}: embedding_dropout must be in [0, 1), got {}", source, *c.embedding_dropout);
}

}  // namespace hone::config_fields
