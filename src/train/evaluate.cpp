#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "hone/metrics.h"
#include "hone/trainer.h"

namespace hone {

nlohmann::ordered_json evaluate(TrainingRun& run, const Dataset& data, const TrainingArguments& a,
                                const std::string& prefix, std::vector<float>* logits) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const int C = run.model().config().num_labels, EB = a.per_device_eval_batch_size;
  const bool regression = run.model().regression();
  const int64_t n = data.size();
  if (n == 0) fail("{}: no examples to evaluate", data.description());
  // Every example tokenized once, on all cores: the lengths below need them all, and the
  // loop's batches then copy them instead of tokenizing while the GPU waits.
  const PreparedDataset examples(data);
  // Batches of examples of similar length, longest first, so that each pads little to its
  // longest (and the largest batch runs first); results go back to the dataset's order.
  std::vector<int> lengths(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) lengths[size_t(i)] = examples.length(i);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return lengths[size_t(x)] > lengths[size_t(y)]; });
  // With several ranks each takes every world-th batch, so that all get long and short ones
  // alike, and they share their logits at the end.
  Communicator& comm = run.communicator();
  const int world = comm.world_size();
  std::vector<std::vector<int64_t>> batches;
  for (int64_t lo = 0, k = 0; lo < n; lo += EB, ++k)
    if (k % world == comm.rank()) batches.emplace_back(order.begin() + lo, order.begin() + std::min(n, lo + EB));
  const int64_t steps = (n + int64_t(EB) * world - 1) / (int64_t(EB) * world);  // as Trainer counts them
  LoaderOptions lo{a.dataloader_num_workers, a.dataloader_pin_memory, 8, EB};
  BatchLoader loader(examples, std::move(batches), lo, run.backend());

  // Every example's logits, then its label: zeros where another rank has them, so that the
  // ranks' sum is exact.
  std::vector<float> gathered(size_t(n) * (C + 1)), batch_logits(size_t(EB) * C);
  float* const all = gathered.data();
  float* const labels = all + size_t(n) * C;
  while (const Batch* b = loader.next()) {
    run.infer(*b, ForwardOutputs{batch_logits.data()});
    for (int r = 0; r < b->rows; ++r) {
      const size_t at = size_t(b->indices[size_t(r)]);
      std::copy_n(&batch_logits[size_t(r) * C], C, &all[at * C]);
      labels[at] = b->labels[r];
    }
  }
  run.all_reduce_host(gathered.data(), int64_t(gathered.size()));
  double loss_sum = 0;  // summed per example: Trainer's eval_loss is the mean over examples
  for (int64_t i = 0; i < n; ++i) {
    const float* z = &all[size_t(i) * C];
    const float y = labels[i];
    if (regression) {
      loss_sum += (double(z[0]) - y) * (double(z[0]) - y);
    } else {
      double mx = z[0], sum = 0;
      for (int c = 1; c < C; ++c) mx = std::max(mx, double(z[c]));
      for (int c = 0; c < C; ++c) sum += std::exp(double(z[c]) - mx);
      loss_sum += mx + std::log(sum) - double(z[int(y)]);
    }
  }
  const double runtime = std::chrono::duration<double>(clock::now() - start).count();

  nlohmann::ordered_json m;
  m[prefix + "_loss"] = loss_sum / double(n);
  if (regression) {
    const RegressionMetrics r =
        regression_metrics(std::vector<float>(all, all + n), std::vector<float>(labels, labels + n));
    m[prefix + "_mse"] = r.mse;
    m[prefix + "_pearson"] = r.pearson;
    m[prefix + "_spearman"] = r.spearman;
  } else {
    std::vector<int32_t> pred(static_cast<size_t>(n)), truth(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const float* z = &all[size_t(i) * C];
      pred[size_t(i)] = int32_t(std::max_element(z, z + C) - z);
      truth[size_t(i)] = int32_t(labels[size_t(i)]);
    }
    const ClassificationMetrics c = classification_metrics(pred, truth, C);
    m[prefix + "_accuracy"] = c.accuracy;
    m[prefix + "_f1"] = c.f1;
    m[prefix + "_matthews_correlation"] = c.matthews_correlation;
  }
  m[prefix + "_runtime"] = runtime;
  m[prefix + "_samples_per_second"] = double(n) / runtime;
  m[prefix + "_steps_per_second"] = double(steps) / runtime;
  if (logits) logits->assign(all, all + size_t(n) * C);
  return m;
}

}  // namespace hone
