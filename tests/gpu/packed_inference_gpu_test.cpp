// Packed inference on the GPU: right-padded batches run without their padding (the varlen
// flash forward over packed rows) and give the padded run's outputs, and the CPU
// reference's, in every half dtype and at head sizes 32 and 64, with lengths that end inside
// and at the edges of the kernels' tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/profile.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "gpu/small_bert.h"

namespace hone {
namespace {

constexpr int kSeq = 200;
constexpr int kLengths[] = {1, 130, 200, 64, 129, 17, 128, 2};
constexpr int kBatch = int(std::size(kLengths));

struct Outputs {
  std::vector<float> logits, pooled;
};

// A family's model (hone/family.h) packs as BERT's does: RoBERTa's position ids come from
// the padded ids (its padding id 1 pads the rows), ELECTRA projects its narrower
// embeddings, DistilBERT has no token types, ModernBERT turns query and key by each packed
// row's column and attends within a window in its local layer (with the mean of each
// sequence's rows, or its first token).
void check_packed(DType dtype, int heads, const std::string& model_type) {
  ModelConfig c = test::small_bert();
  c.model_type = model_type;
  c.num_attention_heads = heads;  // head size 128 / heads
  c.max_position_embeddings = 256;
  if (model_type == "roberta") c.pad_token_id = 1;
  if (model_type == "electra") c.embedding_size = 64;
  if (model_type.starts_with("modernbert"))  // rotary by the packed rows' columns, a local layer's window
    c = ModelConfig::from_json({{"model_type", "modernbert"}, {"vocab_size", c.vocab_size},
                                {"classifier_pooling", model_type == "modernbert_mean" ? "mean" : "cls"},
                                {"hidden_size", c.hidden_size}, {"num_hidden_layers", 2},
                                {"num_attention_heads", heads}, {"intermediate_size", c.intermediate_size},
                                {"max_position_embeddings", 256}, {"global_attn_every_n_layers", 2},
                                {"local_attention", 64}, {"pad_token_id", 0}},
                               "modernbert");
  const ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 23);
  std::vector<int32_t> ids, mask, types(size_t(kBatch * kSeq), 0);
  for (int b = 0; b < kBatch; ++b)
    for (int t = 0; t < kSeq; ++t) {
      ids.push_back(t == 0 ? 2 : t < kLengths[b] ? 5 + (t * 37 + b * 11) % 500 : c.pad_token_id);
      mask.push_back(t < kLengths[b] ? 1 : 0);
    }
  const Batch batch{kBatch, kSeq, ids.data(), mask.data(), types.data(), nullptr, {}};

  // packed: the default for these right-padded rows; otherwise asking for the hidden
  // states keeps the padded layout. ops: the names of the ops that ran.
  auto infer = [&](Backend& be, TrainingArguments a, bool packed, std::vector<std::string>* ops = nullptr) {
    TrainingRun run(a, c, kSeq, be, GradientMemory::Persistent, RunPhases{false, kBatch});
    run.write_weights(w.data());
    Outputs o{std::vector<float>(size_t(kBatch * c.num_labels)), std::vector<float>(size_t(kBatch * c.hidden_size))};
    std::vector<float> hidden(size_t(kBatch * kSeq * c.hidden_size));
    OpProfiler profiler(be);
    if (ops) profiler.start();
    run.infer(batch, ForwardOutputs{o.logits.data(), packed ? nullptr : hidden.data(), o.pooled.data()});
    if (ops)
      for (const TimedOp& op : profiler.finish().ops) ops->push_back(op.name);
    return o;
  };
  TrainingArguments half;
  half.bf16 = dtype == DType::BF16;
  half.fp16 = dtype == DType::F16;
  auto gpu = make_cuda_backend({});
  std::vector<std::string> packed_ops, padded_ops;
  const Outputs packed = infer(*gpu, half, true, &packed_ops);
  const Outputs padded = infer(*gpu, half, false, &padded_ops);
  CpuBackend cpu;
  const Outputs reference = infer(cpu, TrainingArguments{}, false);
  EXPECT_NE(std::find(packed_ops.begin(), packed_ops.end(), "attention_forward_packed"), packed_ops.end());
  EXPECT_EQ(std::find(padded_ops.begin(), padded_ops.end(), "attention_forward_packed"), padded_ops.end());

  // BERT's pooled outputs are tanh's, in [-1, 1]: an absolute bound of the half precision's
  // rounding (relative past 1, for the other heads' GELU and ReLU).
  const double tol = dtype == DType::BF16 ? 3e-2 : 5e-3;
  double worst_padded = 0, worst_reference = 0;
  for (size_t i = 0; i < packed.pooled.size(); ++i) {
    const double scale = std::max(1.0, double(std::abs(reference.pooled[i])));
    worst_padded = std::max(worst_padded, double(std::abs(packed.pooled[i] - padded.pooled[i])) / scale);
    worst_reference = std::max(worst_reference, double(std::abs(packed.pooled[i] - reference.pooled[i])) / scale);
  }
  EXPECT_LT(worst_padded, tol) << model_type;
  EXPECT_LT(worst_reference, tol) << model_type;
  for (size_t i = 0; i < packed.logits.size(); ++i)
    EXPECT_NEAR(packed.logits[i], reference.logits[i], tol) << model_type << " " << i;
}

#define SKIP_WITHOUT_MIXED_PRECISION()                                                   \
  do {                                                                                   \
    std::string why;                                                                     \
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;                         \
    if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why; \
  } while (0)

class PackedInference : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(PackedInference, GivesThePaddedOutputs) {
  SKIP_WITHOUT_MIXED_PRECISION();
  check_packed(std::get<0>(GetParam()), std::get<1>(GetParam()), "bert");
}

TEST(PackedInferenceFamilies, GiveThePaddedOutputs) {
  SKIP_WITHOUT_MIXED_PRECISION();
  for (const char* family : {"roberta", "distilbert", "electra", "modernbert", "modernbert_mean"})
    check_packed(DType::BF16, 2, family);
}

INSTANTIATE_TEST_SUITE_P(Every, PackedInference,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == DType::BF16 ? "bf16" : "fp16") +
                                  "_head" + std::to_string(128 / std::get<1>(info.param));
                         });

}  // namespace
}  // namespace hone
