#include "hone/fit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "hone/error.h"
#include "hone/optimizer.h"

namespace hone {
namespace {

uint64_t planned_bytes(const TrainingArguments& a, const ModelConfig& c, int seq, Backend& be, RunPhases phases) {
  return TrainingRun::plan(a, c, seq, be, gradient_memory_for(a), phases).total_bytes();
}

// The speed model behind the ranking; its constants are measured (docs/BENCHMARKS.md,
// bert-large at 512 tokens on an H100 and an H200) and only their ratios matter:
//   - model FLOPs run at an effective rate per precision, times a batch efficiency
//     b / (b + 2) (bs4 : bs8 : bs32 measured 0.67 : 0.84 : 1 in bf16);
//   - gradient checkpointing adds the recomputed forward: a third of the step's FLOPs
//     for the full policy, the attention and element-wise part for the selective one;
//   - the optimizer streams its bytes per parameter once per update.
constexpr double kFp32FlopRate = 54e12, kTf32Speedup = 2.9, kHalfSpeedup = 7.3;
constexpr double kOptimizerBytesPerSecond = 2.5e12;

double recompute_factor(const TrainingArguments& a) {
  if (!a.gradient_checkpointing) return 1.0;
  return a.gradient_checkpointing_policy == "selective" ? 1.06 : 4.0 / 3.0;
}

// Bytes an update reads and writes per parameter: parameters, gradient and state.
double optimizer_bytes_per_param(const std::string& optim) {
  if (optim.starts_with("adamw_torch")) return 28;
  if (optim == "adafactor") return 20;
  if (optim.ends_with("8bit")) return 16;
  if (optim == "sgd") return 12;
  return 20;
}

double seconds_per_sample(const TrainingArguments& a, const ModelConfig& c, int seq) {
  const SequenceClassifier model(c);
  const int b = a.per_device_train_batch_size;
  const double rate = kFp32FlopRate * (a.bf16 || a.fp16 ? kHalfSpeedup : a.tf32 ? kTf32Speedup : 1.0);
  const double step = model.training_flops(b, seq) * recompute_factor(a) / (rate * b / (b + 2.0));
  const double update = double(model.layout().count()) * optimizer_bytes_per_param(a.optim) / kOptimizerBytesPerSecond;
  return step / b + update / (double(b) * a.gradient_accumulation_steps);
}

std::string gigabytes(uint64_t bytes) { return fmt::format("{:.1f} GB", double(bytes) / 1e9); }

}  // namespace

uint64_t plannable_bytes(uint64_t free) {
  // Each arena rounds up to the allocator's 2 MiB pages, and cuBLASLt and cuDNN create
  // some state on first use: 1% and 64 MiB keep a run that fits by plan from failing.
  const uint64_t reserve = free / 100 + (uint64_t(64) << 20);
  return free > reserve ? free - reserve : 0;
}

uint64_t parse_memory_size(const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, value);
  std::string unit(r.ptr, end);
  for (char& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> units[] = {{"", 1},      {"B", 1},       {"KB", 1e3},  {"MB", 1e6},
                                                  {"GB", 1e9},  {"TB", 1e12},   {"KIB", 1024.0}, {"MIB", 1 << 20},
                                                  {"GIB", double(1 << 30)}, {"TIB", std::ldexp(1.0, 40)}};
  if (r.ec == std::errc{} && value > 0 && std::isfinite(value))
    for (const auto& [name, scale] : units)
      if (unit == name) return uint64_t(value * scale);
  fail("memory size '{}': expected a positive number with an optional unit (B, MB, GB, MiB, GiB), such as 16GB",
       text);
}

int largest_fitting_batch(const TrainingArguments& a, const ModelConfig& c, int seq, Backend& be, RunPhases phases,
                          uint64_t budget, uint64_t* bytes) {
  // A plan grows with the batch, so the largest that fits is found by bisection.
  TrainingArguments t = a;
  auto fits = [&](int b, uint64_t* out) {
    t.per_device_train_batch_size = b;
    const uint64_t n = planned_bytes(t, c, seq, be, phases);
    if (out) *out = n;
    return n <= budget;
  };
  uint64_t at_one = 0;
  if (!fits(1, &at_one)) {
    if (bytes) *bytes = at_one;
    return 0;
  }
  int lo = 1, hi = a.per_device_train_batch_size;  // lo fits
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid, nullptr))
      lo = mid;
    else
      hi = mid - 1;
  }
  if (bytes) fits(lo, bytes);
  return lo;
}

std::string FitCandidate::methods() const {
  std::vector<std::string> parts;
  parts.push_back(args.bf16 ? "bf16" : args.fp16 ? "fp16" : args.tf32 ? "tf32" : "fp32");
  if (args.gradient_checkpointing)
    parts.push_back("checkpointing " +
                    (args.gradient_checkpointing_policy.empty() ? "full" : args.gradient_checkpointing_policy));
  parts.push_back(args.optim);
  parts.push_back(fmt::format("batch {} x {}", args.per_device_train_batch_size, args.gradient_accumulation_steps));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<FitCandidate> fitting_configurations(const TrainingArguments& a, const ModelConfig& c, int seq,
                                                 Backend& be, RunPhases phases, uint64_t budget,
                                                 bool mixed_precision) {
  const int per_update = a.per_device_train_batch_size * a.gradient_accumulation_steps;
  std::vector<std::string> optimizers = {a.optim};
  for (std::string_view o : optimizer_names())
    if ((o == "adafactor" || o == "adamw_8bit") && o != a.optim) optimizers.emplace_back(o);
  std::vector<FitCandidate> out;
  // The run's own precision, and bf16 where an fp32 run could use it.
  const bool try_bf16 = mixed_precision && !a.bf16 && !a.fp16;
  for (const char* policy : {"", "selective", "full"})
    for (bool bf16 : {false, true}) {
      if (bf16 && !try_bf16) continue;
      for (const std::string& optim : optimizers) {
        TrainingArguments t = a;
        t.gradient_checkpointing = *policy != 0;
        t.gradient_checkpointing_policy = policy;
        if (bf16) t.bf16 = true;
        t.optim = optim;
        t.optim_args.clear();
        // The largest batch dividing the samples per update that fits; accumulation makes
        // up the rest (and keeps gradients for the whole update, which the plan counts).
        for (int b = per_update; b >= 1; --b) {
          if (per_update % b != 0) continue;
          t.per_device_train_batch_size = b;
          t.gradient_accumulation_steps = per_update / b;
          const uint64_t bytes = planned_bytes(t, c, seq, be, phases);
          if (bytes > budget) continue;
          out.push_back({t, bytes, seconds_per_sample(t, c, seq)});
          break;
        }
      }
    }
  std::sort(out.begin(), out.end(),
            [](const FitCandidate& x, const FitCandidate& y) { return x.seconds_per_sample < y.seconds_per_sample; });
  for (FitCandidate& f : out) f.relative_time = f.seconds_per_sample / out.front().seconds_per_sample;
  return out;
}

std::string methods_that_fit(const TrainingArguments& a, const ModelConfig& c, int seq, Backend& be, RunPhases phases,
                             uint64_t budget, bool mixed_precision) {
  const std::vector<FitCandidate> fits = fitting_configurations(a, c, seq, be, phases, budget, mixed_precision);
  if (fits.empty())
    return "no combination of checkpointing, bf16 and a smaller optimizer state fits; a shorter --max_seq_length "
           "or a smaller model would";
  std::vector<std::string> ways;
  for (size_t i = 0; i < std::min<size_t>(3, fits.size()); ++i)
    ways.push_back(fmt::format("{} ({})", fits[i].methods(), gigabytes(fits[i].plan_bytes)));
  return fmt::format("these fit, fastest first: {}", fmt::join(ways, "; "));
}

}  // namespace hone
