// A profile as people read it (the table `hone profile` prints) and as programs read it
// (profile.json).
#include <fmt/format.h>

#include <cmath>

#include "hone/profile.h"

namespace hone {

namespace {

std::string ms_or_dash(double seconds) { return seconds > 0 ? fmt::format("{:.2f}", seconds * 1e3) : "-"; }

// A rate with three figures or so, whatever its size.
std::string figure(double x) {
  if (x >= 100) return fmt::format("{:.0f}", x);
  if (x >= 10) return fmt::format("{:.1f}", x);
  if (x >= 1) return fmt::format("{:.2f}", x);
  return x >= 0.001 ? fmt::format("{:.3f}", x) : "<0.001";
}

// "TFLOP/s  GB/s  roofline" of a total over `seconds`.
std::string rates(const OpTotals& t) {
  if (t.seconds <= 0) return fmt::format("{:>9} {:>8} {:>9}", "-", "-", "-");
  return fmt::format("{:>9} {:>8} {:>8.1f}%", t.flops > 0 ? figure(t.flops / t.seconds / 1e12) : "-",
                     t.bytes > 0 ? figure(t.bytes / t.seconds / 1e9) : "-",
                     100 * t.roofline_fraction());
}

double round_to(double x, double unit) { return std::round(x / unit) * unit; }

nlohmann::ordered_json totals_json(const OpTotals& t, int steps, double step_seconds) {
  nlohmann::ordered_json j;
  j["ms_per_step"] = round_to(t.seconds / steps * 1e3, 1e-4);
  j["share"] = round_to(step_seconds > 0 ? t.seconds / steps / step_seconds : 0, 1e-5);
  j["calls_per_step"] = double(t.calls) / steps;
  if (t.seconds > 0 && t.flops > 0) j["tflops"] = round_to(t.flops / t.seconds / 1e12, 1e-3);
  if (t.seconds > 0 && t.bytes > 0) j["gb_per_second"] = round_to(t.bytes / t.seconds / 1e9, 1e-2);
  if (t.seconds > 0) j["roofline_fraction"] = round_to(t.roofline_fraction(), 1e-4);
  return j;
}

}  // namespace

std::string flops_text(double per_second) {
  return per_second >= 1e12 ? fmt::format("{:.1f} TFLOP/s", per_second / 1e12)
                            : fmt::format("{:.1f} GFLOP/s", per_second / 1e9);
}

std::string profile_table(const ProfileSummary& s, const Roofline& r, const ProfileContext& ctx, int top_ops) {
  const int n = std::max(1, s.steps);
  const double step = s.step_seconds;
  auto share = [&](double seconds) { return step > 0 ? fmt::format("{:.1f}%", 100 * seconds / n / step) : "-"; };
  std::string out = fmt::format("operation anatomy of {} steps: {}, {:.2f} ms a step\n", s.steps, ctx.run, step * 1e3);
  out += fmt::format("  device: {}; timed as {}\n", ctx.device, ctx.timing);
  out += fmt::format("  roofline measured here: {} ({}), {:.0f} GB/s ({})\n\n", flops_text(r.flops_per_second),
                     r.product, r.bytes_per_second / 1e9, r.copy);
  out += fmt::format("{:<15} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>8} {:>9}\n", "ms per step", "forward",
                     "backward", "optimizer", "other", "total", "share", "TFLOP/s", "GB/s", "roofline");
  auto row = [&](const char* name, const std::array<double, kNumStepSpans>& by_phase, const OpTotals* t) {
    double total = 0;
    std::string cells;
    for (StepSpan p : kStepSpans) {
      total += by_phase[size_t(p)];
      cells += fmt::format(" {:>9}", ms_or_dash(by_phase[size_t(p)] / n));
    }
    // Gaps and whole steps have no rates: dashes.
    return fmt::format("{:<15}{} {:>9.2f} {:>7} {}\n", name, cells, total / n * 1e3, share(total),
                       rates(t ? *t : OpTotals{}));
  };
  for (int c = 0; c < kNumOpClasses; ++c) {
    std::array<double, kNumStepSpans> by_phase{};
    for (StepSpan p : kStepSpans) by_phase[size_t(p)] = s.by_phase_class[size_t(p)][size_t(c)].seconds;
    const OpTotals t = s.class_total(OpClass(c));
    if (t.calls > 0) out += row(op_class_name(OpClass(c)), by_phase, &t);
  }
  out += row("between ops", s.gap_seconds, nullptr);
  std::array<double, kNumStepSpans> step_by_phase{};
  for (StepSpan p : kStepSpans) step_by_phase[size_t(p)] = s.phase_total(p).seconds + s.gap_seconds[size_t(p)];
  out += row("step", step_by_phase, nullptr);
  out += fmt::format("\n{:<30} {:<9} {:<14} {:>6} {:>8} {:>7} {}\n", "op (most time first)", "phase", "class",
                     "calls", "ms", "share", fmt::format("{:>9} {:>8} {:>9}", "TFLOP/s", "GB/s", "roofline"));
  int shown = 0;
  for (const auto& o : s.by_op) {
    if (shown++ == top_ops) break;
    out += fmt::format("{:<30} {:<9} {:<14} {:>6.0f} {:>8.2f} {:>7} {}\n", o.name, step_span_name(o.phase),
                       op_class_name(o.cls), double(o.totals.calls) / n, o.totals.seconds / n * 1e3,
                       share(o.totals.seconds), rates(o.totals));
  }
  if (int(s.by_op.size()) > top_ops) out += fmt::format("({} more in profile.json)\n", s.by_op.size() - size_t(top_ops));
  return out;
}

nlohmann::ordered_json profile_json(const ProfileSummary& s, const Roofline& r, const ProfileContext& ctx) {
  const int n = std::max(1, s.steps);
  nlohmann::ordered_json j;
  j["run"] = ctx.run;
  j["device"] = ctx.device;
  j["timing"] = ctx.timing;
  j["steps"] = s.steps;
  j["ms_per_step"] = round_to(s.step_seconds * 1e3, 1e-4);
  j["roofline"] = {{"tflops", round_to(r.flops_per_second / 1e12, 1e-3)},
                   {"product", r.product},
                   {"gb_per_second", round_to(r.bytes_per_second / 1e9, 1e-2)},
                   {"copy", r.copy}};
  nlohmann::ordered_json phases;
  for (StepSpan p : kStepSpans) {
    OpTotals t = s.phase_total(p);
    t.seconds += s.gap_seconds[size_t(p)];
    phases[step_span_name(p)] = {{"ms_per_step", round_to(t.seconds / n * 1e3, 1e-4)},
                                 {"between_ops_ms_per_step", round_to(s.gap_seconds[size_t(p)] / n * 1e3, 1e-4)}};
  }
  j["phases"] = phases;
  nlohmann::ordered_json classes;
  for (int c = 0; c < kNumOpClasses; ++c) {
    nlohmann::ordered_json e = totals_json(s.class_total(OpClass(c)), n, s.step_seconds);
    nlohmann::ordered_json by_phase;
    for (StepSpan p : kStepSpans)
      by_phase[step_span_name(p)] = round_to(s.by_phase_class[size_t(p)][size_t(c)].seconds / n * 1e3, 1e-4);
    e["ms_per_step_by_phase"] = by_phase;
    classes[op_class_name(OpClass(c))] = e;
  }
  double gaps = 0;
  for (double g : s.gap_seconds) gaps += g;
  classes["between ops"] = {{"ms_per_step", round_to(gaps / n * 1e3, 1e-4)},
                            {"share", round_to(s.step_seconds > 0 ? gaps / n / s.step_seconds : 0, 1e-5)}};
  j["classes"] = classes;
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (const auto& o : s.by_op) {
    nlohmann::ordered_json e;
    e["op"] = o.name;
    e["phase"] = step_span_name(o.phase);
    e["class"] = op_class_name(o.cls);
    const nlohmann::ordered_json totals = totals_json(o.totals, n, s.step_seconds);
    for (const auto& [k, v] : totals.items()) e[k] = v;
    ops.push_back(e);
  }
  j["ops"] = ops;
  return j;
}

}  // namespace hone
