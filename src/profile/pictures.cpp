// A profile drawn: Chrome's trace format for a timeline (Perfetto, chrome://tracing) and
// an SVG of where a step's time goes.
#include <fmt/format.h>

#include <algorithm>

#include "hone/profile.h"

namespace hone {

namespace {

constexpr const char* kClassColors[kNumOpClasses] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2"};
constexpr const char* kGapColor = "#d3cfcc";

nlohmann::ordered_json complete_event(const std::string& name, const char* category, int track, double start,
                                      double seconds) {
  return {{"name", name}, {"cat", category}, {"ph", "X"},          {"pid", 1},
          {"tid", track}, {"ts", start * 1e6}, {"dur", seconds * 1e6}};
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

nlohmann::ordered_json chrome_trace(const Profile& p, const ProfileContext& ctx) {
  constexpr int kStepTrack = 1, kPhaseTrack = 2, kOpTrack = 3;
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  auto name_track = [&](int tid, const char* name) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "hone: " + ctx.run}}}});
  name_track(kStepTrack, "steps");
  name_track(kPhaseTrack, "phases");
  name_track(kOpTrack, "ops");
  for (int k = 0; k < p.steps(); ++k)
    events.push_back(complete_event(fmt::format("step {}", k + 1), "step", kStepTrack, p.step_bounds[size_t(k)],
                                    p.step_bounds[size_t(k) + 1] - p.step_bounds[size_t(k)]));
  // A phase runs from its first op to the next phase's first op (or its step's end).
  for (size_t i = 0; i < p.ops.size();) {
    size_t j = i;
    while (j < p.ops.size() && p.ops[j].phase == p.ops[i].phase) ++j;
    const double start = p.ops[i].start;
    const auto bound = std::upper_bound(p.step_bounds.begin(), p.step_bounds.end(), start);
    double end = j < p.ops.size() ? p.ops[j].start : p.step_bounds.back();
    if (bound != p.step_bounds.end()) end = std::min(end, *bound);
    events.push_back(complete_event(step_span_name(p.ops[i].phase), "phase", kPhaseTrack, start, end - start));
    i = j;
  }
  for (const TimedOp& op : p.ops) {
    nlohmann::ordered_json e = complete_event(op.name, op_class_name(op.cls), kOpTrack, op.start, op.seconds);
    nlohmann::ordered_json args = {{"phase", step_span_name(op.phase)}};
    if (op.cost.flops > 0) args["gflop"] = op.cost.flops / 1e9;
    if (op.cost.bytes > 0) args["mb"] = op.cost.bytes / 1e6;
    if (op.seconds > 0 && op.cost.flops > 0) args["tflops"] = op.cost.flops / op.seconds / 1e12;
    if (op.seconds > 0 && op.cost.bytes > 0) args["gb_per_second"] = op.cost.bytes / op.seconds / 1e9;
    e["args"] = args;
    events.push_back(e);
  }
  nlohmann::ordered_json trace;
  trace["traceEvents"] = events;
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"run", ctx.run}, {"device", ctx.device}, {"timing", ctx.timing}};
  return trace;
}

std::string profile_svg(const ProfileSummary& s, const Roofline& r, const ProfileContext& ctx) {
  const int n = std::max(1, s.steps);
  constexpr double kWidth = 960, kLeft = 130, kBarWidth = 700, kBar = 26, kRow = 40;
  std::array<double, kNumStepSpans> phase_ms{};
  double longest = 0;
  for (StepSpan p : kStepSpans) {
    phase_ms[size_t(p)] = (s.phase_total(p).seconds + s.gap_seconds[size_t(p)]) / n * 1e3;
    longest = std::max(longest, phase_ms[size_t(p)]);
  }
  const double px_per_ms = longest > 0 ? kBarWidth / longest : 0;
  double y = 30;
  std::string body;
  auto text = [&](double x, double ty, const std::string& t, const char* extra = "") {
    body += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>\n", x, ty, extra, xml_escape(t));
  };
  auto rect = [&](double x, double ry, double w, double h, const char* fill, const std::string& title) {
    body += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}</title>"
                        "</rect>\n",
                        x, ry, w, h, fill, xml_escape(title));
  };
  text(20, y, fmt::format("Operation anatomy: {}", ctx.run), " class=\"title\"");
  y += 22;
  text(20, y, fmt::format("{}: {:.2f} ms a step over {} steps", ctx.device, s.step_seconds * 1e3, s.steps));
  y += 18;
  text(20, y, ctx.timing);
  y += 36;
  text(20, y, "Where a step's time goes, by phase (ms)", " class=\"head\"");
  y += 14;
  for (StepSpan p : kStepSpans) {
    if (phase_ms[size_t(p)] <= 0) continue;
    text(20, y + kBar * 0.7, step_span_name(p));
    double x = kLeft;
    for (int c = 0; c < kNumOpClasses; ++c) {
      const double ms = s.by_phase_class[size_t(p)][size_t(c)].seconds / n * 1e3;
      if (ms <= 0) continue;
      rect(x, y, ms * px_per_ms, kBar, kClassColors[c],
           fmt::format("{} {}: {:.3f} ms", step_span_name(p), op_class_name(OpClass(c)), ms));
      x += ms * px_per_ms;
    }
    const double gap = s.gap_seconds[size_t(p)] / n * 1e3;
    if (gap > 0) rect(x, y, gap * px_per_ms, kBar, kGapColor, fmt::format("{} between ops: {:.3f} ms", step_span_name(p), gap));
    text(x + gap * px_per_ms + 6, y + kBar * 0.7, fmt::format("{:.2f}", phase_ms[size_t(p)]));
    y += kRow;
  }
  // Legend.
  double lx = kLeft;
  for (int c = 0; c <= kNumOpClasses; ++c) {
    const char* color = c < kNumOpClasses ? kClassColors[c] : kGapColor;
    const std::string name = c < kNumOpClasses ? op_class_name(OpClass(c)) : "between ops";
    rect(lx, y, 12, 12, color, name);
    text(lx + 16, y + 10, name);
    lx += 24 + 7.5 * double(name.size());
  }
  y += 44;
  text(20, y,
       fmt::format("Fraction of the roofline measured here ({}, {:.0f} GB/s), by class", flops_text(r.flops_per_second),
                   r.bytes_per_second / 1e9),
       " class=\"head\"");
  y += 14;
  for (int c = 0; c < kNumOpClasses; ++c) {
    const OpTotals t = s.class_total(OpClass(c));
    if (t.calls == 0) continue;
    const double f = std::clamp(t.roofline_fraction(), 0.0, 1.0);
    text(20, y + kBar * 0.7, op_class_name(OpClass(c)));
    rect(kLeft, y, kBarWidth * 0.6, kBar, "#eeeeee", "100%");
    rect(kLeft, y, kBarWidth * 0.6 * f, kBar, kClassColors[c], fmt::format("{:.1f}%", 100 * f));
    // The rate that bounds the class: its products' or its memory traffic's.
    const bool compute_bound = t.flops / r.flops_per_second >= t.bytes / r.bytes_per_second;
    const std::string rate = t.seconds <= 0   ? ""
                             : compute_bound ? ", " + flops_text(t.flops / t.seconds)
                                             : fmt::format(", {:.0f} GB/s", t.bytes / t.seconds / 1e9);
    const std::string label =
        fmt::format("{:.0f}% of its roofline; {:.1f}% of the step{}", 100 * f, 100 * t.seconds / n / s.step_seconds, rate);
    text(kLeft + kBarWidth * 0.6 + 8, y + kBar * 0.7, label);
    y += kRow;
  }
  y += 10;
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                     "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"sans-serif\" font-size=\"13\">\n"
                     "<style>.title {{ font-size: 17px; font-weight: bold; }} .head {{ font-weight: bold; }}</style>\n"
                     "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{}</svg>\n",
                     kWidth, y, kWidth, y, body);
}

}  // namespace hone
