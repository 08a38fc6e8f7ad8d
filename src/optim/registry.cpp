// The optimizers hone implements, by Trainer's --optim names, and --optim_args parsing.
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "hone/error.h"
#include "optim/optimizers.h"

namespace hone {
namespace {

struct Registered {
  std::string_view name;
  optim::Factory make;
};

// adamw_torch_fused is torch's fused kernel for the same update; hone has one kernel.
const Registered kOptimizers[] = {
    {"adamw_torch", optim::make_adamw},
    {"adamw_torch_fused", optim::make_adamw},
    {"adafactor", optim::make_adafactor},
    {"sgd", optim::make_sgd},
    {"adagrad", optim::make_adagrad},
    {"lion_32bit", optim::make_lion},
    {"adamw_bnb_8bit", optim::make_adamw_8bit},
    {"adamw_8bit", optim::make_adamw_8bit},  // Trainer builds the same optimizer for both names
    {"lion_8bit", optim::make_lion_8bit},
};

const Registered& find(const std::string& name) {
  for (const Registered& r : kOptimizers)
    if (r.name == name) return r;
  fail("--optim: hone does not implement '{}'; supported: {}", name, fmt::join(optimizer_names(), ", "));
}

}  // namespace

OptimArgs parse_optim_args(const std::string& text) {
  std::string s;
  std::copy_if(text.begin(), text.end(), std::back_inserter(s), [](char c) { return c != ' '; });
  OptimArgs out;
  if (s.empty()) return out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    const std::string item = s.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || item.find('=', eq + 1) != std::string::npos)
      fail("--optim_args: expected key=value pairs separated by commas, got '{}' in '{}'", item, text);
    out[item.substr(0, eq)] = item.substr(eq + 1);
    start = end + 1;
  }
  return out;
}

std::vector<std::string_view> optimizer_names() {
  std::vector<std::string_view> names;
  for (const Registered& r : kOptimizers) names.push_back(r.name);
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(const TrainingArguments& a) {
  const Registered& r = find(a.optim);
  const OptimArgs args = parse_optim_args(a.optim_args);
  optim::ArgsReader reader(r.name, args);
  std::unique_ptr<Optimizer> o = r.make(r.name, a, reader);
  reader.finish();
  return o;
}

void validate_optimizer(const TrainingArguments& a) { make_optimizer(a); }

Tensor OptimizerTarget::param(const ParamEntry& e) const { return params.rows(e.offset, e.offset + e.shape.numel()); }

Tensor OptimizerTarget::grad(const ParamEntry& e) const {
  const int64_t at = e.offset - layout.groups()[size_t(e.group)].begin;
  return group_grads[size_t(e.group)].rows(at, at + e.shape.numel());
}

Tensor OptimizerTarget::half_rows(int64_t begin, int64_t end) const {
  if (!half.data || end <= half_begin) return {};
  HONE_CHECK(begin >= half_begin, "parameters [{}, {}) straddle the start of their half copy at {}", begin, end,
             half_begin);
  return half.rows(begin - half_begin, end - half_begin);
}

Tensor OptimizerTarget::half_of(const ParamEntry& e) const { return half_rows(e.offset, e.offset + e.shape.numel()); }

std::vector<ParamRange> decay_ranges(const ParamLayout& layout) {
  std::vector<ParamRange> out;
  const auto& groups = layout.groups();
  // A range ends where the embedding tables do: they may have no half copy (half_rows).
  auto add = [&](int k, int64_t begin, int64_t end, bool decay) {
    const int64_t cut = layout.tables_end();
    if (begin < cut && cut < end) {
      out.push_back({k, begin, cut, decay});
      begin = cut;
    }
    if (begin < end) out.push_back({k, begin, end, decay});
  };
  for (size_t k = 0; k < groups.size(); ++k) {
    const ParamGroup& g = groups[k];
    add(int(k), g.begin, g.decayed_end, true);
    add(int(k), g.decayed_end, g.end, false);
  }
  return out;
}

namespace optim {

double ArgsReader::number(const std::string& key, double fallback) {
  read_.push_back(key);
  const auto it = args_.find(key);
  if (it == args_.end()) return fallback;
  const std::string& v = it->second;
  double x = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  if (r.ec != std::errc{} || r.ptr != v.data() + v.size() || !std::isfinite(x))
    fail("--optim_args {}={}: expected a finite number", key, v);
  return x;
}

bool ArgsReader::flag(const std::string& key, bool fallback) {
  read_.push_back(key);
  const auto it = args_.find(key);
  if (it == args_.end()) return fallback;
  std::string v = it->second;
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  fail("--optim_args {}={}: expected true or false", key, it->second);
}

void ArgsReader::finish() const {
  for (const auto& [key, value] : args_)
    if (std::find(read_.begin(), read_.end(), key) == read_.end()) {
      if (read_.empty()) fail("--optim_args: --optim {} takes no arguments, got '{}'", optim_, key);
      fail("--optim_args: --optim {} has no setting '{}'; it takes {}", optim_, key, fmt::join(read_, ", "));
    }
}

}  // namespace optim
}  // namespace hone
