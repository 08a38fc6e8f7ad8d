#include "hone/weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <set>

#include "hone/normal.h"
#include "hone/safetensors.h"

namespace hone {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Streams for weight init are disjoint from dropout's (step << 12 | site) by the top bit.
constexpr uint64_t kInitStream = uint64_t(1) << 63;

void init_entry(const ModelConfig& c, const ParamEntry& e, size_t index, float* w, uint64_t seed) {
  const int64_t n = e.shape.numel();
  float* p = w + e.offset;
  const ParamInit init = param_init(c, e, index);
  if (!init.normal) {
    std::fill(p, p + n, init.value);
    return;
  }
  // Pair k is elements 2k and 2k + 1, whichever thread draws it (bert-large's 335M draws
  // take seconds on one core).
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < (n + 1) / 2; ++k) {
    const NormalPair v = normal_pair(seed, init.stream, uint64_t(k), init.value);
    p[2 * k] = v.a;
    if (2 * k + 1 < n) p[2 * k + 1] = v.b;
  }
  std::fill(p + init.zero_begin, p + init.zero_end, 0.0f);
}

// What transformers initialises anew when it loads an encoder for sequence
// classification: the head (BERT's pooler, which checkpoints saved without one lack, and
// the classifier; the other families' classification heads).
bool is_task_head(const ParamEntry& e, const ParamLayout& layout, const ModelConfig& c) {
  const std::string& final_norm = c.family().final_norm;  // the encoder's, in the head's group
  if (!final_norm.empty() && e.name.starts_with(final_norm + ".")) return false;
  return e.group == int(layout.groups().size()) - 1;
}

// 'a', 'b', 'c' and the count of the rest: a list of names short enough for a message.
std::string first_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 3;
  std::string s;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i) s += fmt::format("{}'{}'", i ? ", " : "", names[i]);
  if (names.size() > kShown) s += fmt::format(" and {} more", names.size() - kShown);
  return s;
}

std::string value_name(float v) {
  if (std::isnan(v)) return "NaN";
  return v > 0 ? "+inf" : "-inf";
}

// The parameter a checkpoint tensor name refers to, or "" if none: the name itself, the
// name without the encoder's prefix (a BertModel or RobertaModel checkpoint), or the
// legacy LayerNorm gamma/beta.
std::string canonical_name(const std::string& file_name, const ModelConfig& c, const ParamLayout& layout) {
  std::string n = file_name;
  if (ends_with(n, ".gamma")) n = n.substr(0, n.size() - 6) + ".weight";
  if (ends_with(n, ".beta")) n = n.substr(0, n.size() - 5) + ".bias";
  if (layout.find(n)) return n;
  const std::string prefixed = c.family().base + "." + n;
  if (layout.find(prefixed)) return prefixed;
  return "";
}

bool same_shape(const SafetensorsEntry& t, const ParamEntry& e) {
  bool same = int(t.shape.size()) == e.shape.rank;
  for (int i = 0; same && i < e.shape.rank; ++i) same = t.shape[i] == e.shape[i];
  return same;
}

[[noreturn]] void fail_shape(const std::string& path, const SafetensorsEntry& t, const ParamEntry& e) {
  std::string got = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) got += (i ? ", " : "") + std::to_string(t.shape[i]);
  fail("{}: tensor '{}' has shape {}] but the model's config.json needs {} (for a new label set, "
       "--ignore_mismatched_sizes initialises such tensors anew)",
       path, t.name, got, e.shape.str());
}

[[noreturn]] void fail_absent(const std::string& path, const std::vector<std::string>& absent, size_t encoder_tensors,
                              const std::vector<std::string>& unused, const std::string& model_type) {
  fail("{}: lacks {} of the model's {} embedding and encoder tensors ({}){}; hone initialises only the "
       "classification head anew (is it a {} checkpoint, and does its config.json describe it?)",
       path, absent.size(), encoder_tensors, first_names(absent),
       unused.empty() ? "" : fmt::format(", and has {} tensors the model does not use ({})", unused.size(),
                                         first_names(unused)),
       model_type);
}

}  // namespace

ParamInit param_init(const ModelConfig& c, const ParamEntry& e, size_t index) {
  ParamInit init;
  switch (e.kind) {
    case ParamKind::NormWeight: init.value = 1.0f; return init;
    case ParamKind::NormBias:
    case ParamKind::Bias: return init;
    case ParamKind::Embedding:
    case ParamKind::Weight: break;
  }
  init.normal = true;
  init.value = e.init_std > 0.0f ? e.init_std : c.initializer_range;
  init.stream = kInitStream | index;
  if (e.zero_row >= 0 && e.zero_row < e.shape[0]) {
    init.zero_begin = e.zero_row * e.shape[1];
    init.zero_end = init.zero_begin + e.shape[1];
  }
  return init;
}

void init_weights(const ModelConfig& c, const ParamLayout& layout, float* weights, uint64_t seed,
                  const std::vector<std::string>& only) {
  const auto& entries = layout.entries();
  for (size_t i = 0; i < entries.size(); ++i)
    if (only.empty() || std::find(only.begin(), only.end(), entries[i].name) != only.end())
      init_entry(c, entries[i], i, weights, seed);
}

LoadReport load_weights(const std::string& path, const ModelConfig& c, const ParamLayout& layout, float* weights,
                        uint64_t seed, bool ignore_mismatched_sizes) {
  SafetensorsFile file(path);
  LoadReport report;
  std::set<std::string> loaded;
  for (const SafetensorsEntry& t : file.entries()) {
    std::string name = canonical_name(t.name, c, layout);
    if (name.empty()) {
      // Buffers that older checkpoints carry are not parameters; everything else is reported.
      if (!ends_with(t.name, "position_ids")) report.unused.push_back(t.name);
      continue;
    }
    const ParamEntry& e = layout.at(name);
    const bool same = same_shape(t, e);
    if (!same && ignore_mismatched_sizes) {
      report.mismatched.push_back(name);  // initialised below, with the missing ones
      continue;
    }
    if (!same) fail_shape(path, t, e);
    if (!loaded.insert(name).second) fail("{}: parameter '{}' appears twice (as '{}')", path, name, t.name);
    const int64_t bad = file.read_f32(t, weights + e.offset, e.shape.numel());
    if (bad >= 0)
      fail("{}: tensor '{}' holds {} at {}: the weights are not finite (a damaged file, or saved from a run that "
           "diverged)",
           path, t.name, value_name(weights[e.offset + bad]), element_index(t.shape, bad));
  }
  std::vector<std::string> absent;  // encoder parameters the file has under no name, in no shape
  size_t encoder_tensors = 0;
  for (const auto& e : layout.entries()) {
    const bool head = is_task_head(e, layout, c);
    encoder_tensors += !head;
    if (loaded.count(e.name)) continue;
    report.initialized.push_back(e.name);
    if (!head && std::ranges::find(report.mismatched, e.name) == report.mismatched.end()) absent.push_back(e.name);
  }
  if (!absent.empty()) fail_absent(path, absent, encoder_tensors, report.unused, c.model_type);
  if (!report.initialized.empty()) init_weights(c, layout, weights, seed, report.initialized);
  return report;
}

void check_weights_fit(const std::string& path, const ModelConfig& c, bool ignore_mismatched_sizes) {
  // As load_weights matches tensors to parameters, on the header alone.
  const SafetensorsFile file(path);
  const ParamLayout layout(c);
  std::set<std::string> found;
  std::vector<std::string> unused;
  for (const SafetensorsEntry& t : file.entries()) {
    const std::string name = canonical_name(t.name, c, layout);
    if (name.empty()) {
      if (!ends_with(t.name, "position_ids")) unused.push_back(t.name);
      continue;
    }
    if (!same_shape(t, layout.at(name)) && !ignore_mismatched_sizes) fail_shape(path, t, layout.at(name));
    found.insert(name);
  }
  std::vector<std::string> absent;
  size_t encoder_tensors = 0;
  for (const auto& e : layout.entries()) {
    if (is_task_head(e, layout, c)) continue;
    ++encoder_tensors;
    if (!found.count(e.name)) absent.push_back(e.name);
  }
  if (!absent.empty()) fail_absent(path, absent, encoder_tensors, unused, c.model_type);
}

namespace {

std::string builtin_names() {
  std::string known;
  for (const auto& n : builtin_config_names()) known += (known.empty() ? "" : ", ") + n;
  return known;
}

}  // namespace

ModelConfig resolve_config(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(name_or_path)) return ModelConfig::load((fs::path(name_or_path) / "config.json").string());
  if (fs::is_regular_file(name_or_path)) return ModelConfig::load(name_or_path);
  if (auto c = builtin_config(name_or_path)) return *c;
  fail("--config_name {}: no such file or directory, and not a built-in configuration ({})", name_or_path,
       builtin_names());
}

ModelSource resolve_model(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  ModelSource m;
  m.name = name_or_path;
  if (fs::is_directory(name_or_path)) {
    m.config = ModelConfig::load((fs::path(name_or_path) / "config.json").string());
    fs::path weights = fs::path(name_or_path) / "model.safetensors";
    if (!fs::exists(weights)) {
      std::string hint = fs::exists(fs::path(name_or_path) / "pytorch_model.bin")
                             ? " (it has pytorch_model.bin: hone reads safetensors only; re-save the model with "
                               "save_pretrained(dir, safe_serialization=True))"
                             : "";
      fail("{} has a config.json but no model.safetensors{}", name_or_path, hint);
    }
    m.weights_path = weights.string();
    return m;
  }
  if (auto c = builtin_config(name_or_path)) {
    m.config = *c;
    return m;
  }
  fail("--model_name_or_path {}: no such directory, and not a built-in configuration ({})", name_or_path,
       builtin_names());
}

void save_pretrained(const std::string& dir, const ModelConfig& c, const ParamLayout& layout, const float* weights) {
  save_pretrained(dir, c, layout, [&](const ByteWriter& write) {
    for (const auto& e : layout.entries()) write(weights + e.offset, size_t(e.shape.numel()) * sizeof(float));
  });
}

void save_pretrained(const std::string& dir, const ModelConfig& c, const ParamLayout& layout,
                     const std::function<void(const ByteWriter&)>& write_parameters) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create output directory {}: {}", dir, ec.message());
  std::vector<TensorHeader> tensors;
  for (const auto& e : layout.entries()) tensors.push_back({e.name, DType::F32, e.shape});
  write_safetensors((std::filesystem::path(dir) / "model.safetensors").string(), tensors, write_parameters);
  c.save((std::filesystem::path(dir) / "config.json").string());
}

}  // namespace hone
