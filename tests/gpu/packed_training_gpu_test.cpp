// Packed training on the GPU: a run whose micro-steps hold kPackedTrainingTokens or more
// trains on each batch's attended tokens alone and follows the CPU's padded run (fp32:
// within the kernels' rounding; bf16: within its format), BERT and ModernBERT, over steps
// that pack and one that runs every row; a smaller run records its steps instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "gpu/small_bert.h"
#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

constexpr int kRows = 64, kSeq = 64;  // kRows * kSeq = TrainingRun::kPackedTrainingTokens

bool packs(TrainingRun& run) {
  for (const PlannedBuffer& b : run.memory().plan().buffers)
    if (b.name == "packed_rows" && b.phase == Phase::MicroStep) return true;
  return false;
}

void check_packed_training(const std::string& model_type, DType dtype) {
  ModelConfig c = test::small_bert();
  if (model_type == "modernbert")  // rotary by the packed rows' columns, a local layer, mean pooling
    c = ModelConfig::from_json({{"model_type", "modernbert"}, {"vocab_size", c.vocab_size},
                                {"classifier_pooling", "mean"}, {"hidden_size", c.hidden_size},
                                {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                {"intermediate_size", c.intermediate_size}, {"max_position_embeddings", kSeq},
                                {"global_attn_every_n_layers", 2}, {"local_attention", 16}, {"pad_token_id", 0}},
                               "modernbert");
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  c.classifier_dropout = 0.0f;
  const ParamLayout layout(c);
  const size_t n = size_t(layout.count());
  std::vector<float> w(n);
  init_weights(c, layout, w.data(), 7);
  TrainingArguments a;
  a.per_device_train_batch_size = kRows;
  a.bf16 = dtype == DType::BF16;
  TrainingArguments reference_args = a;
  reference_args.bf16 = false;
  auto gpu = make_cuda_backend({});
  CpuBackend cpu;
  cpu.pack_training = false;
  TrainingRun on_gpu(a, c, kSeq, *gpu, gradient_memory_for(a)),
      padded(reference_args, c, kSeq, cpu, gradient_memory_for(reference_args));
  ASSERT_TRUE(packs(on_gpu));
  ASSERT_FALSE(packs(padded));
  on_gpu.write_weights(w.data());
  padded.write_weights(w.data());
  std::mt19937 g(9);
  const double tol = dtype == DType::F32 ? 1e-5 : 2e-2;
  for (int step = 0; step < 4; ++step) {
    test::TaskBatch b = test::task_batch(g, kRows, kSeq, c.vocab_size);  // lengths kSeq / 2 .. kSeq
    if (step == 2) std::fill(b.mask.begin(), b.mask.end(), 1);        // every row
    const Batch batch{kRows, kSeq, b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), {}};
    for (TrainingRun* run : {&on_gpu, &padded}) {
      run->micro_step(batch, 1.0f, uint64_t(step));
      run->optimizer_step(1e-3, step + 1);
    }
    // Relative, but not to a loss near zero (bf16's logits are within an absolute rounding).
    const double want = padded.take_loss_sum();
    EXPECT_NEAR(on_gpu.take_loss_sum(), want, tol * std::max(std::abs(want), 0.1)) << model_type << " step " << step;
  }
  EXPECT_EQ(on_gpu.replayed_steps(), 0);
  std::vector<float> got(n), want(n);
  on_gpu.read_weights(got.data());
  padded.read_weights(want.data());
  const double err = test::norm_rel_error(got.data(), want.data(), int64_t(n));
  EXPECT_LT(err, dtype == DType::F32 ? 1e-5 : 5e-2) << model_type;
  std::printf("[packed training, %s, %s] weights against the CPU's padded run after 4 steps: %.2e\n",
              model_type.c_str(), dtype_name(dtype).data(), err);
}

TEST(PackedTrainingGpu, FollowsTheCpusPaddedRun) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (const char* family : {"bert", "modernbert"}) {
    check_packed_training(family, DType::F32);
    if (mixed_precision_available(nullptr)) check_packed_training(family, DType::BF16);
  }
  // Half the tokens a step: recorded, not packed.
  auto gpu = make_cuda_backend({});
  TrainingArguments a;
  a.per_device_train_batch_size = kRows / 2;
  TrainingRun small(a, test::small_bert(), kSeq, *gpu, gradient_memory_for(a));
  EXPECT_FALSE(packs(small));
}

}  // namespace
}  // namespace hone
