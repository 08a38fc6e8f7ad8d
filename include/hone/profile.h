#pragma once
// The operation anatomy of a training step (`hone profile`): every op the ops.h wrappers
// dispatch, timed on the backend's stream, with its class (the seed's contractions,
// normalizations and element-wise operators, plus attention, the optimizer and copies),
// its phase (forward, backward, optimizer) and the work it does, against a roofline
// measured on the same device.
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "hone/backend.h"

namespace hone {

enum class OpClass : uint8_t { Contraction, Attention, Normalization, Elementwise, Optimizer, Copy };
constexpr int kNumOpClasses = 6;
const char* op_class_name(OpClass c);  // "contractions", "attention", ...
const char* step_span_name(StepSpan s);  // "forward", "backward", "optimizer", "other"
constexpr StepSpan kStepSpans[kNumStepSpans] = {StepSpan::Forward, StepSpan::Backward, StepSpan::Optimizer,
                                                StepSpan::Other};

// The work of one op: model FLOPs (what the op must compute, a recomputation inside it not
// counted) and the bytes it must move at least (each input read and output written once).
struct OpCost {
  double flops = 0, bytes = 0;
};

// One op as it ran: seconds since the first profiled step began.
struct TimedOp {
  const char* name;  // the ops.h function
  OpClass cls;
  StepSpan phase;
  OpCost cost;
  double start, seconds;
};

struct Profile {
  std::vector<TimedOp> ops;
  std::vector<double> step_bounds;  // step k ran from step_bounds[k] to step_bounds[k + 1]
  int steps() const { return step_bounds.empty() ? 0 : int(step_bounds.size()) - 1; }
  double seconds() const { return step_bounds.empty() ? 0 : step_bounds.back() - step_bounds.front(); }
};

// Records what the ops wrappers dispatch while a backend points at it (Backend::profiler).
// Each op is bracketed by two stamps of the backend's clock (events on a GPU's stream), so
// the time between one op's end and the next one's start (host work, collectives, a stream
// waiting for the host) is measured too, and everything adds up to the steps' time.
class OpProfiler {
 public:
  explicit OpProfiler(Backend& be) : be_(be) {}
  // Attaches to the backend and starts the first step.
  void start();
  // Ends the step running and starts the next.
  void next_step();
  // Ends the last step, detaches, waits for the device and returns what ran.
  Profile finish();

  void set_phase(StepSpan s) { phase_ = s; }
  // Called by the ops wrappers around a dispatch; an op that another op's wrapper calls
  // is part of the outer op.
  void begin_op(const char* name, OpClass c, const OpCost& cost);
  void end_op();

 private:
  struct Pending {
    const char* name;
    OpClass cls;
    StepSpan phase;
    OpCost cost;
    int64_t begin;  // stamp index
  };
  Backend& be_;
  StepSpan phase_ = StepSpan::Other;
  int depth_ = 0;
  int64_t stamps_ = 0;
  std::vector<Pending> ops_;
  std::vector<int64_t> bounds_;  // stamp indices of step boundaries
  int64_t stamp();
};

// What the device can do at best, measured on it by the backend's own ops: a large square
// product in the run's compute dtype (`precision` names it as the run does: "tf32"...)
// and a large copy.
struct Roofline {
  double flops_per_second = 0, bytes_per_second = 0;
  std::string product, copy;  // what was timed, e.g. "bf16 8192^3 product"
  // The least time an op's work takes on this device.
  double bound_seconds(const OpCost& c) const;
};
Roofline measure_roofline(Backend& be, DType compute, const std::string& precision);

// Totals of a set of ops (per step when divided by the steps).
struct OpTotals {
  double seconds = 0, flops = 0, bytes = 0, bound_seconds = 0;
  int64_t calls = 0;
  void add(const TimedOp& op, const Roofline& r);
  double roofline_fraction() const { return seconds > 0 ? bound_seconds / seconds : 0; }
};

// The anatomy: per phase and class, the gaps between ops per phase, and per op name.
struct ProfileSummary {
  int steps = 0;
  double step_seconds = 0;  // mean
  std::array<std::array<OpTotals, kNumOpClasses>, kNumStepSpans> by_phase_class{};
  std::array<double, kNumStepSpans> gap_seconds{};  // between ops, by the phase of the op after
  struct Named {
    std::string name;
    StepSpan phase;
    OpClass cls;
    OpTotals totals;
  };
  std::vector<Named> by_op;  // by name and phase, most time first
  OpTotals phase_total(StepSpan s) const;
  OpTotals class_total(OpClass c) const;
};
ProfileSummary summarize(const Profile& p, const Roofline& r);

// What describes the run in the outputs ("bert-large-uncased, batch 4 x 512, bf16, ...").
struct ProfileContext {
  std::string run, device, timing;
};

// "584.5 TFLOP/s", or on a slower device "38.2 GFLOP/s".
std::string flops_text(double per_second);
// The table `hone profile` prints.
std::string profile_table(const ProfileSummary& s, const Roofline& r, const ProfileContext& ctx, int top_ops = 12);
// The summary as JSON (profile.json).
nlohmann::ordered_json profile_json(const ProfileSummary& s, const Roofline& r, const ProfileContext& ctx);
// Every op as a complete event of Chrome's trace format, which Perfetto and chrome://tracing
// open: one track of ops, one of phases.
nlohmann::ordered_json chrome_trace(const Profile& p, const ProfileContext& ctx);
// A picture of the anatomy: each phase's time split by class, and each class's fraction
// of its roofline.
std::string profile_svg(const ProfileSummary& s, const Roofline& r, const ProfileContext& ctx);

}  // namespace hone
