// The label set of a run, inferred from the training labels as pandas types a column.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>
#include <string_view>

#include "hone/data.h"
#include "hone/error.h"

namespace hone {
namespace {

std::string_view unsigned_part(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  return s;
}

// A whole decimal integer ("7", "-3", "+2", "007").
bool parse_int(std::string_view s, int64_t& v) {
  s = unsigned_part(s);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

// A whole decimal number ("0.5", "-1e3", "2.0", "inf"; not hex).
bool parse_number(std::string_view s, double& v) {
  s = unsigned_part(s);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 20;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  if (names.size() > kShown) out += fmt::format(", ... ({} in all)", names.size());
  return out;
}

}  // namespace

LabelSpace LabelSpace::infer(const TextTable& train) {
  if (train.labels.empty()) fail("{}: no labels to learn the label set from", train.path);
  auto where = [&](size_t i) { return i < train.line.size() ? fmt::format("{}:{}", train.path, train.line[i]) : train.path; };
  // As pandas types the column: all integers -> int64, all numbers -> float64 (a
  // regression, as run_glue decides from the dtype), anything else -> strings.
  bool all_int = true, all_numbers = true;
  for (const std::string& l : train.labels) {
    int64_t iv;
    double dv;
    if (parse_int(l, iv)) continue;
    all_int = false;
    if (!parse_number(l, dv)) {
      all_numbers = false;
      break;
    }
  }
  LabelSpace s;
  if (all_numbers && !all_int) {
    s.regression = true;
    for (size_t i = 0; i < train.labels.size(); ++i) {
      double v;
      parse_number(train.labels[i], v);
      if (!std::isfinite(v)) fail("{}: the label \"{}\" is not a finite number", where(i), train.labels[i]);
    }
    return s;
  }
  if (all_int) {
    std::set<int64_t> values;
    for (const std::string& l : train.labels) {
      int64_t v;
      parse_int(l, v);
      values.insert(v);
    }
    const int64_t lo = *values.begin(), hi = *values.rbegin();
    // Class ids 0..K-1 keep their values, also when the training set lacks some of them
    // (the evaluation set may hold them); unless that would leave most ids unused.
    if (lo >= 0 && uint64_t(hi) < 2 * uint64_t(values.size())) {
      for (int64_t v = 0; v <= hi; ++v) s.names.push_back(std::to_string(v));
    } else {
      for (int64_t v : values) s.names.push_back(std::to_string(v));  // sorted by value
    }
    return s;
  }
  std::set<std::string> names(train.labels.begin(), train.labels.end());  // sorted, as run_glue sorts them
  s.names.assign(names.begin(), names.end());
  return s;
}

std::optional<float> LabelSpace::find(const std::string& label) const {
  if (regression) {
    double v;
    if (!parse_number(label, v) || !std::isfinite(v)) return std::nullopt;
    return float(v);
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == label) return float(i);
  // Integers as written differently ("+1", "01") name the same class.
  int64_t v, w;
  if (parse_int(label, v))
    for (size_t i = 0; i < names.size(); ++i)
      if (parse_int(names[i], w) && w == v) return float(i);
  return std::nullopt;
}

float LabelSpace::encode(const std::string& label, const std::string& where) const {
  if (std::optional<float> id = find(label)) return *id;
  if (regression) fail("{}: the label \"{}\" is not a finite number, and the task is a regression", where, label);
  fail("{}: unknown label \"{}\"; the training labels are {}", where, label, name_list(names));
}

}  // namespace hone
