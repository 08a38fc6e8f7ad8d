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

LabelSpace LabelSpace::infer(const TextTable& train, bool regression_model) {
  if (train.labels.empty()) fail("{}: no labels to learn the label set from", train.path);
  auto where = [&](size_t i) {
    return i < train.line.size() ? fmt::format("{}:{}", train.path, train.line[i]) : train.path;
  };
  auto line_of = [&](size_t i) {
    return i < train.line.size() ? fmt::format("line {}", train.line[i]) : fmt::format("row {}", i + 1);
  };
  const std::string column =
      train.label_column.empty() ? "the label column" : fmt::format("column \"{}\"", train.label_column);
  // As pandas types the column: all integers -> int64, all numbers -> float64 (a
  // regression, as run_glue decides from the dtype), all else -> strings. Names mixed with
  // numbers would be an object column of both, each its own class: almost surely a data
  // bug (a stray id among names, or a name among ids), so an error naming the value of
  // the kind that is the fewer.
  const size_t n = train.labels.size();
  bool all_int = true;
  size_t numbers = 0, first_number = n, first_name = n;
  for (size_t i = 0; i < n; ++i) {
    const std::string& l = train.labels[i];
    int64_t iv;
    double dv;
    if (parse_int(l, iv) || parse_number(l, dv)) {
      all_int = all_int && parse_int(l, iv);
      ++numbers;
      first_number = std::min(first_number, i);
    } else {
      first_name = std::min(first_name, i);
    }
  }
  if (numbers > 0 && numbers < n) {
    const size_t names = n - numbers;
    const bool odd_is_number = numbers < names || (numbers == names && first_number > first_name);
    const size_t odd = odd_is_number ? first_number : first_name, usual = odd_is_number ? first_name : first_number;
    fail("{}: the label \"{}\" is {}, but {} holds {} elsewhere (\"{}\" on {}; {} of the {} rows); a label column "
         "holds class names or numbers, not both",
         where(odd), train.labels[odd], odd_is_number ? "a number" : "a class name", column,
         odd_is_number ? "class names" : "numbers", train.labels[usual], line_of(usual),
         odd_is_number ? names : numbers, n);
  }
  const bool all_numbers = numbers == n;
  all_int = all_int && all_numbers;
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
  // A classifier learns nothing from one class (and transformers would make a one-label
  // head a regression): an error, unless the model is a regression, whose targets
  // these integers then are.
  auto one_class = [&](const std::string& label) {
    if (all_int && regression_model) {
      s.regression = true;
      return;
    }
    fail("{}: every label in {} is \"{}\": the data has one class, and a classifier needs at least two{}", train.path,
         column, label,
         all_int ? " (for a regression, write the targets as floats, such as 1.0, or start from a model whose "
                   "config.json has \"problem_type\": \"regression\")"
                 : "");
  };
  if (all_int) {
    std::set<int64_t> values;
    for (const std::string& l : train.labels) {
      int64_t v;
      parse_int(l, v);
      values.insert(v);
    }
    if (values.size() == 1) {
      one_class(train.labels.front());
      return s;
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
  if (names.size() == 1) one_class(*names.begin());
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
