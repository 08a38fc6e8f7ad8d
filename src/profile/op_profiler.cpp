// Recording the ops of profiled steps, and summing them by phase, class and name.
#include <algorithm>
#include <map>
#include <tuple>

#include "hone/error.h"
#include "hone/profile.h"

namespace hone {

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Contraction: return "contractions";
    case OpClass::Attention: return "attention";
    case OpClass::Normalization: return "normalizations";
    case OpClass::Elementwise: return "element-wise";
    case OpClass::Optimizer: return "optimizer";
    case OpClass::Copy: return "copies";
  }
  return "?";
}

const char* step_span_name(StepSpan s) {
  switch (s) {
    case StepSpan::Forward: return "forward";
    case StepSpan::Backward: return "backward";
    case StepSpan::Optimizer: return "optimizer";
    case StepSpan::Other: return "other";
  }
  return "?";
}

int64_t OpProfiler::stamp() {
  be_.stamp();
  return stamps_++;
}

void OpProfiler::start() {
  HONE_CHECK(!be_.profiler, "a backend takes one profiler at a time");
  be_.profiler = this;
  bounds_.push_back(stamp());
}

void OpProfiler::next_step() {
  HONE_CHECK(be_.profiler == this && depth_ == 0, "next_step outside profiling or inside an op");
  bounds_.push_back(stamp());
}

void OpProfiler::begin_op(const char* name, OpClass c, const OpCost& cost) {
  if (depth_++ > 0) return;
  be_.push_range(name);
  ops_.push_back({name, c, phase_, cost, stamp()});
}

void OpProfiler::end_op() {
  if (--depth_ > 0) return;
  stamp();  // index begin + 1
  be_.pop_range();
}

Profile OpProfiler::finish() {
  HONE_CHECK(be_.profiler == this && depth_ == 0, "finish outside profiling or inside an op");
  bounds_.push_back(stamp());
  be_.profiler = nullptr;
  const std::vector<double> t = be_.take_stamps();
  HONE_CHECK(int64_t(t.size()) == stamps_, "the backend returned {} stamps of {}", t.size(), stamps_);
  Profile p;
  const double t0 = t[size_t(bounds_.front())];
  for (int64_t b : bounds_) p.step_bounds.push_back(t[size_t(b)] - t0);
  for (const Pending& o : ops_)
    p.ops.push_back({o.name, o.cls, o.phase, o.cost, t[size_t(o.begin)] - t0,
                     t[size_t(o.begin + 1)] - t[size_t(o.begin)]});
  ops_.clear();
  bounds_.clear();
  stamps_ = 0;
  return p;
}

double Roofline::bound_seconds(const OpCost& c) const {
  return std::max(flops_per_second > 0 ? c.flops / flops_per_second : 0.0,
                  bytes_per_second > 0 ? c.bytes / bytes_per_second : 0.0);
}

void OpTotals::add(const TimedOp& op, const Roofline& r) {
  seconds += op.seconds;
  flops += op.cost.flops;
  bytes += op.cost.bytes;
  bound_seconds += r.bound_seconds(op.cost);
  ++calls;
}

namespace {

void merge(OpTotals& into, const OpTotals& t) {
  into.seconds += t.seconds;
  into.flops += t.flops;
  into.bytes += t.bytes;
  into.bound_seconds += t.bound_seconds;
  into.calls += t.calls;
}

}  // namespace

OpTotals ProfileSummary::phase_total(StepSpan s) const {
  OpTotals t;
  for (const OpTotals& c : by_phase_class[size_t(s)]) merge(t, c);
  return t;
}

OpTotals ProfileSummary::class_total(OpClass c) const {
  OpTotals t;
  for (const auto& phase : by_phase_class) merge(t, phase[size_t(c)]);
  return t;
}

ProfileSummary summarize(const Profile& p, const Roofline& r) {
  ProfileSummary s;
  s.steps = p.steps();
  if (s.steps == 0) return s;
  s.step_seconds = p.seconds() / s.steps;
  std::map<std::tuple<std::string, StepSpan>, size_t> index;
  // Ops and gaps in order: a gap counts in the phase of the op after it (the last step's
  // tail, in the last op's).
  size_t next = 0;
  for (int k = 0; k < s.steps; ++k) {
    double cursor = p.step_bounds[size_t(k)];
    StepSpan phase = StepSpan::Other;
    for (; next < p.ops.size() && p.ops[next].start < p.step_bounds[size_t(k) + 1]; ++next) {
      const TimedOp& op = p.ops[next];
      phase = op.phase;
      s.gap_seconds[size_t(phase)] += op.start - cursor;
      cursor = op.start + op.seconds;
      s.by_phase_class[size_t(phase)][size_t(op.cls)].add(op, r);
      auto [it, fresh] = index.try_emplace({op.name, op.phase}, s.by_op.size());
      if (fresh) s.by_op.push_back({op.name, op.phase, op.cls, {}});
      s.by_op[it->second].totals.add(op, r);
    }
    s.gap_seconds[size_t(phase)] += p.step_bounds[size_t(k) + 1] - cursor;
  }
  std::stable_sort(s.by_op.begin(), s.by_op.end(),
                   [](const auto& a, const auto& b) { return a.totals.seconds > b.totals.seconds; });
  return s;
}

}  // namespace hone
