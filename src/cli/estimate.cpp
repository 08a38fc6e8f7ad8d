// `hone estimate`: the memory plan of a run, from the same code that the run executes.
#include <fmt/format.h>

#include <optional>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/setup.h"
#include "hone/cuda.h"
#include "hone/fit.h"
#include "hone/gpu_info.h"
#include "hone/trainer.h"

namespace hone::cli {

namespace {

// The configurations that fit `budget_text`, fastest first, as a table.
void print_fitting(const TrainingArguments& a, const RunInputs& in, Backend& be, RunPhases phases,
                   const std::string& budget_text) {
  constexpr double kMiB = 1 << 20;
  const std::optional<GpuMemory> m = be.device() == Device::CUDA ? gpu_memory(0) : std::nullopt;
  uint64_t budget = 0;
  std::string source;
  if (budget_text == "gpu") {
    if (!m) fail("--memory_budget gpu: no GPU memory to measure on the {} backend; give a size such as 16GB", be.name());
    budget = m->free;
    source = fmt::format("the GPU's free memory, {:.0f} MB", double(m->free) / kMiB);
  } else {
    const uint64_t card = parse_memory_size(budget_text);
    // This process has just created the context and libraries: what they take is measured.
    const uint64_t context = m && m->process_known ? m->process_used : 0;
    if (context >= card) fail("--memory_budget {}: less than the CUDA context alone ({:.0f} MB)", budget_text,
                              double(context) / kMiB);
    budget = card - context;
    source = context ? fmt::format("{} less the CUDA context and libraries ({:.0f} MB, measured)", budget_text,
                                   double(context) / kMiB)
                     : fmt::format("{} for the plan (add the CUDA context and libraries, ~500 MB, on a GPU)",
                                   budget_text);
  }
  // Without a GPU here, the card asked about is taken to run bf16 (every GPU since Ampere).
  const bool bf16 = be.device() != Device::CUDA || mixed_precision_available(nullptr);
  const std::vector<FitCandidate> fits =
      fitting_configurations(a, in.model.config, in.seq_len, be, phases, plannable_bytes(budget), bf16);
  fmt::print("configurations with {} samples per update that fit {}, fastest first (time per sample from hone's "
             "speed model, relative to the first):\n",
             a.per_device_train_batch_size * a.gradient_accumulation_steps, source);
  if (fits.empty()) {
    fmt::print("  none: not even batch 1 fits with checkpointing, bf16 and a smaller optimizer state; a shorter "
               "--max_seq_length or a smaller model would\n");
    return;
  }
  for (const FitCandidate& f : fits)
    fmt::print("  {:>5.2f}x  {:>8.0f} MB  {}\n", f.relative_time, double(f.plan_bytes) / kMiB, f.methods());
}

}  // namespace

int estimate_command(const TrainingArguments& a, bool list_buffers, const std::string& memory_budget,
                     int world_size) {
  constexpr double kMiB = 1 << 20;
  if (world_size < 1) fail("--world_size {}: at least 1", world_size);
  const bool evaluates = a.do_eval || a.eval_strategy != "no";
  RunInputs in = prepare_inputs(a, true, evaluates, false);
  std::unique_ptr<Backend> be = make_backend(a, true);
  const RunPhases phases{true, in.eval ? a.per_device_eval_batch_size : 0};
  auto plan_of_rank = [&](int rank) {
    return TrainingRun::plan(a, in.model.config, in.seq_len, *be, gradient_memory_for(a), phases,
                             Sharding{world_size, rank, a.zero_stage});
  };
  MemoryPlan plan = plan_of_rank(0);
  const int64_t params = ParamLayout(in.model.config).count();
  fmt::print("hone estimate: {}\n  {}\n", in.model.name, describe(in.model.config, params));
  fmt::print("  run: batch {} x {} tokens, {}, {}, device {}\n", a.per_device_train_batch_size, in.seq_len,
             precision_name(a), a.optim, be->name());
  fmt::print("parameters: {}\n", with_commas(uint64_t(params)));
  if (world_size > 1)
    fmt::print("  data parallel: {} ranks, ZeRO stage {}; the plan below is rank 0's\n", world_size, a.zero_stage);
  fmt::print("memory plan (buffers whose lifetimes do not overlap share bytes):\n{}", memory_table(plan, params));
  if (world_size > 1) {
    // Shards are whole parameter groups, so ranks differ a little; NCCL's own buffers come on top.
    fmt::print("per rank (planned; NCCL's communicator buffers are not in the plan):\n");
    for (int r = 0; r < world_size; ++r) {
      const MemoryPlan p = r == 0 ? plan : plan_of_rank(r);
      fmt::print("  rank {}: {:>10.1f} MiB, of which optimizer state {:.1f} MiB, master weights {:.1f} MiB, gradients "
                 "{:.1f} MiB\n",
                 r, double(p.total_bytes()) / kMiB, double(p.category_bytes[size_t(Category::OptimizerState)]) / kMiB,
                 double(p.category_bytes[size_t(Category::MasterWeights)]) / kMiB,
                 double(p.category_bytes[size_t(Category::Gradients)]) / kMiB);
    }
  }
  if (list_buffers) fmt::print("buffers:\n{}", buffer_list(plan));
  if (be->device() == Device::CUDA) {
    // The context and libraries are measured, not guessed: this process has just created them.
    std::optional<GpuMemory> m = gpu_memory(0);
    if (m && m->process_known)
      fmt::print("predicted GPU memory of the run (NVML, this process): {:.0f} MB = CUDA context and libraries "
                 "{:.0f} MB + plan {:.0f} MB\n",
                 double(m->process_used + plan.total_bytes()) / kMiB, double(m->process_used) / kMiB,
                 double(plan.total_bytes()) / kMiB);
    else if (m)
      fmt::print("predicted GPU memory of the run: plan {:.0f} MB + CUDA context and libraries (unknown: {})\n",
                 double(plan.total_bytes()) / kMiB, m->source);
  }
  if (!memory_budget.empty()) print_fitting(a, in, *be, phases, memory_budget);
  return 0;
}

}  // namespace hone::cli
