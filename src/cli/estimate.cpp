// `hone estimate`: the memory plan of a run, from the same code that the run executes.
#include <fmt/format.h>

#include <optional>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/setup.h"
#include "hone/gpu_info.h"
#include "hone/trainer.h"

namespace hone::cli {

int estimate_command(const TrainingArguments& a, bool list_buffers) {
  constexpr double kMiB = 1 << 20;
  const bool evaluates = a.do_eval || a.eval_strategy != "no";
  RunInputs in = prepare_inputs(a, true, evaluates, false);
  std::unique_ptr<Backend> be = make_backend(a, true);
  MemoryPlan plan = TrainingRun::plan(a, in.model.config, in.seq_len, *be, gradient_memory_for(a),
                                      RunPhases{true, in.eval ? a.per_device_eval_batch_size : 0});
  const int64_t params = ParamLayout(in.model.config).count();
  fmt::print("hone estimate: {}\n  {}\n", in.model.name, describe(in.model.config, params));
  fmt::print("  run: batch {} x {} tokens, {}, {}, device {}\n", a.per_device_train_batch_size, in.seq_len,
             precision_name(a), a.optim, be->name());
  fmt::print("parameters: {}\n", with_commas(uint64_t(params)));
  fmt::print("memory plan (buffers whose lifetimes do not overlap share bytes):\n{}", memory_table(plan, params));
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
  return 0;
}

}  // namespace hone::cli
