// Gradient checkpointing on the GPU: backward recomputes what a layer did not keep with the
// forward's own kernels and dropout masks (hone's Philox streams, the fused bf16
// attention's included), so each update's loss and
// gradients are the plain run's, with CUDA graphs on and off, with step-scoped and
// accumulated gradients.
//
// "The same" on the GPU: every value a forward pass computes is reproducible bit for bit
// (the fused attention's for one dropout spec too: fused_attention_gpu_test), and LayerNorm
// of a stored sum is the fused residual LayerNorm's output bit for bit (mixed_ops_gpu_test),
// which is what the recomputation relies on. But LayerNorm, bias and embedding gradients are
// summed with float atomics (layernorm.cu, linear.cu, embedding.cu) whose order varies from
// run to run, and in half precision the attention backward accumulates dQ across key
// blocks in a varying order, which reaches every gradient computed after it. So two plain
// runs already differ there in their last bits. The test holds bitwise what two plain runs
// reproduce: the loss and the products' weight gradients (all of them in fp32; in bf16
// those backward computes before the last layer's attention, which read the recomputed
// context, ln1_out and FFN activation); the rest within the run-to-run tolerance, against
// a control with other dropout masks. Each update starts from the same weights, so that
// those last bits do not compound through the optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/small_bert.h"
#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"

namespace hone {
namespace {

using test::random_batch;
using test::small_bert;

constexpr int kUpdates = 4;  // with CUDA graphs: the micro-step runs eagerly, is recorded, then replays
constexpr int kRows = 4, kSeq = 64;

const char* precision_name(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }

// Gradients that two plain runs give bit for bit (see the top of the file).
bool reproducible(const ParamEntry& e, DType t, int layers) {
  if (e.shape.rank != 2 || e.group == 0) return false;  // biases, LayerNorms, embeddings: atomics
  if (t == DType::F32) return true;
  const bool head = e.group == layers + 1, last_layer = e.group == layers;
  return head || (last_layer && e.name.find(".attention.self.") == std::string::npos);
}

// ||got - want|| / ||want|| over the elements `take` selects.
template <typename Take>
double rel_error(const std::vector<float>& got, const std::vector<float>& want, const ParamLayout& layout, Take take) {
  double diff = 0, norm = 0;
  for (const ParamEntry& e : layout.entries()) {
    if (!take(e)) continue;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      const double d = double(got[size_t(i)]) - want[size_t(i)];
      diff += d * d;
      norm += double(want[size_t(i)]) * want[size_t(i)];
    }
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

class GradientCheckpointingGpu : public ::testing::TestWithParam<std::tuple<DType, bool, int>> {};

TEST_P(GradientCheckpointingGpu, EachUpdateEqualsThePlainRun) {
  const auto [dtype, graphs, accumulation] = GetParam();
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  if (dtype != DType::F32 && !mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  auto be = make_cuda_backend({});
  ModelConfig c = small_bert(0.1);
  c.num_hidden_layers = 3;  // a middle layer: selective recomputes its input from the layer below
  const ParamLayout layout(c);
  const size_t n = size_t(layout.count());
  std::vector<float> w(n);
  init_weights(c, layout, w.data(), 17);
  TrainingArguments a;
  a.per_device_train_batch_size = kRows;
  a.gradient_accumulation_steps = accumulation;
  a.bf16 = dtype == DType::BF16;
  a.cuda_graphs = graphs;

  struct Variant {
    const char* name;
    std::unique_ptr<TrainingRun> run;
    std::vector<float> grads;
    double loss;
  };
  auto variant = [&](const char* name, bool checkpointing, const char* policy, uint64_t seed) {
    TrainingArguments args = a;
    args.gradient_checkpointing = checkpointing;
    args.gradient_checkpointing_policy = policy;
    args.seed = seed;
    return Variant{name, std::make_unique<TrainingRun>(args, c, kSeq, *be, gradient_memory_for(args)),
                   std::vector<float>(n), 0.0};
  };
  Variant runs[] = {variant("plain", false, "", 42), variant("plain again", false, "", 42),
                    variant("full", true, "", 42), variant("selective", true, "selective", 42),
                    variant("other masks", false, "", 43)};
  const Variant& plain = runs[0];
  const Variant& other_masks = runs[4];

  // Atomic float sums differ in their last bits (fp32); bf16's dQ order reaches whole layers.
  const double tol = dtype == DType::F32 ? 1e-5 : 2e-2;
  auto exact = [&](const ParamEntry& e) { return reproducible(e, dtype, c.num_hidden_layers); };
  auto rest = [&](const ParamEntry& e) { return !exact(e); };
  auto all = [](const ParamEntry&) { return true; };
  std::mt19937 g(3);
  uint64_t micro = 0;
  for (int k = 0; k < kUpdates; ++k, micro += uint64_t(accumulation)) {
    std::vector<test::TaskBatch> batches;
    for (int m = 0; m < accumulation; ++m) batches.push_back(random_batch(g, kRows, kSeq, c.vocab_size));
    for (Variant& v : runs) {
      v.run->write_weights(w.data());
      for (int m = 0; m < accumulation; ++m) {
        test::TaskBatch& h = batches[size_t(m)];
        const Batch b{kRows, kSeq, h.ids.data(), h.mask.data(), h.types.data(), h.labels.data(), {}};
        v.run->micro_step(b, 1.0f / float(accumulation), micro + uint64_t(m));
      }
      v.run->read_grads(v.grads.data());
      v.loss = v.run->take_loss_sum();
      v.run->optimizer_step(1e-3, k + 1);
    }
    for (const Variant& v : runs) {
      if (&v == &plain || &v == &other_masks) continue;
      SCOPED_TRACE(std::string(v.name) + ", update " + std::to_string(k + 1));
      EXPECT_EQ(v.loss, plain.loss);
      int64_t differing = 0;
      for (const ParamEntry& e : layout.entries())
        if (exact(e) && std::memcmp(&v.grads[size_t(e.offset)], &plain.grads[size_t(e.offset)],
                                    size_t(e.shape.numel()) * sizeof(float)) != 0) {
          ADD_FAILURE() << e.name << ": gradient not bit for bit the plain run's";
          ++differing;
        }
      const double err = rel_error(v.grads, plain.grads, layout, rest);
      std::printf("[%s, graphs %s, GA %d] update %d, %s: %lld reproducible gradients differ; the rest %.2e\n",
                  precision_name(dtype), graphs ? "on" : "off", accumulation, k + 1, v.name,
                  static_cast<long long>(differing), err);
      EXPECT_LE(err, tol);
    }
    const double control = rel_error(other_masks.grads, plain.grads, layout, all);
    std::printf("[%s, graphs %s, GA %d] update %d, other masks: %.2e\n", precision_name(dtype), graphs ? "on" : "off",
                accumulation, k + 1, control);
    EXPECT_GT(control, 5 * tol) << "other dropout masks must differ by more than the tolerance";
  }
  if (graphs) {
    for (const Variant& v : runs) EXPECT_GT(v.run->replayed_steps(), 0) << v.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, GradientCheckpointingGpu,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::Bool(),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::string(precision_name(std::get<0>(info.param))) + "_graphs_" +
                                  (std::get<1>(info.param) ? "on" : "off") + "_accumulation_" +
                                  std::to_string(std::get<2>(info.param));
                         });

}  // namespace
}  // namespace hone
