#include "hone/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "hone/error.h"
#include "hone/safetensors.h"
#include "io/config_fields.h"

namespace hone {
namespace {

using nlohmann::json;

// The values a numeric field may take; an infinite `hi` is an open upper end, so that
// infinity (and NaN, which no comparison admits) is out of range.
struct Range {
  double lo, hi;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  std::string str() const {
    if (std::isinf(hi)) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
    return fmt::format("in {}{}, {}{}", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
  }
};
constexpr double kUnbounded = std::numeric_limits<double>::infinity();
constexpr Range kAtLeastOne{1, kUnbounded, false, true};
constexpr Range kNonNegative{0, kUnbounded, false, true};
constexpr Range kPositive{0, kUnbounded, true, true};
constexpr Range kProbability{0, 1, false, true};  // a dropout probability
// A step's dropout call sites (3 per layer, the embeddings' and the classifier's) are
// numbered in kDropoutSiteBits bits.
constexpr int kMaxLayers = ((1 << kDropoutSiteBits) - 3) / 3;
// No device holds a trillion parameters, and below that the byte counts of the memory
// plan (parameters x bytes x copies) stay far from int64's limit.
constexpr double kMaxParameters = double(int64_t(1) << 40);
// More labels than any sequence classification has; it also bounds the label names built on load.
constexpr Range kNumLabels{1, 1 << 20};

struct IntField {
  const char* key;
  int ModelConfig::*member;
  Range range;
};
const IntField kIntFields[] = {
    {"vocab_size", &ModelConfig::vocab_size, kAtLeastOne},
    {"hidden_size", &ModelConfig::hidden_size, kAtLeastOne},
    // hone's model needs a layer: without one its buffer plan fails.
    {"num_hidden_layers", &ModelConfig::num_hidden_layers, {1, kMaxLayers}},
    {"num_attention_heads", &ModelConfig::num_attention_heads, kAtLeastOne},
    {"intermediate_size", &ModelConfig::intermediate_size, kAtLeastOne},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings, kAtLeastOne},
    {"type_vocab_size", &ModelConfig::type_vocab_size, kAtLeastOne},
    {"pad_token_id", &ModelConfig::pad_token_id, kNonNegative},  // and below vocab_size
};
struct FloatField {
  const char* key;
  float ModelConfig::*member;
  Range range;
};
const FloatField kFloatFields[] = {
    {"hidden_dropout_prob", &ModelConfig::hidden_dropout_prob, kProbability},
    {"attention_probs_dropout_prob", &ModelConfig::attention_probs_dropout_prob, kProbability},
    {"initializer_range", &ModelConfig::initializer_range, kNonNegative},
    {"layer_norm_eps", &ModelConfig::layer_norm_eps, kPositive},
};
struct StringField {
  const char* key;
  std::string ModelConfig::*member;
};
const StringField kStringFields[] = {
    {"hidden_act", &ModelConfig::hidden_act},
    {"position_embedding_type", &ModelConfig::position_embedding_type},
};
// Fields to_json always writes itself, so a loaded value is not carried in `extra`:
// hone saves a sequence classifier in float32 whatever the source checkpoint was.
// ("dtype" is the name transformers >= 4.56 uses for torch_dtype.)
const char* kRewrittenFields[] = {"architectures", "torch_dtype", "dtype"};

template <typename T>  // int or float, printed as it is
void check_range(const std::string& source, std::string_view key, T value, const Range& range) {
  if (!range.contains(double(value))) fail("{}: {} must be {}, got {}", source, key, range.str(), value);
}

std::vector<std::string> default_labels(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(fmt::format("LABEL_{}", i));
  return names;
}

bool is_problem_type(const std::string& s) {
  return s == "regression" || s == "single_label_classification" || s == "multi_label_classification";
}

// What a field held, for type errors: `string "768"`, `array`.
std::string describe(const json& v) {
  if (v.is_structured() || v.is_null()) return v.type_name();
  return fmt::format("{} {}", v.type_name(), v.dump());
}

int as_int(const json& v, const std::string& source, std::string_view key) {
  if (!v.is_number_integer()) fail("{}: field '{}' must be an integer, got {}", source, key, describe(v));
  bool fits = v.is_number_unsigned()
                  ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                  : v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                        v.get<int64_t>() <= std::numeric_limits<int>::max();
  if (!fits) fail("{}: field '{}' is out of range: {}", source, key, v.dump());
  return int(v.get<int64_t>());
}

float as_float(const json& v, const std::string& source, std::string_view key) {
  if (!v.is_number()) fail("{}: field '{}' must be a number, got {}", source, key, describe(v));
  double d = v.get<double>();
  if (!(std::fabs(d) <= std::numeric_limits<float>::max()))
    fail("{}: field '{}' is out of range: {}", source, key, v.dump());
  return float(d);
}

std::string as_string(const json& v, const std::string& source, std::string_view key) {
  if (!v.is_string()) fail("{}: field '{}' must be a string, got {}", source, key, describe(v));
  return v.get<std::string>();
}

// The float as the shortest decimal that reads back to it, so 0.1f is written as 0.1
// rather than 0.10000000149011612.
double shortest(float f) { return std::strtod(fmt::format("{}", f).c_str(), nullptr); }

std::vector<std::string> parse_id2label(const json& v, const std::string& source) {
  if (!v.is_object())
    fail("{}: field 'id2label' must be an object like {{\"0\": \"NEG\"}}, got {}", source, describe(v));
  const int n = int(v.size());
  std::vector<std::string> names(static_cast<size_t>(n));
  std::vector<bool> seen(static_cast<size_t>(n));
  for (const auto& [key, name] : v.items()) {
    int id = -1;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    // JSON keys are strings; the ids must be exactly 0..n-1, each once.
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= n || seen[size_t(id)])
      fail("{}: id2label keys must be the label ids 0..{} each once, got key '{}'", source, n - 1, key);
    if (!name.is_string()) fail("{}: id2label['{}'] must be a string, got {}", source, key, describe(name));
    seen[size_t(id)] = true;
    names[size_t(id)] = name.get<std::string>();
  }
  return names;
}

// label2id alone gives id2label; with id2label it must describe the same mapping.
void check_label2id(const json& v, std::vector<std::string>& id2label, bool have_id2label,
                    const std::string& source) {
  if (!v.is_object()) fail("{}: field 'label2id' must be an object like {{\"NEG\": 0}}, got {}", source, describe(v));
  if (!have_id2label) id2label.assign(v.size(), "");
  const int n = int(id2label.size());
  std::vector<bool> seen(static_cast<size_t>(n));
  for (const auto& [name, idv] : v.items()) {
    int id = as_int(idv, source, "label2id['" + name + "']");
    if (id < 0 || id >= n)
      fail("{}: label2id['{}'] = {} is not a label id in 0..{}", source, name, id, n - 1);
    if (!have_id2label) {
      if (seen[size_t(id)]) fail("{}: label2id maps two labels to id {}", source, id);
      id2label[size_t(id)] = name;
    } else if (id2label[size_t(id)] != name) {
      fail("{}: label2id['{}'] = {} does not match id2label['{}'] = '{}'", source, name, id, id, id2label[size_t(id)]);
    }
    seen[size_t(id)] = true;
  }
  for (int i = 0; i < n; ++i)
    if (!seen[size_t(i)]) fail("{}: label2id has no entry for label id {} ('{}')", source, i, id2label[size_t(i)]);
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: a config must be a JSON object, got {}", source, j.type_name());
  ModelConfig c;
  // No model_type: a BERT's (older BERT checkpoints lack it).
  if (j.contains("model_type")) c.model_type = as_string(j.at("model_type"), source, "model_type");
  const ModelFamily& family = find_family(c.model_type, source);
  json fields = family.defaults;  // transformers' class defaults, then the file's fields
  for (const auto& [key, v] : j.items()) fields[key] = v;
  const json* id2label = nullptr;
  const json* label2id = nullptr;
  bool have_num_labels = false;
  for (const auto& [file_key, v] : fields.items()) {
    if (family.required.contains(file_key) && v != family.required.at(file_key))
      fail("{}: {} {} is not supported (hone runs {} {})", source, file_key, v.dump(), file_key,
           family.required.at(file_key).dump());
    // The family's own name for a BertConfig field (DistilBERT's "dim"), under BERT's name.
    std::string key = file_key;
    for (const auto& [file, hone] : family.renamed_fields)
      if (file == file_key) key = hone;
    if (key == "model_type") continue;
    if (std::ranges::find(family.fields, key) != family.fields.end()) {
      config_fields::read(c, key, v, fields, source);
      continue;
    }
    if (std::ranges::find(family.absent_fields, key) != family.absent_fields.end()) {
      c.extra[file_key] = v;  // the family has no such field: carried as it is
      continue;
    }
    auto is = [&key](const auto& field) { return key == field.key; };
    if (auto f = std::find_if(std::begin(kIntFields), std::end(kIntFields), is); f != std::end(kIntFields)) {
      c.*(f->member) = as_int(v, source, file_key);
    } else if (auto g = std::find_if(std::begin(kFloatFields), std::end(kFloatFields), is); g != std::end(kFloatFields)) {
      c.*(g->member) = as_float(v, source, file_key);
    } else if (auto s = std::find_if(std::begin(kStringFields), std::end(kStringFields), is); s != std::end(kStringFields)) {
      c.*(s->member) = as_string(v, source, file_key);
    } else if (key == "embedding_size" && !family.projection.empty()) {
      c.embedding_size = as_int(v, source, key);
    } else if (key == "num_labels") {
      c.num_labels = as_int(v, source, key);
      check_range(source, key, c.num_labels, kNumLabels);  // before default_labels makes a name for each
      have_num_labels = true;
    } else if (key == "classifier_dropout") {
      if (!v.is_null()) c.classifier_dropout = as_float(v, source, file_key);
    } else if (key == "problem_type") {
      if (!v.is_null()) c.problem_type = as_string(v, source, key);
      if (!c.problem_type.empty() && !is_problem_type(c.problem_type))
        fail("{}: field 'problem_type' must be null, regression, single_label_classification or "
             "multi_label_classification, got '{}'", source, c.problem_type);
    } else if (key == "id2label") {
      if (!v.is_null()) id2label = &v;
    } else if (key == "label2id") {
      if (!v.is_null()) label2id = &v;  // transformers 5 writes null when it has none
    } else if (std::find(std::begin(kRewrittenFields), std::end(kRewrittenFields), key) == std::end(kRewrittenFields)) {
      c.extra[file_key] = v;
    }
  }

  config_fields::finish(c, fields, source);
  // As in transformers, id2label (or label2id) gives the number of labels when num_labels is absent.
  if (id2label) c.id2label = parse_id2label(*id2label, source);
  if (label2id) check_label2id(*label2id, c.id2label, id2label != nullptr, source);
  if (id2label || label2id) {
    if (!have_num_labels) c.num_labels = int(c.id2label.size());
  } else {
    c.id2label = default_labels(c.num_labels);
  }
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail("cannot read config.json at {}: it is a directory", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read config.json at {}: {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("cannot read config.json at {}: read error", path);
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e400
    fail("{}: invalid JSON: {}", path, e.what());
  }
  return from_json(j, path);
}

json ModelConfig::to_json() const {
  const ModelFamily& f = family();
  json j = extra;  // the fields below take precedence over anything carried along
  j["architectures"] = json::array({f.architecture});
  j["model_type"] = model_type;
  auto put = [&](std::string_view name, json v) {
    if (std::ranges::find(f.absent_fields, name) == f.absent_fields.end()) j[f.file_name(name)] = std::move(v);
  };
  for (const IntField& k : kIntFields) put(k.key, this->*k.member);
  for (const FloatField& k : kFloatFields) put(k.key, shortest(this->*k.member));
  for (const StringField& k : kStringFields) put(k.key, this->*k.member);
  put("classifier_dropout", classifier_dropout ? json(shortest(*classifier_dropout)) : json(nullptr));
  if (!f.projection.empty()) j["embedding_size"] = embedding_width();
  config_fields::write(*this, j);
  // num_labels is not written: transformers derives it from id2label.
  json ids = json::object(), labels = json::object();
  for (size_t i = 0; i < id2label.size(); ++i) {
    ids[std::to_string(i)] = id2label[i];
    labels[id2label[i]] = int(i);
  }
  j["id2label"] = std::move(ids);
  j["label2id"] = std::move(labels);
  if (!problem_type.empty()) j["problem_type"] = problem_type;
  j["dtype"] = "float32";
  return j;
}

void ModelConfig::save(const std::string& path) const {
  // As transformers writes it: sorted keys (nlohmann::json keeps objects sorted), indent 2.
  write_file_atomic(path, to_json().dump(2) + "\n");
}

void ModelConfig::validate(const std::string& source) const {
  const ModelFamily& family = find_family(model_type, source);
  // Messages name the fields as the family's config.json does.
  for (const IntField& f : kIntFields) check_range(source, family.file_name(f.key), this->*f.member, f.range);
  for (const FloatField& f : kFloatFields) check_range(source, family.file_name(f.key), this->*f.member, f.range);
  if (embedding_size < 0) fail("{}: embedding_size must be >= 1, got {}", source, embedding_size);
  if (max_sequence_length() < 1)
    fail("{}: max_position_embeddings ({}) leaves no position after the padding index pad_token_id ({})", source,
         max_position_embeddings, pad_token_id);
  if (classifier_dropout) check_range(source, "classifier_dropout", *classifier_dropout, kProbability);
  check_range(source, "num_labels", num_labels, kNumLabels);
  if (hidden_size % num_attention_heads != 0)
    fail("{}: hidden_size ({}) must be divisible by num_attention_heads ({})", source, hidden_size,
         num_attention_heads);
  if (pad_token_id >= vocab_size)
    fail("{}: pad_token_id ({}) must be a token id below vocab_size ({})", source, pad_token_id, vocab_size);
  // Counted in double, as ParamLayout lays them out, since int64 may overflow here.
  const double H = hidden_size, I = intermediate_size, E = embedding_width();
  const double per_layer = 4 * (H * H + H) + (I * H + I) + (H * I + H) + 4 * H;
  const double parameters = (double(vocab_size) + max_position_embeddings + type_vocab_size) * E + 2 * E +
                            E * H + H +
                            num_hidden_layers * per_layer + (H * H + H) + (num_labels * H + num_labels);
  if (parameters > kMaxParameters)
    fail("{}: vocab_size {}, hidden_size {}, num_hidden_layers {}, intermediate_size {}, max_position_embeddings {} "
         "make a model of {:.3g} parameters, more than hone's limit of 2^40 ({:.3g})",
         source, vocab_size, hidden_size, num_hidden_layers, intermediate_size, max_position_embeddings, parameters,
         kMaxParameters);
  if (int(id2label.size()) != num_labels)
    fail("{}: num_labels is {} but id2label has {} labels", source, num_labels, id2label.size());
  if (hidden_act != "gelu" && hidden_act != "gelu_new" && hidden_act != "gelu_pytorch_tanh" && hidden_act != "relu")
    fail("{}: {} '{}' is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu)", source,
         family.file_name("hidden_act"), hidden_act);
  if (position_embedding_type != "absolute")
    fail("{}: position_embedding_type '{}' is not supported (hone implements only 'absolute')", source,
         position_embedding_type);
  config_fields::validate(*this, source);
  if (problem_type == "multi_label_classification")
    fail("{}: problem_type 'multi_label_classification' is not supported yet", source);
  if (!problem_type.empty() && !is_problem_type(problem_type))
    fail("{}: problem_type '{}' is not one of regression, single_label_classification", source, problem_type);
}

int ModelConfig::max_sequence_length() const {
  if (family().positions == PositionIds::AfterPadding) return max_position_embeddings - pad_token_id - 1;
  return max_position_embeddings;
}

Activation ModelConfig::activation() const {
  if (hidden_act == "gelu") return Activation::Gelu;
  if (hidden_act == "gelu_new" || hidden_act == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (hidden_act == "relu") return Activation::Relu;
  fail("hidden_act '{}' is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu)", hidden_act);
}

Activation ModelConfig::head_activation() const {
  const std::string& a = classifier_activation;
  if (a == "gelu") return Activation::Gelu;
  if (a == "gelu_new" || a == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (a == "relu") return Activation::Relu;
  fail("classifier_activation '{}' is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu)", a);
}

std::string ModelConfig::resolved_problem_type() const {
  if (!problem_type.empty()) return problem_type;
  return num_labels == 1 ? "regression" : "single_label_classification";
}

namespace {

struct Builtin {
  const char* name;
  const char* config;  // as the Hub checkpoint's config.json has it, less what is a default
};
const Builtin kBuiltins[] = {
    {"bert-tiny", R"({"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512})"},
    {"bert-mini", R"({"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024})"},
    {"bert-small", R"({"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048})"},
    {"bert-medium", R"({"num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048})"},
    {"bert-base-uncased", "{}"},
    {"bert-large-uncased",
     R"({"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096})"},
    {"roberta-base", R"({"model_type": "roberta", "max_position_embeddings": 514, "type_vocab_size": 1,
                         "layer_norm_eps": 1e-5})"},
    {"roberta-large", R"({"model_type": "roberta", "max_position_embeddings": 514, "type_vocab_size": 1,
                          "layer_norm_eps": 1e-5, "num_hidden_layers": 24, "hidden_size": 1024,
                          "num_attention_heads": 16, "intermediate_size": 4096})"},
    {"xlm-roberta-base", R"({"model_type": "xlm-roberta", "vocab_size": 250002, "max_position_embeddings": 514,
                             "type_vocab_size": 1, "layer_norm_eps": 1e-5})"},
    {"xlm-roberta-large", R"({"model_type": "xlm-roberta", "vocab_size": 250002, "max_position_embeddings": 514,
                              "type_vocab_size": 1, "layer_norm_eps": 1e-5, "num_hidden_layers": 24,
                              "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096})"},
    {"distilbert-base-uncased", R"({"model_type": "distilbert"})"},
    {"electra-small-discriminator", R"({"model_type": "electra"})"},
    {"electra-base-discriminator", R"({"model_type": "electra", "embedding_size": 768, "hidden_size": 768,
                                       "num_attention_heads": 12, "intermediate_size": 3072})"},
    {"electra-large-discriminator", R"({"model_type": "electra", "embedding_size": 1024, "hidden_size": 1024,
                                        "num_hidden_layers": 24, "num_attention_heads": 16,
                                        "intermediate_size": 4096})"},
    // answerdotai's released config.json: mean pooling, a sliding window of 128 in two of three layers.
    {"modernbert-base", R"({"model_type": "modernbert", "classifier_pooling": "mean", "global_attn_every_n_layers": 3,
                            "global_rope_theta": 160000.0, "local_rope_theta": 10000.0})"},
    {"modernbert-large", R"({"model_type": "modernbert", "classifier_pooling": "mean", "hidden_size": 1024,
                             "intermediate_size": 2624, "num_hidden_layers": 28, "num_attention_heads": 16,
                             "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
                             "local_rope_theta": 10000.0})"},
};
// Hub names of the same models: the small BERTs are prajjwal1's conversions of Google's
// checkpoints, which Google publishes under the L/H/A names.
const std::pair<const char*, const char*> kAliases[] = {
    {"google-bert/bert-base-uncased", "bert-base-uncased"},
    {"google-bert/bert-large-uncased", "bert-large-uncased"},
    {"prajjwal1/bert-tiny", "bert-tiny"},
    {"prajjwal1/bert-mini", "bert-mini"},
    {"prajjwal1/bert-small", "bert-small"},
    {"prajjwal1/bert-medium", "bert-medium"},
    {"google/bert_uncased_L-2_H-128_A-2", "bert-tiny"},
    {"google/bert_uncased_L-4_H-256_A-4", "bert-mini"},
    {"google/bert_uncased_L-4_H-512_A-8", "bert-small"},
    {"google/bert_uncased_L-8_H-512_A-8", "bert-medium"},
    {"FacebookAI/roberta-base", "roberta-base"},
    {"FacebookAI/roberta-large", "roberta-large"},
    {"FacebookAI/xlm-roberta-base", "xlm-roberta-base"},
    {"FacebookAI/xlm-roberta-large", "xlm-roberta-large"},
    {"distilbert/distilbert-base-uncased", "distilbert-base-uncased"},
    {"google/electra-small-discriminator", "electra-small-discriminator"},
    {"google/electra-base-discriminator", "electra-base-discriminator"},
    {"google/electra-large-discriminator", "electra-large-discriminator"},
    {"answerdotai/ModernBERT-base", "modernbert-base"},
    {"answerdotai/ModernBERT-large", "modernbert-large"},
};

}  // namespace

std::optional<ModelConfig> builtin_config(std::string_view name) {
  for (const auto& [alias, canonical] : kAliases)
    if (name == alias) name = canonical;
  for (const Builtin& b : kBuiltins)
    if (name == b.name) return ModelConfig::from_json(json::parse(b.config), fmt::format("built-in {}", b.name));
  return std::nullopt;
}

std::vector<std::string> builtin_config_names() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.push_back(b.name);
  return names;
}

}  // namespace hone
