// `hone profile`: the operation anatomy of a training configuration. Runs its training
// steps with every op timed on the device, after steps that warm the caches, and writes
// the table, profile.json, a Chrome trace and a picture.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/setup.h"
#include "hone/checkpoint.h"
#include "hone/distributed.h"
#include "hone/gpu_info.h"
#include "hone/profile.h"
#include "hone/trainer.h"

namespace hone::cli {

int profile_command(const TrainingArguments& requested, const ProfileOptions& o) {
  TrainingArguments a = requested;
  // Every op runs on its own, so that each can be timed; nothing but the steps runs.
  a.cuda_graphs = false;
  a.max_steps = o.skip_steps + o.profile_steps;
  a.do_eval = false;
  a.eval_strategy = "no";
  a.save_strategy = "no";
  a.load_best_model_at_end = false;
  a.report_to = "none";
  a.logging_steps = a.max_steps + 1;
  const ProcessGroup pg = process_group_from_env();
  if (pg.rank != 0 && !std::freopen("/dev/null", "w", stdout)) fail("rank {}: cannot quiet stdout", pg.rank);

  RunInputs in = prepare_inputs(a, true, false, false);
  const ModelConfig& cfg = in.model.config;
  // The steady state of a long run, whose products are timed (times_products).
  std::unique_ptr<Backend> backend = make_backend(a, false, pg.local_rank, true);
  Backend& be = *backend;
  const std::unique_ptr<Communicator> comm = make_communicator(be, pg);
  // Before the run's memory exists: the measurement takes buffers of its own.
  const Roofline roof = measure_roofline(be, compute_dtype(a, be), precision_name(a));
  TrainingRun run(a, cfg, in.seq_len, be, gradient_memory_for(a), RunPhases{true, 0}, sharding_for(a, pg));
  run.distribute(*comm);
  // An op takes as long whatever the values: random weights serve as well as trained ones.
  run.init_weights(a.seed);
  run.broadcast_weights();

  const bool gpu = be.device() == Device::CUDA;
  ProfileContext ctx;
  ctx.run = fmt::format("{}, batch {} x {}{}, {}{}, {}", in.model.name, a.per_device_train_batch_size, in.seq_len,
                        a.gradient_accumulation_steps > 1
                            ? fmt::format(" x {} accumulation", a.gradient_accumulation_steps)
                            : "",
                        precision_name(a), a.gradient_checkpointing ? ", gradient checkpointing" : "", a.optim);
  if (pg.distributed()) ctx.run += fmt::format(", rank 0 of {}", pg.world_size);
  const int threads = omp_get_max_threads();
  ctx.device = gpu ? be.name() : fmt::format("{} ({} thread{})", be.name(), threads, threads == 1 ? "" : "s");
  ctx.timing = gpu ? "GPU time between CUDA events around each op, run eagerly (no CUDA graphs)"
                   : "wall clock around each op";
  fmt::print("hone profile: {}\n  {}\n  {} update{} to warm up, then {} profiled\n", in.model.name,
             describe(cfg, run.model().layout().count()), o.skip_steps, o.skip_steps == 1 ? "" : "s",
             o.profile_steps);
  // Said rather than silently dropped: train's flags, set here, that a profile does not use.
  const TrainingArguments defaults;
  std::vector<std::string> unused;
  if (requested.max_steps > 0 || requested.num_train_epochs != defaults.num_train_epochs)
    unused.push_back("--max_steps/--num_train_epochs (--skip_steps and --profile_steps count the updates)");
  if (requested.do_eval || requested.eval_strategy != defaults.eval_strategy) unused.push_back("evaluation");
  if (requested.save_strategy != defaults.save_strategy && requested.save_strategy != "no")
    unused.push_back("--save_strategy (a profile saves nothing)");
  if (requested.report_to != defaults.report_to) unused.push_back("--report_to");
  if (!unused.empty()) fmt::print("  notice: not used by a profile: {}\n", fmt::join(unused, "; "));
  std::fflush(stdout);

  OpProfiler profiler(be);
  Profile profile;
  auto at_update = [&](int64_t done) {
    if (done == o.skip_steps)
      profiler.start();
    else if (done == o.skip_steps + o.profile_steps)
      profile = profiler.finish();
    else if (done > o.skip_steps)
      profiler.next_step();
  };
  at_update(0);
  TrainCallbacks cb;
  cb.on_step = [&](int64_t done, int64_t, const TrainerState&) { at_update(done); };
  train(run, a, TrainData{*in.train, nullptr}, ModelFiles{cfg, in.tokenizer.get()}, cb);
  if (pg.rank != 0) return 0;

  const ProfileSummary s = summarize(profile, roof);
  fmt::print("\n{}", profile_table(s, roof, ctx));
  if (gpu)
    if (const std::optional<double> peak = peak_flops(be.name(), precision_name(a)))
      fmt::print("the datasheet's dense {} peak: {:.1f} TFLOP/s (the product measured here reaches {:.0f}% of it)\n",
                 precision_name(a), *peak / 1e12, 100 * roof.flops_per_second / *peak);
  std::error_code ec;
  std::filesystem::create_directories(a.output_dir, ec);
  if (ec) fail("cannot create --output_dir {}: {}", a.output_dir, ec.message());
  const std::filesystem::path out(a.output_dir);
  write_file_atomic((out / "profile.json").string(), profile_json(s, roof, ctx).dump(2) + "\n");
  write_file_atomic((out / "profile_trace.json").string(), chrome_trace(profile, ctx).dump() + "\n");
  write_file_atomic((out / "profile.svg").string(), profile_svg(s, roof, ctx));
  fmt::print("wrote profile.json, profile_trace.json (open in https://ui.perfetto.dev or chrome://tracing) and "
             "profile.svg to {}{}\n",
             a.output_dir, gpu ? "; each op is an NVTX range for Nsight Systems (nsys profile hone profile ...)" : "");
  return 0;
}

}  // namespace hone::cli
