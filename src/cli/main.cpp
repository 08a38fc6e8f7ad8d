// The hone executable: `hone train`, `hone estimate` and `hone env`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>

#include "cli/env.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "cli/tokenize.h"
#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/gpu_info.h"
#include "hone/data.h"
#include "hone/safetensors.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "train/arguments_cli.h"

namespace hone::cli {
namespace {

std::string describe(const BertConfig& c, int64_t params) {
  return fmt::format("{} layers, hidden {}, {} heads, intermediate {}, {} labels ({}); {} parameters",
                     c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_labels,
                     c.resolved_problem_type(), with_commas(uint64_t(params)));
}

// --device auto takes the GPU when there is one.
std::unique_ptr<Backend> make_backend(const TrainingArguments& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  std::string why;
  if (a.device == "cuda" || (a.device == "auto" && cuda_available(&why))) return make_cuda_backend({0, a.tf32});
  if (a.tf32) fmt::print("notice: --tf32 affects CUDA matrix products only; the CPU backend computes in fp32\n");
  return std::make_unique<CpuBackend>();
}

constexpr double kMiB = 1 << 20;

// What the seed notebook's print_gpu_utilization prints (device-wide, NVML).
std::optional<GpuMemory> print_gpu_memory(const Backend& be, const char* when) {
  if (be.device() != Device::CUDA) return std::nullopt;
  std::optional<GpuMemory> m = gpu_memory(0);
  if (m) fmt::print("GPU memory occupied: {} MB. ({})\n", m->used >> 20, when);
  std::fflush(stdout);
  return m;
}

int seq_len_of(const TrainingArguments& a) { return parse_synthetic_dataset(a.dataset).len; }

// Peak resident memory of this process (VmHWM), in bytes; 0 where /proc is absent.
size_t peak_rss() {
  std::ifstream f("/proc/self/status");
  std::string key;
  size_t kb = 0;
  while (f >> key)
    if (key == "VmHWM:" && f >> kb) return kb * 1024;
  return 0;
}

int estimate(const TrainingArguments& a, bool list_buffers) {
  ModelSource src = resolve_model(a.model_name_or_path);
  std::unique_ptr<Backend> be = make_backend(a);
  const int seq = seq_len_of(a);
  MemoryPlan plan = TrainingRun::plan(a, src.config, seq, *be, gradient_memory_for(a));
  const int64_t params = ParamLayout(src.config).count();
  fmt::print("hone estimate: {}\n  {}\n", src.name, describe(src.config, params));
  fmt::print("  run: batch {} x {} tokens, {}, {}, device {}\n", a.per_device_train_batch_size, seq,
             a.tf32 ? "tf32" : "fp32", a.optim, be->name());
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

int train_command(const TrainingArguments& a) {
  ModelSource src = resolve_model(a.model_name_or_path);
  const bool want_gpu = a.device == "cuda" || (a.device == "auto" && cuda_available(nullptr));
  std::optional<GpuMemory> at_start = want_gpu ? gpu_memory(0) : std::nullopt;
  if (at_start) fmt::print("GPU memory occupied: {} MB. (start)\n", at_start->used >> 20);
  std::unique_ptr<Backend> backend = make_backend(a);
  Backend& be = *backend;
  std::optional<GpuMemory> after_context = print_gpu_memory(be, "after the CUDA context and libraries");
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, src.config.resolved_problem_type() == "regression");
  if (dynamic_cast<SyntheticDataset*>(data.get()) && src.config.vocab_size < SyntheticDataset::kEndId)
    fail("--dataset {}: synthetic token ids go up to {}, but the model's vocab_size is {}", a.dataset,
         SyntheticDataset::kEndId - 1, src.config.vocab_size);

  TrainingRun run(a, src.config, data->seq_len(), be, gradient_memory_for(a));
  const ParamLayout& layout = run.model().layout();
  fmt::print("hone train: {}\n  {}\n", src.name, describe(src.config, layout.count()));
  std::vector<float> host(static_cast<size_t>(layout.count()));  // staging for init, load and save
  if (src.weights_path.empty()) {
    init_weights(src.config, layout, host.data(), a.seed);
    fmt::print("notice: {} is a built-in configuration: its weights are random (seed {}), since hone downloads "
               "nothing. Pass a directory with config.json and model.safetensors for pretrained weights.\n",
               src.name, a.seed);
  } else {
    LoadReport r = load_weights(src.weights_path, src.config, layout, host.data(), a.seed);
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
      return "[" + s + "]";
    };
    if (!r.initialized.empty())
      fmt::print("notice: newly initialised, not in {}: {}\n", src.weights_path, list(r.initialized));
    if (!r.unused.empty()) fmt::print("notice: unused tensors of {}: {}\n", src.weights_path, list(r.unused));
  }
  run.write_weights(host.data());
  std::optional<GpuMemory> after_setup = print_gpu_memory(be, "after the model and every planned buffer");
  const StepCounts sc = count_steps(a, data->size());
  const std::string where = be.device() == Device::CUDA
                                ? fmt::format("{}{}", be.name(), a.tf32 ? ", tf32" : ", fp32")
                                : fmt::format("{} ({} threads)", be.name(), omp_get_max_threads());
  fmt::print("  data: {}\n  device: {}; batch {} x {} accumulation, {} updates over {} epoch(s)\n",
             data->description(), where, a.per_device_train_batch_size, a.gradient_accumulation_steps,
             sc.total_updates, sc.epochs);
  std::fflush(stdout);

  std::error_code ec;
  std::filesystem::create_directories(a.output_dir, ec);
  if (ec) fail("cannot create --output_dir {}: {}", a.output_dir, ec.message());
  const std::string log_path = (std::filesystem::path(a.output_dir) / "trainer_log.jsonl").string();
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  if (!log) fail("cannot write {}", log_path);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_closer(log, std::fclose);

  ProgressBar bar(!a.disable_tqdm);
  TrainCallbacks cb;
  cb.on_step = [&](int64_t done, int64_t total) { bar.update(done, total); };
  cb.on_log = [&](const nlohmann::ordered_json& e) {
    std::fprintf(log, "%s\n", e.dump().c_str());
    std::fflush(log);
    nlohmann::ordered_json shown = e;
    shown.erase("step");
    shown["loss"] = std::round(e["loss"].get<double>() * 1e4) / 1e4;
    shown["epoch"] = std::round(e["epoch"].get<double>() * 100) / 100;
    fmt::print("{}\n", python_dict(shown));
    std::fflush(stdout);
  };
  TrainMetrics m = train(run, a, *data, cb);
  bar.finish();
  std::optional<GpuMemory> after_train = print_gpu_memory(be, "after training");

  nlohmann::ordered_json metrics = m.to_json();
  if (after_train) {
    metrics["gpu"] = be.name();
    metrics["tf32"] = a.tf32;
    metrics["gpu_memory_start_mb"] = at_start ? at_start->used >> 20 : 0;
    metrics["gpu_memory_after_context_mb"] = after_context ? after_context->used >> 20 : 0;
    metrics["gpu_memory_after_setup_mb"] = after_setup ? after_setup->used >> 20 : 0;
    metrics["gpu_memory_after_train_mb"] = after_train->used >> 20;
    if (after_train->process_known) metrics["gpu_memory_process_mb"] = after_train->process_used >> 20;
    metrics["planned_mb"] = run.memory().plan().total_bytes() >> 20;
  }
  nlohmann::ordered_json shown;
  shown["train_runtime"] = std::round(m.train_runtime * 1e4) / 1e4;
  shown["train_samples_per_second"] = std::round(m.train_samples_per_second * 1e3) / 1e3;
  shown["train_steps_per_second"] = std::round(m.train_steps_per_second * 1e3) / 1e3;
  shown["train_loss"] = m.train_loss;
  shown["epoch"] = m.epoch;
  fmt::print("{}\n", python_dict(shown));
  write_file_atomic((std::filesystem::path(a.output_dir) / "train_results.json").string(), metrics.dump(4) + "\n");
  run.read_weights(host.data());
  save_pretrained(a.output_dir, src.config, layout, host.data());
  fmt::print("saved config.json, model.safetensors, train_results.json and trainer_log.jsonl to {}\n", a.output_dir);

  size_t measured[kNumCategories];
  for (int c = 0; c < kNumCategories; ++c) measured[c] = run.memory().arena_bytes(Category(c));
  fmt::print("memory anatomy (planned before the first step; measured = bytes the arenas allocated):\n{}",
             memory_table(run.memory().plan(), layout.count(), measured));
  if (after_train && after_train->process_known) {
    const size_t planned = run.memory().plan().total_bytes();
    fmt::print("  {:<24} {:>15} {:>10.1f}   (this process on the GPU, NVML: {:.0f} MB, of which the plan is "
               "{:.0f} MB)\n",
               "CUDA context+libs", with_commas(after_train->process_used - std::min(after_train->process_used,
                                                                                      uint64_t(planned))),
               double(after_train->process_used - std::min(after_train->process_used, uint64_t(planned))) / kMiB,
               double(after_train->process_used) / kMiB, double(planned) / kMiB);
  } else if (after_train) {
    fmt::print("  GPU memory of this process: unknown ({})\n", after_train->source);
  }
  fmt::print("host memory: peak resident {:.0f} MB\n", double(peak_rss()) / kMiB);
  return 0;
}

}  // namespace
}  // namespace hone::cli

int main(int argc, char** argv) {
  using namespace hone;
  CLI::App app{"hone: fine-tune BERT for sequence classification, with Hugging Face Trainer's flags and files"};
  app.require_subcommand(1);
  TrainingArguments train_args, estimate_args;
  bool list_buffers = false;
  CLI::App* train = app.add_subcommand("train", "train a model (TrainingArguments flags)");
  add_training_arguments(*train, train_args);
  CLI::App* est = app.add_subcommand("estimate", "print the memory plan of a run without running it");
  add_training_arguments(*est, estimate_args);
  est->add_flag("--list_buffers", list_buffers, "also list every planned buffer");
  CLI::App* env = app.add_subcommand("env", "print the GPUs, driver, CUDA versions and supported features");
  std::string tokenizer_dir;
  int tokenize_max_length = 0;
  CLI::App* tok = app.add_subcommand(
      "tokenize", "tokenize JSON lines {\"text\": ..., \"text_pair\": ...} from stdin; print ids as JSON lines");
  tok->add_option("--tokenizer", tokenizer_dir, "a directory with tokenizer.json or vocab.txt")->required();
  tok->add_option("--max_length", tokenize_max_length, "truncate to this many tokens (0: no truncation)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train->parsed()) {
      validate(train_args);
      return cli::train_command(train_args);
    }
    if (env->parsed()) return cli::env_command();
    if (tok->parsed()) return cli::tokenize_command(tokenizer_dir, tokenize_max_length);
    validate(estimate_args);
    return cli::estimate(estimate_args, list_buffers);
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "hone: error: {}\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "hone: error: out of host memory\n");
  }
  return 1;
}
