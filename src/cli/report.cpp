#include "cli/report.h"

#include <fmt/format.h>

namespace hone::cli {

std::string describe(const ModelConfig& c, int64_t params) {
  return fmt::format("{} layers, hidden {}, {} heads, intermediate {}, {} labels ({}); {} parameters",
                     c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_labels,
                     c.resolved_problem_type(), with_commas(uint64_t(params)));
}

std::string python_dict(const nlohmann::ordered_json& j) {
  std::string s = "{";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it != j.begin()) s += ", ";
    s += fmt::format("'{}': ", it.key());
    const auto& v = it.value();
    if (v.is_number_float()) {  // as Python's repr: 1.0, not 1
      std::string f = fmt::format("{}", v.get<double>());
      if (f.find_first_of(".en") == std::string::npos) f += ".0";
      s += f;
    } else if (v.is_string()) {
      s += fmt::format("'{}'", v.get<std::string>());
    } else {
      s += v.dump();
    }
  }
  return s + "}";
}

std::string with_commas(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string memory_table(const MemoryPlan& plan, int64_t params, const size_t* measured) {
  const auto unshared = plan.unshared_bytes();
  std::string s = fmt::format("  {:<24} {:>15} {:>10} {:>12} {:>15}{}\n", "category", "planned bytes", "MiB",
                              "bytes/param", "without reuse", measured ? fmt::format(" {:>15}", "measured bytes") : "");
  // The device's categories and their total, then the page-locked host's (an offloaded
  // optimizer's), if any.
  for (const bool host : {false, true}) {
    if (host && plan.host_bytes() == 0) break;
    size_t total_measured = 0, total_unshared = 0;
    for (int c = 0; c < kNumCategories; ++c) {
      if (on_host(Category(c)) != host) continue;
      total_unshared += unshared[c];
      const size_t b = plan.category_bytes[c];
      // A category packed into another's arena costs nothing of its own: its bytes are in
      // the host's row, which names both.
      std::string name(category_name(Category(c)));
      size_t without_reuse = unshared[c];
      for (int guest = 0; guest < kNumCategories; ++guest)
        if (guest != c && plan.arena_of[guest] == Category(c)) {
          name += " + " + std::string(category_name(Category(guest)));
          without_reuse += unshared[guest];
        }
      if (b == 0 && without_reuse == 0) continue;  // e.g. master weights in an fp32 run
      if (plan.arena_of[c] != Category(c)) {
        s += fmt::format("  {:<24} {:>15} {:>10} {:>12} {:>15}  (in the {} arena)\n", name, "-", "-", "-", "-",
                         category_name(plan.arena_of[c]));
        continue;
      }
      s += fmt::format("  {:<24} {:>15} {:>10.1f} {:>12.2f} {:>15}", name, with_commas(b), double(b) / (1 << 20),
                       double(b) / double(params), with_commas(without_reuse));
      if (measured) {
        s += fmt::format(" {:>15}", with_commas(measured[c]));
        total_measured += measured[c];
      }
      s += "\n";
    }
    const size_t total = host ? plan.host_bytes() : plan.total_bytes();
    s += fmt::format("  {:<24} {:>15} {:>10.1f} {:>12.2f} {:>15}", host ? "host total (page-locked)" : "total",
                     with_commas(total), double(total) / (1 << 20), double(total) / double(params),
                     with_commas(total_unshared));
    if (measured) s += fmt::format(" {:>15}", with_commas(total_measured));
    s += "\n";
  }
  return s;
}

std::string buffer_list(const MemoryPlan& plan) {
  static const char* phases[kNumPhases] = {"setup",     "micro-step",       "optimizer",
                                           "inference", "packed inference", "hidden states"};
  std::string s = fmt::format("  {:<24} {:<28} {:<16} {:>15} {:>15} {:>8} {:>8}\n", "category", "buffer", "phase",
                              "bytes", "offset", "taken", "freed");
  for (const auto& b : plan.buffers)
    s += fmt::format("  {:<24} {:<28} {:<16} {:>15} {:>15} {:>8} {:>8}\n", category_name(b.category), b.label(),
                     phases[int(b.phase)], with_commas(b.bytes), with_commas(b.offset), b.first,
                     b.last == INT64_MAX ? std::string("-") : std::to_string(b.last));
  return s;
}

}  // namespace hone::cli
