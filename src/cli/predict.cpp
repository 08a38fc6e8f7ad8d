// `hone predict`: one JSON line per example of --test_file, with the label and the
// probabilities (or the predicted value of a regression) and the raw logits.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <optional>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/setup.h"
#include "hone/checkpoint.h"
#include "hone/gpu_info.h"
#include "hone/memory.h"
#include "hone/safetensors.h"
#include "hone/trainer.h"

namespace hone::cli {

int predict_command(const TrainingArguments& a) {
  // The CUDA context and cuBLASLt's setup while the test file is read and tokenized.
  std::future<void> prepared = prepare_gpu(a, 0, PreparedWork::Inference);
  RunInputs in = prepare_inputs(a, false, false, true);
  if (prepared.valid()) prepared.get();
  const ModelConfig& cfg = in.model.config;
  std::unique_ptr<Backend> be = make_backend(a);
  TrainingRun run(a, cfg, in.seq_len, *be, GradientMemory::Persistent,
                  RunPhases{false, a.per_device_eval_batch_size});
  const ParamLayout& layout = run.model().layout();
  std::vector<float> host(static_cast<size_t>(layout.count()));
  LoadReport r = load_weights(in.model.weights_path, cfg, layout, host.data(), a.seed);
  if (!r.initialized.empty())
    fail("{} lacks {} of the model's parameters (first: {}): it is not a fine-tuned model", in.model.weights_path,
         r.initialized.size(), r.initialized.front());
  run.write_weights(host.data());
  fmt::print("hone predict: {}\n  {}\n  data: {}\n  device: {}\n", in.model.name, describe(cfg, layout.count()),
             in.test->description(), be->name());

  std::vector<float> logits;
  nlohmann::ordered_json m = evaluate(run, *in.test, a, "predict", &logits);
  const int C = cfg.num_labels;
  const auto* text = dynamic_cast<const TextDataset*>(in.test.get());
  std::string out;
  for (int64_t i = 0; i < in.test->size(); ++i) {
    const float* z = &logits[size_t(i) * C];
    // A NaN is never a prediction: weights that load finite can still overflow on an input.
    if (!std::all_of(z, z + C, [](float v) { return std::isfinite(v); }))
      fail("{}: the model's output for this row is not finite (logits {}); no predictions written{}",
           text && size_t(i) < text->table().line.size()
               ? fmt::format("{}:{}", text->table().path, text->table().line[size_t(i)])
               : fmt::format("{} (row {})", a.test_file, i + 1),
           fmt::format("[{}]", fmt::join(z, z + C, ", ")),
           a.fp16 ? " (fp16 overflows past 65504: try --bf16, or neither)" : "");
    nlohmann::ordered_json line;
    if (in.labels.regression) {
      line["prediction"] = z[0];
    } else {
      const float mx = *std::max_element(z, z + C);
      std::vector<double> p(static_cast<size_t>(C));
      double sum = 0;
      for (int c = 0; c < C; ++c) sum += p[size_t(c)] = std::exp(double(z[c]) - mx);
      for (double& x : p) x /= sum;
      const int best = int(std::max_element(z, z + C) - z);
      line["label"] = cfg.id2label[size_t(best)];
      line["probabilities"] = p;
    }
    line["logits"] = std::vector<float>(z, z + C);
    out += line.dump() + "\n";
  }
  std::error_code ec;
  std::filesystem::create_directories(a.output_dir, ec);
  if (ec) fail("cannot create --output_dir {}: {}", a.output_dir, ec.message());
  for (const StaleTemporary& t : remove_stale_temporaries(a.output_dir))
    fmt::print("notice: {}\n", t.describe());
  const std::string path = (std::filesystem::path(a.output_dir) / "predictions.jsonl").string();
  write_file_atomic(path, out);
  if (in.test_has_labels) {
    nlohmann::ordered_json shown;
    for (const auto& [k, v] : m.items())
      if (!k.ends_with("_runtime") && !k.ends_with("_per_second")) shown[k] = std::round(v.get<double>() * 1e4) / 1e4;
    fmt::print("{}\n", python_dict(shown));
  }
  fmt::print("{} predictions in {:.2f} s ({:.1f} samples/s) written to {}\n", in.test->size(),
             m["predict_runtime"].get<double>(), m["predict_samples_per_second"].get<double>(), path);
  // The inference plan: the weights in the compute dtype and one batch's buffers, nothing else.
  const MemoryPlan& plan = run.memory().plan();
  constexpr double kMiB = 1 << 20;
  std::string line = fmt::format("memory: planned {:.0f} MiB (weights {:.0f}, one batch's activations {:.0f}, "
                                 "workspace {:.0f})",
                                 double(plan.total_bytes()) / kMiB,
                                 double(plan.category_bytes[size_t(Category::Weights)]) / kMiB,
                                 double(plan.category_bytes[size_t(Category::Activations)]) / kMiB,
                                 double(plan.category_bytes[size_t(Category::Workspace)]) / kMiB);
  if (be->device() == Device::CUDA)
    if (const std::optional<GpuMemory> g = gpu_memory(0); g && g->process_known)
      line += fmt::format("; this process on the GPU {:.0f} MiB (NVML, with the CUDA context)",
                          double(g->process_used) / kMiB);
  fmt::print("{}\n", line);
  return 0;
}

}  // namespace hone::cli
