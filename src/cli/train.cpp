// `hone train`: the run, its logs (console, JSONL, TensorBoard), checkpoints, the final
// model directory and the memory anatomy.
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "cli/setup.h"
#include "cli/stop_signals.h"
#include "cli/timeline.h"
#include "hone/checkpoint.h"
#include "hone/cuda.h"
#include "hone/deepspeed.h"
#include "hone/fit.h"
#include "hone/gpu_info.h"
#include "hone/safetensors.h"
#include "hone/tensorboard.h"
#include "hone/trainer.h"

namespace hone::cli {
namespace {
namespace fs = std::filesystem;

constexpr double kMiB = 1 << 20;

// What the seed notebook's print_gpu_utilization prints (device-wide, NVML).
std::optional<GpuMemory> print_gpu_memory(const Backend& be, int gpu, const char* when) {
  if (be.device() != Device::CUDA) return std::nullopt;
  std::optional<GpuMemory> m = gpu_memory(gpu);
  if (m) fmt::print("GPU memory occupied: {} MB. ({})\n", m->used >> 20, when);
  std::fflush(stdout);
  return m;
}

// Peak resident memory of this process (VmHWM), in bytes; 0 where /proc is absent.
size_t peak_rss() {
  std::ifstream f("/proc/self/status");
  std::string key;
  size_t kb = 0;
  while (f >> key)
    if (key == "VmHWM:" && f >> kb) return kb * 1024;
  return 0;
}

// Trainer's default logging_dir: output_dir/runs/<Mon DD_HH-MM-SS>_<host>.
std::string default_logging_dir(const std::string& output_dir) {
  char stamp[32], host[256] = "localhost";
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", std::localtime(&now));
  gethostname(host, sizeof host - 1);
  return (fs::path(output_dir) / "runs" / (std::string(stamp) + "_" + host)).string();
}

// TensorBoardCallback's tags: eval_x -> eval/x, anything else -> train/x.
void log_scalars(TensorBoardWriter& tb, const nlohmann::ordered_json& e) {
  const int64_t step = e.value("step", int64_t(0));
  for (const auto& [k, v] : e.items()) {
    if (k == "step" || !v.is_number()) continue;
    const std::string tag = k.starts_with("eval_") ? "eval/" + k.substr(5) : "train/" + k;
    tb.add_scalar(tag, v.get<double>(), step);
  }
  tb.flush();
}

// Console lines as Trainer prints them: rounded, without the step.
std::string shown(const nlohmann::ordered_json& e) {
  nlohmann::ordered_json s;
  for (const auto& [k, v] : e.items()) {
    if (k == "step") continue;
    if (k == "epoch")
      s[k] = std::round(v.get<double>() * 100) / 100;
    else if (k == "loss" || k.ends_with("_loss") || k.starts_with("eval_"))
      s[k] = v.is_number() ? nlohmann::ordered_json(std::round(v.get<double>() * 1e4) / 1e4) : v;
    else
      s[k] = v;
  }
  return python_dict(s);
}

}  // namespace

// On a GPU, the batch the run trains with: under --auto_find_batch_size the largest up to
// the requested one whose plan fits the free memory; otherwise the requested one, with a
// clear error before anything is allocated when its plan cannot fit.
int fitted_batch(const TrainingArguments& a, const ModelConfig& cfg, int seq, Backend& be, RunPhases phases, int gpu) {
  const std::optional<GpuMemory> m = be.device() == Device::CUDA ? gpu_memory(gpu) : std::nullopt;
  if (!m) {
    if (a.auto_find_batch_size)
      fmt::print("notice: --auto_find_batch_size sizes the batch for GPU memory; on the {} backend the requested "
                 "batch of {} is used\n", be.name(), a.per_device_train_batch_size);
    return a.per_device_train_batch_size;
  }
  constexpr double kMB = 1 << 20;
  const uint64_t budget = plannable_bytes(m->free);
  const bool half_ok = mixed_precision_available(nullptr);
  uint64_t bytes = 0;
  if (!a.auto_find_batch_size) {
    bytes = TrainingRun::plan(a, cfg, seq, be, gradient_memory_for(a), phases).total_bytes();
    if (bytes <= m->free) return a.per_device_train_batch_size;
    fail("the run's memory plan needs {:.0f} MB, {:.0f} MB more than the {:.0f} MB free on the GPU; {} "
         "(--auto_find_batch_size picks the largest batch that fits)",
         double(bytes) / kMB, double(bytes - m->free) / kMB, double(m->free) / kMB,
         methods_that_fit(a, cfg, seq, be, phases, budget, half_ok));
  }
  const int b = largest_fitting_batch(a, cfg, seq, be, phases, budget, &bytes);
  if (b == 0)
    fail("--auto_find_batch_size: even batch 1 needs {:.0f} MB, {:.0f} MB more than the {:.0f} MB the GPU has free "
         "(less a reserve); {}",
         double(bytes) / kMB, double(bytes - std::min(bytes, budget)) / kMB, double(m->free) / kMB,
         methods_that_fit(a, cfg, seq, be, phases, budget, half_ok));
  fmt::print("auto_find_batch_size: batch {} of the requested {} fits ({:.0f} MB planned, {:.0f} MB free)\n", b,
             a.per_device_train_batch_size, double(bytes) / kMB, double(m->free) / kMB);
  return b;
}

int train_command(const TrainingArguments& requested) {
  Timeline timeline;
  TrainingArguments a = requested;  // the batch may change to fit
  // Several processes (hone launch, torchrun, mpirun, srun): one GPU each, its local rank's.
  // Rank 0 prints and writes the output directory; the others print only errors.
  const ProcessGroup pg = process_group_from_env();
  const bool main_process = pg.rank == 0;
  if (!main_process && !std::freopen("/dev/null", "w", stdout)) fail("rank {}: cannot quiet stdout", pg.rank);
  const int gpu = pg.local_rank;
  std::optional<GpuMemory> at_start = wants_gpu(a) ? gpu_memory(gpu) : std::nullopt;
  if (at_start) fmt::print("GPU memory occupied: {} MB. (start)\n", at_start->used >> 20);
  const bool evaluates = a.do_eval || a.eval_strategy != "no";
  // The CUDA context and cuBLASLt's setup on another thread while the inputs are read:
  // otherwise the first step waits for the latter (0.10-0.13 s of bert-large's).
  std::future<void> prepared = prepare_gpu(a, gpu, PreparedWork::Training);
  RunInputs in = prepare_inputs(a, true, evaluates, false);
  timeline.mark("inputs");
  if (prepared.valid()) prepared.get();
  const ModelConfig& cfg = in.model.config;
  std::unique_ptr<Backend> backend =
      make_backend(a, false, gpu, times_products(a, in.train->size(), in.seq_len, pg.world_size));
  Backend& be = *backend;
  timeline.mark(be.device() == Device::CUDA ? "cuda_context" : "backend");
  const std::unique_ptr<Communicator> comm = make_communicator(be, pg);
  if (pg.distributed()) timeline.mark("communicator");
  std::optional<GpuMemory> after_context = print_gpu_memory(be, gpu, "after the CUDA context and libraries");

  const RunPhases phases{true, in.eval ? a.per_device_eval_batch_size : 0};
  a.per_device_train_batch_size = fitted_batch(a, cfg, in.seq_len, be, phases, gpu);
  if (a.zero_stage > 0 && !pg.distributed() && !a.offload_optimizer)
    fmt::print("notice: ZeRO stage {} shares the optimizer state out among data-parallel ranks; one process keeps "
               "it all (start several with hone launch, torchrun or mpirun)\n", a.zero_stage);
  TrainingRun run(a, cfg, in.seq_len, be, gradient_memory_for(a), phases, sharding_for(a, pg));
  run.distribute(*comm);
  timeline.mark("memory_plan");
  const ParamLayout& layout = run.model().layout();
  fmt::print("hone train: {}\n  {}\n", in.model.name, describe(cfg, layout.count()));
  // Staging for loading, allocated only then: its 4 bytes a parameter cost time to touch.
  std::unique_ptr<float[]> host;
  if (in.model.weights_path.empty()) {
    run.init_weights(a.seed);
    timeline.mark("weights_init");
    fmt::print("notice: {} is a built-in configuration: its weights are random (seed {}), since hone downloads "
               "nothing. Pass a directory with config.json and model.safetensors for pretrained weights.\n",
               in.model.name, a.seed);
  } else {
    host = std::make_unique_for_overwrite<float[]>(size_t(layout.count()));
    LoadReport r = load_weights(in.model.weights_path, cfg, layout, host.get(), a.seed, a.ignore_mismatched_sizes);
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
      return "[" + s + "]";
    };
    if (!r.mismatched.empty())
      fmt::print("notice: of another shape in {}, so initialised anew: {}\n", in.model.weights_path,
                 list(r.mismatched));
    if (r.initialized.size() > r.mismatched.size())
      fmt::print("notice: newly initialised, not in {}: {}\n", in.model.weights_path, list(r.initialized));
    if (!r.unused.empty()) fmt::print("notice: unused tensors of {}: {}\n", in.model.weights_path, list(r.unused));
    timeline.mark("weights_load");
    run.write_weights(host.get());
    timeline.mark("weights_upload");
  }
  run.broadcast_weights();  // as DDP starts: every rank from rank 0's weights
  std::optional<GpuMemory> after_setup = print_gpu_memory(be, gpu, "after the model and every planned buffer");
  const StepCounts sc = count_steps(a, in.train->size(), pg.world_size);
  const std::string where = be.device() == Device::CUDA
                                ? fmt::format("{}, {}{}", be.name(), precision_name(a),
                                              a.bf16 || a.fp16 ? " mixed precision (fp32 master weights)" : "")
                                : fmt::format("{} ({} threads{})", be.name(), omp_get_max_threads(),
                                              a.bf16 ? ", bf16 products, fp32 otherwise" : "");
  fmt::print("  data: {}\n", in.train->description());
  if (in.eval) fmt::print("  evaluation: {}\n", in.eval->description());
  if (!in.labels.regression && in.tokenizer) fmt::print("  labels: {}\n", fmt::join(in.labels.names, ", "));
  fmt::print("  device: {}; batch {} x {} accumulation{}, {} updates over {} epoch(s)\n", where,
             a.per_device_train_batch_size, a.gradient_accumulation_steps,
             pg.distributed() ? fmt::format(" x {} ranks (data parallel{}, {}, started by {})", pg.world_size,
                                            a.zero_stage > 0 ? fmt::format(", ZeRO stage {}", a.zero_stage) : "",
                                            comm->name(), pg.launcher)
                              : "",
             sc.total_updates, sc.epochs);
  if (const auto& ds = a.deepspeed_config) {
    fmt::print("  DeepSpeed {}: ZeRO stage {}{}{}{}\n", ds->path, ds->zero_stage,
               ds->optimizer_type.empty() ? "" : ", its AdamW over all parameters in one group",
               ds->scheduler ? ", its " + ds->scheduler->type + " schedule" : "",
               ds->no_effect.empty() ? "" : fmt::format("; no effect on one GPU: {}", fmt::join(ds->no_effect, ", ")));
  }
  if (a.offload_optimizer)
    fmt::print("  optimizer offloaded: master weights, gradients for the update and optimizer state in {:.1f} MiB of "
               "page-locked host memory, updated on the CPU ({} threads)\n",
               double(run.memory().plan().host_bytes()) / (1 << 20), omp_get_max_threads());
  std::fflush(stdout);

  std::error_code ec;
  fs::create_directories(a.output_dir, ec);
  if (ec) fail("cannot create --output_dir {}: {}", a.output_dir, ec.message());
  for (const StaleTemporary& t : remove_stale_temporaries(a.output_dir))
    fmt::print("notice: {}\n", t.describe());
  const std::string log_path = (fs::path(a.output_dir) / "trainer_log.jsonl").string();
  // A resumed run continues the log of the run it resumes; a new run keeps an earlier run's
  // log under a numbered name, unless told to overwrite it.
  if (main_process && a.resume_from_checkpoint.empty() && fs::file_size(log_path, ec) > 0 && !ec) {
    if (a.overwrite_output_dir) {
      fmt::print("notice: replacing the earlier run's {} (--overwrite_output_dir)\n", log_path);
    } else {
      std::string kept;
      for (int n = 1; kept.empty() || fs::exists(kept); ++n)
        kept = (fs::path(a.output_dir) / fmt::format("trainer_log.{}.jsonl", n)).string();
      fs::rename(log_path, kept, ec);
      if (ec) fail("cannot keep the earlier run's {} as {}: {}", log_path, kept, ec.message());
      fmt::print("notice: kept the earlier run's log as {} (--overwrite_output_dir replaces it)\n", kept);
    }
  }
  ec.clear();
  std::FILE* log = std::fopen(main_process ? log_path.c_str() : "/dev/null",
                              a.resume_from_checkpoint.empty() ? "w" : "a");
  if (!log) fail("cannot write {}", log_path);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_closer(log, std::fclose);
  std::unique_ptr<TensorBoardWriter> tb;
  if (main_process && (a.report_to == "tensorboard" || a.report_to == "all")) {
    tb = std::make_unique<TensorBoardWriter>(a.logging_dir.empty() ? default_logging_dir(a.output_dir)
                                                                   : a.logging_dir);
    tb->add_text("args", to_json(a).dump(2), 0);
    fmt::print("  TensorBoard: {}\n", tb->path());
  }

  ProgressBar bar(!a.disable_tqdm);
  const int64_t samples_per_update =
      int64_t(a.per_device_train_batch_size) * a.gradient_accumulation_steps * pg.world_size;
  std::string last_loss;
  TrainCallbacks cb;
  cb.on_step = [&](int64_t done, int64_t total, const TrainerState&) {
    bar.update(done, total, samples_per_update, last_loss);
  };
  cb.on_log = [&](const nlohmann::ordered_json& e) {
    std::fprintf(log, "%s\n", e.dump().c_str());
    std::fflush(log);
    if (e.contains("loss")) last_loss = fmt::format("loss={:.4f}", e["loss"].get<double>());
    if (tb) log_scalars(*tb, e);
    bar.clear();
    fmt::print("{}\n", shown(e));
    std::fflush(stdout);
  };
  cb.on_notice = [&](const std::string& m) {
    bar.clear();
    fmt::print("{}\n", m);
    std::fflush(stdout);
  };
  const ModelFiles files{cfg, in.tokenizer.get()};
  TrainerState state;
  TrainMetrics m;
  {
    StopSignals stop;  // Ctrl-C and SIGTERM stop after the update in progress, with a checkpoint
    cb.should_stop = [](int64_t) { return StopSignals::received() != 0; };
    cb.save_when_stopped = true;
    m = train(run, a, TrainData{*in.train, in.eval.get()}, files, cb, &state);
  }
  bar.finish();
  if (const int sig = StopSignals::received()) {
    // Nothing of a finished run is written: no final model, no train_results.json.
    const std::string where = checkpoint_path(a.output_dir, state.global_step);
    if (state.global_step == 0)
      fmt::print("hone: interrupted by {} before the first update finished; nothing saved\n", signal_name(sig));
    else if (a.save_strategy != "no")
      fmt::print("hone: interrupted by {} after update {} of {}; checkpoint saved to {} (continue with "
                 "--resume_from_checkpoint {})\n",
                 signal_name(sig), state.global_step, sc.total_updates, where, where);
    else
      fmt::print("hone: interrupted by {} after update {} of {}; no checkpoint saved (--save_strategy no)\n",
                 signal_name(sig), state.global_step, sc.total_updates);
    std::fflush(stdout);
    return 128 + sig;
  }
  timeline.mark("train");
  std::optional<GpuMemory> after_train = print_gpu_memory(be, gpu, "after training");

  nlohmann::ordered_json metrics = m.to_json();
  if (after_train) {
    metrics["gpu"] = be.name();
    metrics["tf32"] = a.tf32;
    metrics["precision"] = precision_name(a);
    metrics["gpu_memory_start_mb"] = at_start ? at_start->used >> 20 : 0;
    metrics["gpu_memory_after_context_mb"] = after_context ? after_context->used >> 20 : 0;
    metrics["gpu_memory_after_setup_mb"] = after_setup ? after_setup->used >> 20 : 0;
    metrics["gpu_memory_after_train_mb"] = after_train->used >> 20;
    if (after_train->process_known) metrics["gpu_memory_process_mb"] = after_train->process_used >> 20;
    metrics["planned_mb"] = run.memory().plan().total_bytes() >> 20;
    if (comm->device_bytes() > 0) metrics["communicator_mb"] = comm->device_bytes() >> 20;
  }
  nlohmann::ordered_json summary;
  summary["train_runtime"] = std::round(m.train_runtime * 1e4) / 1e4;
  summary["train_samples_per_second"] = std::round(m.train_samples_per_second * 1e3) / 1e3;
  summary["train_steps_per_second"] = std::round(m.train_steps_per_second * 1e3) / 1e3;
  summary["train_loss"] = m.train_loss;
  summary["epoch"] = m.epoch;
  fmt::print("{}\n", python_dict(summary));
  if (run.loss_scaling()) {
    const int64_t skipped = run.skipped_steps();
    metrics["skipped_steps"] = skipped;
    metrics["loss_scale"] = run.loss_scale();
    fmt::print("fp16 loss scaling: {} of {} optimizer steps skipped (gradients with inf or NaN); final scale {:g}\n",
               skipped, m.global_step, run.loss_scale());
  }
  if (be.device() == Device::CUDA)
    fmt::print("CUDA graphs: {} micro-steps and optimizer steps replayed{}\n", run.replayed_steps(),
               a.cuda_graphs ? "" : " (--cuda_graphs false)");
  {
    const SpanSeconds& sp = m.spans;
    const double total = sp[0] + sp[1] + sp[2] + sp[3];
    auto pct = [&](double x) { return total > 0 ? 100 * x / total : 0.0; };
    fmt::print("time split ({}): forward {:.2f} s ({:.0f}%), backward {:.2f} s ({:.0f}%), optimizer {:.2f} s ({:.0f}%), "
               "other {:.2f} s ({:.0f}%)\n",
               be.device() == Device::CUDA ? "GPU time between CUDA events" : "wall clock",
               sp[0], pct(sp[0]), sp[1], pct(sp[1]), sp[2], pct(sp[2]), sp[3], pct(sp[3]));
    const double achieved = m.model_flops / m.train_runtime;
    const std::string precision = precision_name(a);
    std::string mfu = "no peak figure for this device";
    if (be.device() == Device::CUDA)
      if (const std::optional<double> peak = peak_flops(be.name(), precision)) {
        metrics["mfu"] = achieved / *peak;
        mfu = fmt::format("MFU {:.1f}% of the {:.1f} TFLOP/s {} peak", 100 * achieved / *peak, *peak / 1e12,
                          precision);
      }
    fmt::print("model FLOPs: {:.3g} TFLOP in {:.1f} s = {:.3g} TFLOP/s (over the attended tokens, as model.h's training_flops counts); {}\n",
               m.model_flops / 1e12, m.train_runtime, achieved / 1e12, mfu);
  }
  // As run_classification.py: the model is saved before the metrics.
  host.reset();
  if (!main_process) {  // rank 0 writes the model and the results; the others take part in
    if (run.master_sharded()) run.read_weights(nullptr);  // save_model's gathering of the weights
    if (in.eval && a.do_eval) evaluate(run, *in.eval, a);  // and in the last evaluation
    return 0;
  }
  run.save_model(a.output_dir);
  if (in.tokenizer) in.tokenizer->save(a.output_dir);
  timeline.mark("save");
  metrics["process_seconds"] = timeline.to_json();
  fmt::print("process: {}\n", timeline.summary());
  const fs::path out(a.output_dir);
  write_file_atomic((out / "train_results.json").string(), metrics.dump(4) + "\n");
  nlohmann::ordered_json all = metrics;
  if (in.eval && a.do_eval) {
    // As run_classification.py does after training: one more evaluation, of the final
    // (or best) model.
    nlohmann::ordered_json ev = evaluate(run, *in.eval, a);
    ev["epoch"] = m.epoch;
    fmt::print("{}\n", shown(ev));
    ev["step"] = m.global_step;
    std::fprintf(log, "%s\n", ev.dump().c_str());
    if (tb) log_scalars(*tb, ev);
    ev.erase("step");
    write_file_atomic((out / "eval_results.json").string(), ev.dump(4) + "\n");
    for (const auto& [k, v] : ev.items()) all[k] = v;
  }
  write_file_atomic((out / "all_results.json").string(), all.dump(4) + "\n");
  write_file_atomic((out / "trainer_state.json").string(), state.to_json(a, sc).dump(2) + "\n");
  write_file_atomic((out / "training_args.json").string(), to_json(a).dump(2) + "\n");
  fmt::print("saved the model ({}config.json, model.safetensors), train_results.json and trainer_log.jsonl to {}\n",
             in.tokenizer ? "tokenizer files, " : "", a.output_dir);

  size_t measured[kNumCategories];
  for (int c = 0; c < kNumCategories; ++c) measured[c] = run.memory().arena_bytes(Category(c));
  fmt::print("memory anatomy (planned before the first step; measured = bytes the arenas allocated):\n{}",
             memory_table(run.memory().plan(), layout.count(), measured));
  if (after_train && after_train->process_known) {
    const size_t planned = run.memory().plan().total_bytes(), nccl = comm->device_bytes();
    if (nccl > 0)
      fmt::print("  {:<24} {:>15} {:>10.1f}   (measured as the communicator started and connected; not planned)\n",
                 comm->name() + " buffers", with_commas(nccl), double(nccl) / kMiB);
    const uint64_t context =
        after_train->process_used - std::min(after_train->process_used, uint64_t(planned) + nccl);
    fmt::print("  {:<24} {:>15} {:>10.1f}   (this process on the GPU, NVML: {:.0f} MB, of which the plan is "
               "{:.0f} MB)\n",
               "CUDA context+libs", with_commas(context), double(context) / kMiB,
               double(after_train->process_used) / kMiB, double(planned) / kMiB);
  } else if (after_train) {
    fmt::print("  GPU memory of this process: unknown ({})\n", after_train->source);
  }
  fmt::print("host memory: peak resident {:.0f} MB\n", double(peak_rss()) / kMiB);
  return 0;
}

}  // namespace hone::cli
