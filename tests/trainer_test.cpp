// The memory plan against the run, the step loop's bookkeeping, and model files.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <new>
#include <tuple>

#include "hone/cpu_backend.h"
#include "hone/profile.h"
#include "hone/safetensors.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

// Counts every operator new of the test binary, to prove the step loop allocates nothing.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // new and delete both use malloc/free here
static std::atomic<int64_t> g_news{0};
void* operator new(size_t n) {
  ++g_news;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace hone {
namespace {

ModelConfig small_config(int labels = 2) {
  ModelConfig c;
  c.vocab_size = 30522;
  c.hidden_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 40;
  c.max_position_embeddings = 32;
  c.num_labels = labels;
  c.id2label.clear();
  for (int i = 0; i < labels; ++i) c.id2label.push_back("LABEL_" + std::to_string(i));
  return c;
}

TrainingArguments small_args(int batch) {
  TrainingArguments a;
  a.per_device_train_batch_size = batch;
  a.dataset = "synthetic:16x16";
  a.learning_rate = 1e-3;
  a.save_strategy = "no";
  return a;
}

struct Rows {
  std::vector<int32_t> ids, mask, types;
  std::vector<float> labels;
  Rows(int batch, int seq, uint64_t seed) {
    SyntheticDataset d(batch, seq, seed, false);
    ids.resize(size_t(batch * seq));
    mask.resize(ids.size());
    types.resize(ids.size());
    labels.resize(size_t(batch));
    for (int b = 0; b < batch; ++b) {
      d.example(b, &ids[size_t(b * seq)], &types[size_t(b * seq)], &labels[size_t(b)]);
      labels[size_t(b)] = float(b % 2);
      for (int t = 0; t < seq; ++t) mask[size_t(b * seq + t)] = t < seq - b ? 1 : 0;  // some padding
    }
  }
};

// rows x seq of r as an inference batch.
Batch batch_of(Rows& r, int rows, int seq) {
  Batch b;
  b.rows = rows;
  b.seq = seq;
  b.ids = r.ids.data();
  b.mask = r.mask.data();
  b.types = r.types.data();
  return b;
}

// ModernBERT's pre-norm layers at the size of small_config: rotary, GeGLU, a local layer
// between global ones, the given pooling.
ModelConfig small_modernbert(const std::string& pooling) {
  return ModelConfig::from_json({{"model_type", "modernbert"}, {"vocab_size", 30522}, {"hidden_size", 24},
                                 {"num_attention_heads", 2}, {"intermediate_size", 40}, {"max_position_embeddings", 32},
                                 {"num_hidden_layers", 3}, {"global_attn_every_n_layers", 2}, {"local_attention", 6},
                                 {"classifier_pooling", pooling}, {"pad_token_id", 0}},
                                "modernbert");
}

TEST(MemoryPlanOfRun, EstimateEqualsPlanEqualsAllocation) {
  CpuBackend be;
  const ModelConfig c = small_config();
  const TrainingArguments a = small_args(4);
  MemoryPlan estimate = TrainingRun::plan(a, c, 16, be);
  TrainingRun run(a, c, 16, be);
  const int64_t params = run.model().layout().count();
  for (int k = 0; k < kNumCategories; ++k) {
    const Category cat = Category(k);
    EXPECT_EQ(estimate.category_bytes[k], run.memory().plan().category_bytes[k]) << category_name(cat);
    EXPECT_EQ(run.memory().arena_bytes(cat), estimate.category_bytes[k]) << category_name(cat);
  }
  auto aligned = [](int64_t bytes) { return size_t((bytes + 255) / 256 * 256); };
  EXPECT_EQ(estimate.category_bytes[size_t(Category::Weights)], aligned(4 * params));
  EXPECT_EQ(estimate.category_bytes[size_t(Category::Gradients)], aligned(4 * params));
  EXPECT_EQ(estimate.category_bytes[size_t(Category::OptimizerState)], 2 * aligned(4 * params));
  // Saved activations: per layer qkv (3H), context, two residual sums, attention output
  // (H each), FFN pre-activation (I), layer output (H), two softmax statistics per head
  // and query (no [S, S] probabilities) and four LayerNorm statistics per token, for
  // B x S tokens, and the packing of the batch (its rows and where each sequence starts:
  // the CPU trains packed); buffers are 256-byte aligned.
  const int64_t B = 4, S = 16, T = B * S, H = 24, I = 40;
  size_t layer = aligned(4 * T * 3 * H) + aligned(4 * B * 2 * S * 2) + 5 * aligned(4 * T * H) + aligned(4 * T * I) +
                 4 * aligned(4 * T);
  size_t saved = 2 * layer + 2 * aligned(4 * T * H) + 2 * aligned(4 * T) + 3 * aligned(4 * B * H) +
                 3 * aligned(4 * T) + aligned(4 * B) + aligned(8) +  // embeddings, head, inputs, dropout step
                 aligned(4 * T) + aligned(4 * (B + 1));              // packed rows, row starts
  EXPECT_EQ(estimate.unshared_bytes()[size_t(Category::Activations)], saved);
  // Sharing: the plan costs less than its buffers laid end to end.
  EXPECT_LT(estimate.category_bytes[size_t(Category::Workspace)],
            estimate.unshared_bytes()[size_t(Category::Workspace)]);
}

TEST(MemoryPlanOfRun, StepTakesNoMemoryAndLiveBuffersNeverOverlap) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingRun run(small_args(4), c, 16, be);
  init_weights(c, run.model().layout(), run.host_weights(), 1);
  Rows r(4, 16, 3);
  run.memory().set_check_overlaps(true);
  run.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 0);  // warm-up
  run.optimizer_step(1e-3, 1);
  run.memory().set_check_overlaps(false);
  const int64_t arenas = Arena::allocation_count(), news = g_news.load();
  for (int step = 1; step < 4; ++step) {
    run.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 0.5f, uint64_t(2 * step));
    run.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 3, 0.5f, uint64_t(2 * step + 1));
    run.optimizer_step(1e-3, step + 1);
  }
  EXPECT_EQ(Arena::allocation_count() - arenas, 0);
  EXPECT_EQ(g_news.load() - news, 0);
}

// Step-scoped gradients: packed with the activations, they take the bytes that backward
// frees, live buffers never overlap, steps allocate nothing, and training is bit for bit
// the same as with a persistent gradient buffer.
TEST(MemoryPlanOfRun, StepScopedGradientsReuseActivationMemory) {
  CpuBackend be;
  ModelConfig c = small_config();
  c.num_hidden_layers = 4;
  c.vocab_size = 300;  // BERT's proportions: the word embeddings do not dwarf the layers
  const TrainingArguments a = small_args(4);
  const MemoryPlan persistent = TrainingRun::plan(a, c, 16, be, GradientMemory::Persistent);
  const MemoryPlan scoped = TrainingRun::plan(a, c, 16, be, GradientMemory::StepScoped);
  EXPECT_EQ(scoped.arena_of[size_t(Category::Gradients)], Category::Activations);
  EXPECT_EQ(scoped.category_bytes[size_t(Category::Gradients)], 0u);
  // The same gradients, in one buffer per group (each aligned) instead of one for all.
  const size_t all = persistent.unshared_bytes()[size_t(Category::Gradients)];
  EXPECT_GE(scoped.unshared_bytes()[size_t(Category::Gradients)], all);
  EXPECT_LE(scoped.unshared_bytes()[size_t(Category::Gradients)], all + 6 * 256);
  // Most of the gradients fit in freed activation memory.
  const size_t grads = persistent.category_bytes[size_t(Category::Gradients)];
  EXPECT_LT(scoped.total_bytes(), persistent.total_bytes() - grads / 2);

  TrainingRun run_p(a, c, 16, be, GradientMemory::Persistent), run_s(a, c, 16, be, GradientMemory::StepScoped);
  std::vector<float> w(size_t(run_p.model().layout().count()));
  init_weights(c, run_p.model().layout(), w.data(), 4);
  run_p.write_weights(w.data());
  run_s.write_weights(w.data());
  EXPECT_EQ(run_s.memory().arena_bytes(Category::Gradients), 0u);
  Rows r(4, 16, 8);
  for (int32_t& id : r.ids) id %= c.vocab_size;
  run_s.memory().set_check_overlaps(true);
  const int64_t arenas = Arena::allocation_count();
  for (int step = 0; step < 3; ++step) {
    for (TrainingRun* run : {&run_p, &run_s}) {
      run->micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, uint64_t(step));
      run->optimizer_step(1e-3, step + 1);
    }
    EXPECT_EQ(run_p.take_loss_sum(), run_s.take_loss_sum()) << "step " << step;
    EXPECT_EQ(run_p.last_grad_norm(), run_s.last_grad_norm()) << "step " << step;
  }
  EXPECT_EQ(Arena::allocation_count(), arenas);
  std::vector<float> wp(w.size()), ws(w.size());
  run_p.read_weights(wp.data());
  run_s.read_weights(ws.data());
  EXPECT_EQ(wp, ws);
  // Misuse is caught: two micro-steps without an update.
  run_s.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 9);
  EXPECT_THROW(run_s.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 10), Error);
}

// ---------------------------------------------------------------- inference

// Classification on the first token: inference runs the last layer past attention on each
// sequence's first token alone, and the logits are the whole layer's (which a call asking
// for the hidden states runs), up to the products' rounding. BERT's post-norm layers and ModernBERT's pre-norm ones (with its final norm, and a local
// attention layer before the last).
class FirstTokenInference : public ::testing::TestWithParam<std::string> {};

TEST_P(FirstTokenInference, TheLastLayerOnTheFirstTokensGivesTheWholeLayersLogits) {
  CpuBackend be;
  ModelConfig c = small_config();
  if (GetParam() == "modernbert") c = small_modernbert("cls");
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  const TrainingArguments a = small_args(4);
  const RunPhases phases{true, 6};
  const MemoryPlan plan = TrainingRun::plan(a, c, 16, be, GradientMemory::Persistent, phases);
  const auto planned = [&](Phase phase) {
    return std::any_of(plan.buffers.begin(), plan.buffers.end(),
                       [&](const PlannedBuffer& b) { return b.phase == phase && b.name == "first_token_context"; });
  };
  EXPECT_TRUE(planned(Phase::Inference));
  EXPECT_TRUE(planned(Phase::PackedInference));
  EXPECT_FALSE(planned(Phase::HiddenStates));
  TrainingRun run(a, c, 16, be, GradientMemory::Persistent, phases);
  init_weights(c, run.model().layout(), run.host_weights(), 5);
  Rows r(4, 16, 7);
  for (const bool padding : {false, true}) {
    if (!padding) std::fill(r.mask.begin(), r.mask.end(), 1);  // no padding: the padded layout
    else r = Rows(4, 16, 7);                                    // right padding: packed
    const Batch b = batch_of(r, 4, 16);
    std::vector<float> whole(8), first(8), hidden(size_t(4 * 16 * c.hidden_size));
    run.infer(b, ForwardOutputs{whole.data(), hidden.data()});
    run.infer(b, ForwardOutputs{first.data()});
    for (size_t i = 0; i < first.size(); ++i)
      EXPECT_NEAR(first[i], whole[i], 1e-5 * std::abs(whole[i]) + 1e-7) << (padding ? "packed " : "padded ") << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FirstTokenInference, ::testing::Values("bert", "modernbert"));

TEST(Inference, LogitsEqualTheTrainingForwardWithoutDropout) {
  CpuBackend be;
  be.pack_training = false;  // the padded training forward: packed below
  ModelConfig c = small_config();
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  const TrainingArguments a = small_args(4);
  TrainingRun run(a, c, 16, be, GradientMemory::Persistent, RunPhases{true, 6});
  init_weights(c, run.model().layout(), run.host_weights(), 5);
  Rows r(4, 16, 7);
  std::vector<float> trained(8), inferred(8);
  run.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 0, trained.data());
  const Batch b = batch_of(r, 4, 16);
  // Asking for the hidden states keeps the padded layout, the training forward's arithmetic.
  std::vector<float> hidden(size_t(4 * 16 * c.hidden_size));
  run.infer(b, ForwardOutputs{inferred.data(), hidden.data()});
  EXPECT_EQ(trained, inferred);
  // Packed (the default for these right-padded rows): the same up to the products' rounding.
  std::vector<float> packed(8);
  run.infer(b, ForwardOutputs{packed.data()});
  for (size_t i = 0; i < packed.size(); ++i) EXPECT_NEAR(packed[i], trained[i], 1e-5 * std::abs(trained[i]) + 1e-7) << i;
  // So does packed training's forward (the CPU's default).
  CpuBackend packing;
  TrainingRun packed_training(a, c, 16, packing, GradientMemory::Persistent, RunPhases{true, 6});
  init_weights(c, packed_training.model().layout(), packed_training.host_weights(), 5);
  packed_training.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 0, packed.data());
  for (size_t i = 0; i < packed.size(); ++i) EXPECT_NEAR(packed[i], trained[i], 1e-5 * std::abs(trained[i]) + 1e-7) << i;
  // A run planned for inference alone holds no gradients or optimizer state.
  TrainingRun infer_only(a, c, 16, be, GradientMemory::Persistent, RunPhases{false, 6});
  EXPECT_EQ(infer_only.memory().arena_bytes(Category::OptimizerState), 0u);
  EXPECT_EQ(infer_only.memory().arena_bytes(Category::Gradients), 0u);
  EXPECT_THROW(infer_only.micro_step(b, 1.0f, 0), Error);
}

// Right-padded rows run packed (no work on padding); a mask with a hole runs padded.
TEST(Inference, PackedBatchesGiveThePaddedLogits) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingRun run(small_args(4), c, 16, be, GradientMemory::Persistent, RunPhases{false, 4});
  init_weights(c, run.model().layout(), run.host_weights(), 5);
  Rows r(4, 16, 7);  // rows of 16, 15, 14 and 13 attended tokens
  Batch b{4, 16, r.ids.data(), r.mask.data(), r.types.data(), nullptr, {}};
  std::vector<float> packed(8), padded(8), hidden(size_t(4 * 16 * c.hidden_size));
  const auto ran_packed_attention = [&](const ForwardOutputs& out) {
    OpProfiler profiler(be);
    profiler.start();
    run.infer(b, out);
    for (const TimedOp& op : profiler.finish().ops)
      if (std::string(op.name) == "attention_forward_packed") return true;
    return false;
  };
  EXPECT_TRUE(ran_packed_attention(ForwardOutputs{packed.data()}));
  EXPECT_FALSE(ran_packed_attention(ForwardOutputs{padded.data(), hidden.data()}));
  // The same up to the products' rounding, which may differ with the packed shapes.
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(packed[i], padded[i], 1e-5 * std::abs(padded[i]) + 1e-7) << i;

  std::vector<int32_t> holed = r.mask;
  holed[3] = 0;  // row 0 attends to tokens 0-2 and 4-15: not packable
  b.mask = holed.data();
  std::vector<float> holed_default(8), holed_padded(8);
  run.infer(b, ForwardOutputs{holed_default.data()});
  run.infer(b, ForwardOutputs{holed_padded.data(), hidden.data()});
  EXPECT_EQ(holed_default, holed_padded);
  EXPECT_NE(holed_default[0], padded[0]);

  std::vector<int32_t> empty = r.mask;
  std::fill(empty.begin() + 16, empty.begin() + 32, 0);  // row 1 attends to nothing: HF's uniform attention
  b.mask = empty.data();
  std::vector<float> empty_default(8), empty_padded(8);
  run.infer(b, ForwardOutputs{empty_default.data()});
  run.infer(b, ForwardOutputs{empty_padded.data(), hidden.data()});
  EXPECT_EQ(empty_default, empty_padded);
}

// validate_batch's vectorized pass says only whether a batch is bad; the loop that names the
// element must still find it anywhere in the batch, and the run must take the next batch.
TEST(Inference, BadBatchesNameTheirFirstBadElementAndLeaveTheRunUsable) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingRun run(small_args(4), c, 16, be, GradientMemory::Persistent, RunPhases{true, 4});
  init_weights(c, run.model().layout(), run.host_weights(), 5);
  const Rows good(4, 16, 7);
  const auto error_of = [&](const std::function<void(Rows&)>& spoil, bool train) {
    Rows r = good;
    spoil(r);
    try {
      std::vector<float> logits(8);
      if (train) {
        run.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 0);
        run.optimizer_step(1e-3, 1);
      } else {
        run.infer(batch_of(r, 4, 16), ForwardOutputs{logits.data()});
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto expect_error = [&](const std::function<void(Rows&)>& spoil, const std::string& message) {
    for (const bool train : {false, true}) {
      const std::string e = error_of(spoil, train);
      EXPECT_NE(e.find(message), std::string::npos) << (train ? "micro_step: " : "infer: ") << e;
    }
  };
  expect_error([](Rows& r) { r.ids[3 * 16 + 9] = 30522; },
               "batch row 3, position 9: token id 30522 is out of range for the model's vocab_size 30522");
  expect_error([](Rows& r) { r.ids[17] = -1; }, "batch row 1, position 1: token id -1 is out of range");
  expect_error([](Rows& r) { r.types[2 * 16 + 15] = 2; },
               "batch row 2, position 15: token type 2 is out of range for type_vocab_size 2");
  expect_error([](Rows& r) { r.types[0] = -7; }, "batch row 0, position 0: token type -7 is out of range");
  expect_error([](Rows& r) { r.mask[16 + 14] = 2; }, "batch row 1, position 14: attention mask value 2 is not 0 or 1");
  expect_error([](Rows& r) { r.mask[3 * 16 + 15] = -1; }, "batch row 3, position 15: attention mask value -1");
  EXPECT_NE(error_of([](Rows& r) { r.labels[2] = 2.0f; }, true).find("batch row 2: label 2 is not a class id in [0, 2)"),
            std::string::npos);
  // Bad or not, elements are checked whatever their row: several at once name the first.
  expect_error(
      [](Rows& r) {
        r.ids[40] = 99999;
        r.mask[50] = 3;
      },
      "batch row 2, position 8: token id 99999");
  EXPECT_EQ(error_of([](Rows&) {}, false), "");
  EXPECT_EQ(error_of([](Rows&) {}, true), "");
}

TEST(Inference, ShorterPaddingGivesTheSameLogits) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingRun run(small_args(4), c, 16, be, GradientMemory::Persistent, RunPhases{false, 4});
  init_weights(c, run.model().layout(), run.host_weights(), 5);
  // Two rows of 5 and 8 real tokens, padded to 8 and to 16.
  auto rows = [](int seq) {
    std::vector<int32_t> ids(size_t(2 * seq), 0), mask(ids.size(), 0), types(ids.size(), 0);
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < (b ? 8 : 5); ++t) {
        ids[size_t(b * seq + t)] = 100 + 7 * t + b;
        mask[size_t(b * seq + t)] = 1;
      }
    return std::array<std::vector<int32_t>, 3>{ids, mask, types};
  };
  std::vector<float> short_logits(4), long_logits(4);
  for (int seq : {8, 16}) {
    auto [ids, mask, types] = rows(seq);
    Batch b;
    b.rows = 2;
    b.seq = seq;
    b.ids = ids.data();
    b.mask = mask.data();
    b.types = types.data();
    run.infer(b, ForwardOutputs{seq == 8 ? short_logits.data() : long_logits.data()});
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(short_logits[size_t(i)], long_logits[size_t(i)], 1e-5) << i;
}

// Examples of lengths 3..16 in a scrambled order, label = length parity.
class RaggedDataset final : public Dataset {
 public:
  int64_t size() const override { return 11; }
  int max_seq_len() const override { return 16; }
  bool float_labels() const override { return false; }
  int example(int64_t i, int32_t* ids, int32_t* types, float* label) const override {
    const int n = 3 + int(i * 7 % 14);
    for (int t = 0; t < n; ++t) ids[t] = 100 + int(i) * 13 + 5 * t, types[t] = 0;
    *label = float(n % 2);
    return n;
  }
  std::string description() const override { return "ragged"; }
};

// Evaluation batches examples by length (longest first, so that batches pad little) and
// returns each example's logits in the dataset's order: those of the example alone.
TEST(Inference, BatchesByLengthAndKeepsTheDatasetsOrder) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingArguments a = small_args(4);
  a.per_device_eval_batch_size = 4;
  TrainingRun run(a, c, 16, be, GradientMemory::Persistent, RunPhases{false, 4});
  init_weights(c, run.model().layout(), run.host_weights(), 5);
  const RaggedDataset data;
  std::vector<float> logits;
  evaluate(run, data, a, "eval", &logits);
  ASSERT_EQ(logits.size(), size_t(2 * data.size()));
  for (int64_t i = 0; i < data.size(); ++i) {
    std::vector<int32_t> ids(16), types(16);
    float label = 0;
    const int n = data.example(i, ids.data(), types.data(), &label);
    std::vector<int32_t> mask(size_t(n), 1);
    Batch b;
    b.rows = 1;
    b.seq = n;
    b.ids = ids.data();
    b.mask = mask.data();
    b.types = types.data();
    std::vector<float> alone(2);
    run.infer(b, ForwardOutputs{alone.data()});
    for (int k = 0; k < 2; ++k) EXPECT_NEAR(logits[size_t(2 * i + k)], alone[size_t(k)], 1e-5) << "example " << i;
  }
}

TEST(Inference, PlannedWithTheRunAndWithinItsMemory) {
  CpuBackend be;
  const ModelConfig c = small_config();
  const TrainingArguments a = small_args(4);
  const MemoryPlan with = TrainingRun::plan(a, c, 16, be, GradientMemory::StepScoped, RunPhases{true, 4});
  const MemoryPlan without = TrainingRun::plan(a, c, 16, be, GradientMemory::StepScoped);
  // Inference keeps one layer's buffers at a time: it fits in the bytes training frees.
  EXPECT_EQ(with.category_bytes[size_t(Category::Activations)],
            without.category_bytes[size_t(Category::Activations)]);
  TrainingRun run(a, c, 16, be, GradientMemory::StepScoped, RunPhases{true, 4});
  for (int k = 0; k < kNumCategories; ++k)
    EXPECT_EQ(run.memory().arena_bytes(Category(k)), with.category_bytes[size_t(k)]);
}

// ---------------------------------------------------------------- gradient checkpointing

TrainingArguments checkpointing_args(TrainingArguments a, bool on, const char* policy) {
  a.gradient_checkpointing = on;
  a.gradient_checkpointing_policy = policy;
  return a;
}

// Recomputation replays the forward's ops and its dropout masks (from (step, site)), so
// the checkpointed runs' losses, gradients, clipped norms, weights and inference logits are
// the plain run's bit for bit, over several updates, with persistent (accumulation) and
// step-scoped gradients; their live buffers never overlap.
// ModernBERT's pre-norm layers too (rotary, GeGLU, a local layer, mean pooling).
class GradientCheckpointing : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(GradientCheckpointing, EqualsThePlainRunBitForBit) {
  const auto& [accumulation, model_type] = GetParam();
  CpuBackend be;
  ModelConfig c = small_config();
  if (model_type == "modernbert") {
    c = ModelConfig::from_json({{"model_type", "modernbert"}, {"vocab_size", 30522}, {"hidden_size", 24},
                                {"num_attention_heads", 2}, {"intermediate_size", 40}, {"max_position_embeddings", 32},
                                {"num_hidden_layers", 3}, {"global_attn_every_n_layers", 2}, {"local_attention", 6},
                                {"classifier_pooling", "mean"}, {"embedding_dropout", 0.1}, {"pad_token_id", 0}},
                               "modernbert");
  }
  c.num_hidden_layers = 3;  // a middle layer: selective recomputes its input from the layer below
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.2;
  TrainingArguments a = small_args(4);
  a.gradient_accumulation_steps = accumulation;
  const ParamLayout layout(c);
  const size_t n = size_t(layout.count());
  std::vector<float> w(n);
  init_weights(c, layout, w.data(), 3);
  auto make_run = [&](bool on, const char* policy) {
    const TrainingArguments args = checkpointing_args(a, on, policy);
    auto run = std::make_unique<TrainingRun>(args, c, 16, be, gradient_memory_for(args), RunPhases{true, 4});
    run->write_weights(w.data());
    run->memory().set_check_overlaps(true);
    return run;
  };
  auto plain = make_run(false, ""), full = make_run(true, ""), selective = make_run(true, "selective");
  ASSERT_EQ(plain->model().checkpointing(), Checkpointing::None);
  ASSERT_EQ(full->model().checkpointing(), Checkpointing::Full);
  ASSERT_EQ(selective->model().checkpointing(), Checkpointing::Selective);
  const std::pair<const char*, TrainingRun*> checkpointed[] = {{"full", full.get()}, {"selective", selective.get()}};

  Rows r(4, 16, 11);
  std::vector<float> expected(n), got(n);
  uint64_t micro = 0;
  for (int step = 0; step < 3; ++step) {
    for (int m = 0; m < accumulation; ++m, ++micro)
      for (TrainingRun* run : {plain.get(), full.get(), selective.get()})
        run->micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4 - m, 1.0f / accumulation,
                        micro);
    plain->read_grads(expected.data());
    const double loss = plain->take_loss_sum();
    for (auto [name, run] : checkpointed) {
      run->read_grads(got.data());
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0) << name << " gradients, step " << step;
      EXPECT_EQ(run->take_loss_sum(), loss) << name << " loss, step " << step;
    }
    for (TrainingRun* run : {plain.get(), full.get(), selective.get()}) run->optimizer_step(1e-3, step + 1);
    for (auto [name, run] : checkpointed)
      EXPECT_EQ(run->last_grad_norm(), plain->last_grad_norm()) << name << " step " << step;
  }
  plain->read_weights(expected.data());
  Batch b;
  b.rows = 4;
  b.seq = 16;
  b.ids = r.ids.data();
  b.mask = r.mask.data();
  b.types = r.types.data();
  std::vector<float> logits(8), other(8);
  plain->infer(b, ForwardOutputs{logits.data()});
  for (auto [name, run] : checkpointed) {
    run->read_weights(got.data());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0) << name << " weights";
    run->infer(b, ForwardOutputs{other.data()});
    EXPECT_EQ(other, logits) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Accumulation, GradientCheckpointing,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values("bert", "modernbert")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_accumulation_" + std::to_string(std::get<0>(info.param));
                         });

// Packed training runs the layers on a batch's attended tokens alone (attention and the
// pooling in the padded layout): the losses, gradients and weights of the padded run within
// fp32 rounding (the products sum fewer rows), for BERT and ModernBERT (rotary, a local
// layer, mean pooling), with every checkpointing policy, on right-padded batches, dense
// ones, and masks that cannot be packed (a hole, a row attending to nothing), which run
// every row. Without dropout: the packed run draws its element-wise masks over the packed
// rows.
class PackedTraining : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(PackedTraining, EqualsThePaddedRun) {
  const auto& [model_type, policy] = GetParam();
  ModelConfig c = small_config();
  if (model_type == "modernbert") c = small_modernbert("mean");
  c.hidden_dropout_prob = 0;
  c.attention_probs_dropout_prob = 0;
  c.classifier_dropout = 0.0f;
  const TrainingArguments a = checkpointing_args(small_args(4), !policy.empty(), policy == "full" ? "" : policy.c_str());
  const ParamLayout layout(c);
  const size_t n = size_t(layout.count());
  std::vector<float> w(n);
  init_weights(c, layout, w.data(), 3);
  CpuBackend packing, padding;
  padding.pack_training = false;
  TrainingRun packed(a, c, 16, packing, gradient_memory_for(a)), padded(a, c, 16, padding, gradient_memory_for(a));
  auto planned = [](TrainingRun& run, const char* name) {
    for (const PlannedBuffer& b : run.memory().plan().buffers)
      if (b.name == name && b.phase == Phase::MicroStep) return true;
    return false;
  };
  EXPECT_TRUE(planned(packed, "packed_rows"));
  EXPECT_FALSE(planned(padded, "packed_rows"));
  for (TrainingRun* run : {&packed, &padded}) {
    run->write_weights(w.data());
    run->memory().set_check_overlaps(true);
  }
  Rows r(4, 16, 11);  // rows of 16, 15, 14 and 13 attended tokens
  std::vector<int32_t> dense(r.mask.size(), 1), holed = r.mask, empty = r.mask;
  holed[3] = 0;                                            // row 0 attends to tokens 0-2 and 4-15
  std::fill(empty.begin() + 16, empty.begin() + 32, 0);  // row 1 attends to nothing
  const std::vector<int32_t>* masks[] = {&r.mask, &dense, &holed, &empty, &r.mask};
  std::vector<float> want(n), got(n);
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int rows = step == 4 ? 3 : 4, seq = step == 4 ? 12 : 16;  // the last batch smaller and shorter
    std::vector<int32_t> ids(size_t(rows * seq)), mask(ids.size()), types(ids.size());
    for (int b = 0; b < rows; ++b)
      for (int t = 0; t < seq; ++t) {
        const size_t from = size_t(b * 16 + t), to = size_t(b * seq + t);
        ids[to] = r.ids[from];
        mask[to] = (*masks[step])[from];
        types[to] = r.types[from];
      }
    const Batch batch{rows, seq, ids.data(), mask.data(), types.data(), r.labels.data(), {}};
    for (TrainingRun* run : {&packed, &padded}) run->micro_step(batch, 1.0f, uint64_t(step));
    padded.read_grads(want.data());
    packed.read_grads(got.data());
    EXPECT_LT(test::norm_rel_error(got.data(), want.data(), int64_t(n)), 1e-5);
    const double loss = padded.take_loss_sum();
    EXPECT_NEAR(packed.take_loss_sum(), loss, 1e-5 * std::abs(loss));
    for (TrainingRun* run : {&packed, &padded}) run->optimizer_step(1e-3, step + 1);
  }
  padded.read_weights(want.data());
  packed.read_weights(got.data());
  EXPECT_LT(test::norm_rel_error(got.data(), want.data(), int64_t(n)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, PackedTraining,
                         ::testing::Combine(::testing::Values("bert", "modernbert"),
                                            ::testing::Values("", "full", "selective")),
                         [](const auto& info) {
                           const std::string& policy = std::get<1>(info.param);
                           return std::get<0>(info.param) + "_" + (policy.empty() ? "plain" : policy);
                         });

// The plan holds what each policy keeps: full (one input per layer and one layer at a
// time) below selective (the products' outputs) below none; inference is planned as
// without checkpointing; the run allocates its plan.
TEST(GradientCheckpointingPlan, KeepsLessActivationMemory) {
  CpuBackend be;
  ModelConfig c = small_config();
  c.num_hidden_layers = 4;
  const TrainingArguments a = small_args(4);
  auto plan = [&](bool on, const char* policy) {
    return TrainingRun::plan(checkpointing_args(a, on, policy), c, 16, be, GradientMemory::Persistent,
                             RunPhases{true, 4});
  };
  const MemoryPlan none = plan(false, ""), full = plan(true, ""), selective = plan(true, "selective");
  auto activations = [](const MemoryPlan& p) { return p.category_bytes[size_t(Category::Activations)]; };
  EXPECT_LT(activations(full), activations(selective));
  EXPECT_LT(activations(selective), activations(none));
  EXPECT_LT(full.total_bytes(), none.total_bytes());
  // Selective keeps three [T, H] buffers less per layer (the context, ln1_out and the
  // output); at the peak, the end of the forward pass, the last layer still holds its own
  // and its input.
  const size_t TH = 4 * 64 * 24;
  EXPECT_GE(activations(none) - activations(selective), TH * size_t(3 * (c.num_hidden_layers - 1) - 1));
  auto inference = [](const MemoryPlan& p) {
    std::vector<std::tuple<std::string, size_t, int64_t>> out;
    for (const PlannedBuffer& b : p.buffers)
      if (b.phase == Phase::Inference) out.emplace_back(b.label(), b.bytes, b.last - b.first);
    return out;
  };
  EXPECT_EQ(inference(full), inference(none));
  EXPECT_EQ(inference(selective), inference(none));
  TrainingRun run(checkpointing_args(a, true, "selective"), c, 16, be, GradientMemory::Persistent, RunPhases{true, 4});
  for (int k = 0; k < kNumCategories; ++k)
    EXPECT_EQ(run.memory().arena_bytes(Category(k)), selective.category_bytes[size_t(k)]) << category_name(Category(k));
}

TEST(TrainerLoop, StepCountsFollowTrainer) {
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.num_train_epochs = 1;
  StepCounts s = count_steps(a, 512);
  EXPECT_EQ(s.total_updates, 128);
  EXPECT_EQ(s.num_train_samples, 512);
  a.gradient_accumulation_steps = 3;  // 128 micro-batches: 42 windows of 3 and one of 2
  s = count_steps(a, 512);
  EXPECT_EQ(s.updates_per_epoch, 43);
  a.per_device_train_batch_size = 5;  // the last batch holds 2 rows
  a.gradient_accumulation_steps = 1;
  a.num_train_epochs = 2.5;
  s = count_steps(a, 512);
  EXPECT_EQ(s.micro_per_epoch, 103);
  EXPECT_EQ(s.total_updates, 258);  // ceil(2.5 * 103)
  EXPECT_EQ(s.epochs, 3);
  a.max_steps = 7;
  s = count_steps(a, 512);
  EXPECT_EQ(s.total_updates, 7);
  EXPECT_EQ(s.num_train_samples, 35);
}

// Only runs of 2^23 tokens a rank or more time their products' candidates.
TEST(TrainerLoop, OnlyLongRunsTimeTheirProducts) {
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.num_train_epochs = 1;
  EXPECT_FALSE(times_products(a, 512, 512));  // the seed: 262,144 tokens
  a.per_device_train_batch_size = 32;
  EXPECT_FALSE(times_products(a, 4096, 512));       // 2^21 tokens
  EXPECT_TRUE(times_products(a, 16384, 512));       // 2^23 exactly
  EXPECT_FALSE(times_products(a, 16383, 512));      // one sample fewer
  EXPECT_FALSE(times_products(a, 16384, 512, 2));   // each of two ranks trains on half
  a.num_train_epochs = 4;
  EXPECT_TRUE(times_products(a, 4096, 512));        // four epochs of 2^21
  EXPECT_TRUE(times_products(a, 8192, 512, 2));     // 2^23 a rank
  a.max_steps = 511;                                // max_steps counts over epochs: 511 x 32 samples
  EXPECT_FALSE(times_products(a, 4096, 512));
  a.max_steps = 512;
  EXPECT_TRUE(times_products(a, 4096, 512));
  a.max_steps = -1;
  a.num_train_epochs = 1;
  EXPECT_FALSE(times_products(a, 16384, 128));      // short sequences: 2^21 tokens
}

// Two micro-batches of 2 with grad_scale 1/2 give the gradients of one batch of 4.
TEST(TrainerLoop, GradientAccumulationAveragesLikeOneBigBatch) {
  CpuBackend be;
  ModelConfig c = small_config(3);
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  Rows r(4, 16, 5);
  r.labels = {0, 2, 1, 2};
  TrainingRun big(small_args(4), c, 16, be), acc(small_args(2), c, 16, be);
  init_weights(c, big.model().layout(), big.host_weights(), 7);
  init_weights(c, acc.model().layout(), acc.host_weights(), 7);
  big.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, 0);
  acc.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 2, 0.5f, 0);
  acc.micro_step(r.ids.data() + 32, r.mask.data() + 32, r.types.data() + 32, r.labels.data() + 2, 2, 0.5f, 1);
  EXPECT_NEAR(big.take_loss_sum(), acc.take_loss_sum(), 1e-6);
  const int64_t n = big.model().layout().count();
  std::vector<float> g_acc(static_cast<size_t>(n)), g_big(static_cast<size_t>(n));
  acc.read_grads(g_acc.data());
  big.read_grads(g_big.data());
  EXPECT_LT(test::norm_rel_error(g_acc.data(), g_big.data(), n), 1e-5);
}

TEST(TrainerLoop, DropoutIsReproducibleAndChangesEachStep) {
  CpuBackend be;
  const ModelConfig c = small_config();
  Rows r(4, 16, 9);
  TrainingRun run(small_args(4), c, 16, be);
  init_weights(c, run.model().layout(), run.host_weights(), 1);
  auto loss = [&](uint64_t step) {
    run.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 4, 1.0f, step);
    return run.take_loss_sum();
  };
  const double a = loss(0), b = loss(0), other = loss(1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
}

TEST(TrainerLoop, LearnsAndLogsLikeTrainer) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingArguments a = small_args(4);
  a.num_train_epochs = 3;
  a.logging_steps = 4;
  a.warmup_steps = 2;
  a.learning_rate = 1e-2;
  TrainingRun run(a, c, 16, be);
  init_weights(c, run.model().layout(), run.host_weights(), a.seed);
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
  std::vector<nlohmann::ordered_json> logs;
  int64_t steps = 0;
  TrainCallbacks cb;
  cb.on_step = [&](int64_t done, int64_t total, const TrainerState&) {
    EXPECT_EQ(total, 12);
    steps = done;
  };
  cb.on_log = [&](const nlohmann::ordered_json& e) { logs.push_back(e); };
  TrainMetrics m = train(run, a, TrainData{*data}, ModelFiles{c}, cb);
  EXPECT_EQ(steps, 12);
  EXPECT_EQ(m.global_step, 12);
  ASSERT_EQ(logs.size(), 3u);
  EXPECT_EQ(logs[0]["step"], 4);
  EXPECT_DOUBLE_EQ(logs[2]["epoch"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(logs[0]["learning_rate"].get<double>(), 1e-2 * 8.0 / 10.0);  // linear decay after step 4
  // All labels are 0 (the seed's data): the loss must fall well below log(2).
  EXPECT_LT(logs[2]["loss"].get<double>(), 0.5 * logs[0]["loss"].get<double>());
  double mean = 0;
  for (const auto& e : logs) mean += e["loss"].get<double>() / 3;
  EXPECT_NEAR(m.train_loss, mean, 1e-6);  // equal windows: train_loss is the mean of the logged losses
  EXPECT_DOUBLE_EQ(m.train_samples_per_second, 48 / m.train_runtime);
}

TEST(TrainerLoop, TimeSplitAndModelFlops) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingArguments a = small_args(4);
  a.max_steps = 3;
  TrainingRun run(a, c, 16, be);
  init_weights(c, run.model().layout(), run.host_weights(), 1);
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
  TrainMetrics m = train(run, a, TrainData{*data}, ModelFiles{c}, {});
  for (StepSpan s : {StepSpan::Forward, StepSpan::Backward, StepSpan::Optimizer})
    EXPECT_GT(m.spans[size_t(s)], 0) << int(s);
  EXPECT_LE(m.spans[0] + m.spans[1] + m.spans[2] + m.spans[3], m.train_runtime);
  EXPECT_DOUBLE_EQ(m.model_flops, 3 * run.model().training_flops(4, 16));
  // Over the attended tokens: a row attending 7 of its 16 counts as a sequence of 7.
  std::vector<int32_t> mask(32, 1);
  std::fill(mask.begin() + 16 + 7, mask.end(), 0);
  EXPECT_DOUBLE_EQ(run.model().training_flops(mask.data(), 2, 16),
                   run.model().training_flops(1, 16) + run.model().training_flops(1, 7));
  // bert-large at 512 tokens: about 1.0 TFLOP per sample, 2 per multiply-add, x3 for
  // training: 24 layers x (2 (4H^2 + 2HI) + 4SH) per token, and the pooler and classifier.
  SequenceClassifier large(*builtin_config("bert-large-uncased"));
  const double per_token = 24.0 * (2 * (4.0 * 1024 * 1024 + 2.0 * 1024 * 4096) + 4.0 * 512 * 1024);
  EXPECT_DOUBLE_EQ(large.training_flops(1, 512), 3 * (512 * per_token + 2 * (1024.0 * 1024 + 1024 * 2)));
  EXPECT_NEAR(large.training_flops(1, 512), 1.005e12, 1e9);
}

TEST(TrainerLoop, DivergenceIsAnErrorNotANumber) {
  CpuBackend be;
  const ModelConfig c = small_config();
  TrainingArguments a = small_args(4);
  a.learning_rate = 1e30;
  a.max_grad_norm = 0;
  a.logging_steps = 1;
  TrainingRun run(a, c, 16, be);
  init_weights(c, run.model().layout(), run.host_weights(), 1);
  std::unique_ptr<Dataset> data = open_dataset(a.dataset, a.seed, false);
  try {
    train(run, a, TrainData{*data}, ModelFiles{c}, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- model files

// hone's own attention takes any mask (cuDNN's, which reads lengths and so needs masks
// padded at the end, is refused in tests/gpu/fused_attention_gpu_test.cpp). On the CPU a
// bf16 run can be planned and built, and its first half-precision op says the CPU computes
// in F32.
TEST(MixedPrecisionRun, TakesAnyMaskAndRefusesHalfOpsOnTheCpu) {
  TrainingArguments a = small_args(2);
  a.bf16 = true;
  Rows r(2, 8, 1);
  r.mask[8] = 0;  // row 1 starts with padding
  CpuBackend any_mask;
  TrainingRun left_padded(a, small_config(), 8, any_mask);
  try {
    left_padded.micro_step(r.ids.data(), r.mask.data(), r.types.data(), r.labels.data(), 2, 1.0f, 0);
    FAIL() << "the CPU computed in bf16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the CPU backend computes in F32 only"), std::string::npos) << e.what();
  }
}

// The run's streamed save (pieces through two alternating buffers) writes the file that
// saving a host copy of its weights writes.
TEST(ModelFiles, StreamedSaveEqualsSavingTheHostCopy) {
  CpuBackend be;
  const ModelConfig c = small_config(3);
  TrainingRun run(small_args(2), c, 16, be);
  run.init_weights(9);
  std::vector<float> w(size_t(run.model().layout().count()));
  run.read_weights(w.data());
  test::TempDir dir;
  save_pretrained(dir.path + "/host", c, run.model().layout(), w.data());
  run.save_model(dir.path + "/streamed", 1000);
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string want = bytes(dir.path + "/host/model.safetensors");
  EXPECT_GT(want.size(), size_t(run.model().layout().count()) * 4);
  EXPECT_EQ(bytes(dir.path + "/streamed/model.safetensors"), want);
  EXPECT_EQ(bytes(dir.path + "/streamed/config.json"), bytes(dir.path + "/host/config.json"));
}

TEST(ModelFiles, SaveThenLoadIsBitExact) {
  test::TempDir dir;
  const ModelConfig c = small_config(3);
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count())), back(w.size(), -1.0f);
  init_weights(c, layout, w.data(), 11);
  save_pretrained(dir.path, c, layout, w.data());
  ModelSource src = resolve_model(dir.path);
  EXPECT_EQ(src.config.num_labels, 3);
  LoadReport r = load_weights(src.weights_path, src.config, layout, back.data(), 0);
  EXPECT_TRUE(r.initialized.empty());
  EXPECT_TRUE(r.unused.empty());
  EXPECT_EQ(std::memcmp(w.data(), back.data(), w.size() * 4), 0);
}

TEST(ModelFiles, InitIsHuggingFaceStyle) {
  const ModelConfig c = small_config();
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 3);
  const ParamEntry& word = layout.at("bert.embeddings.word_embeddings.weight");
  for (int i = 0; i < c.hidden_size; ++i) EXPECT_EQ(w[size_t(word.offset + i)], 0.0f);  // padding row
  double sum = 0, sq = 0;
  const int64_t n = word.shape.numel() - c.hidden_size;
  for (int64_t i = c.hidden_size; i < word.shape.numel(); ++i) {
    sum += w[size_t(word.offset + i)];
    sq += double(w[size_t(word.offset + i)]) * w[size_t(word.offset + i)];
  }
  EXPECT_NEAR(sum / double(n), 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sq / double(n)), c.initializer_range, 1e-3);
  EXPECT_EQ(w[size_t(layout.at("bert.encoder.layer.0.output.LayerNorm.weight").offset)], 1.0f);
  EXPECT_EQ(w[size_t(layout.at("classifier.bias").offset)], 0.0f);
}

// A BertModel-style checkpoint: no "bert." prefix, legacy gamma/beta, no pooler or
// classifier, plus pre-training heads the classifier does not use.
TEST(ModelFiles, LoadsBaseModelCheckpointsAndReportsWhatItInitialised) {
  test::TempDir dir;
  const ModelConfig c = small_config();
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 5);
  std::vector<NamedTensor> tensors;
  std::vector<float> extra(7, 1.0f);
  for (const ParamEntry& e : layout.entries()) {
    if (e.name.rfind("bert.", 0) != 0 || e.name.find("pooler") != std::string::npos) continue;
    std::string name = e.name.substr(5);
    if (name.find("LayerNorm.weight") != std::string::npos) name.replace(name.size() - 6, 6, "gamma");
    if (name.find("LayerNorm.bias") != std::string::npos) name.replace(name.size() - 4, 4, "beta");
    tensors.push_back({name, Tensor{w.data() + e.offset, DType::F32, e.shape, Device::CPU}});
  }
  tensors.push_back({"cls.predictions.bias", Tensor{extra.data(), DType::F32, {7}, Device::CPU}});
  const std::string path = dir.path + "/model.safetensors";
  write_safetensors(path, tensors);
  std::vector<float> back(w.size());
  LoadReport r = load_weights(path, c, layout, back.data(), 5);
  EXPECT_EQ(r.initialized, (std::vector<std::string>{"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                                                      "classifier.weight", "classifier.bias"}));
  EXPECT_EQ(r.unused, std::vector<std::string>{"cls.predictions.bias"});
  const ParamEntry& q = layout.at("bert.encoder.layer.1.attention.self.query.weight");
  EXPECT_EQ(std::memcmp(w.data() + q.offset, back.data() + q.offset, size_t(q.shape.numel()) * 4), 0);
  const ParamEntry& ln = layout.at("bert.embeddings.LayerNorm.weight");
  EXPECT_EQ(back[size_t(ln.offset)], w[size_t(ln.offset)]);
}

// Writes the parameters of `layout` in `w` to `path` under the names `rename` gives; "" leaves one out.
void write_renamed(const std::string& path, const ParamLayout& layout, float* w,
                   const std::function<std::string(const std::string&)>& rename) {
  std::vector<NamedTensor> tensors;
  for (const ParamEntry& e : layout.entries())
    if (std::string name = rename(e.name); !name.empty())
      tensors.push_back({name, Tensor{w + e.offset, DType::F32, e.shape, Device::CPU}});
  write_safetensors(path, tensors);
}

std::string load_error(const std::string& path, const ModelConfig& c, const ParamLayout& layout) {
  std::vector<float> w(size_t(layout.count()));
  try {
    load_weights(path, c, layout, w.data(), 0);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Only the task head may be initialised anew: an encoder without some of its tensors would
// fine-tune from noise where the checkpoint should have been.
TEST(ModelFiles, MissingEncoderTensorsAreAnError) {
  test::TempDir dir;
  const ModelConfig c = small_config();
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  const std::string path = dir.path + "/model.safetensors";
  write_renamed(path, layout, w.data(), [](const std::string& n) {
    return n == "bert.embeddings.LayerNorm.bias" || n == "bert.encoder.layer.1.output.dense.weight" ? "" : n;
  });
  std::string m = load_error(path, c, layout);
  // 5 embedding tensors and 16 per layer.
  EXPECT_NE(m.find(path + ": lacks 2 of the model's 37 embedding and encoder tensors "
                   "('bert.embeddings.LayerNorm.bias', 'bert.encoder.layer.1.output.dense.weight')"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("does not use"), std::string::npos) << m;

  // Another model's names: nothing matches, and the message shows what the file holds.
  write_renamed(path, layout, w.data(), [](const std::string& n) {
    return n.starts_with("bert.") ? "roberta." + n.substr(5) : n;
  });
  m = load_error(path, c, layout);
  EXPECT_NE(m.find(path + ": lacks 37 of the model's 37 embedding and encoder tensors "
                   "('bert.embeddings.word_embeddings.weight', 'bert.embeddings.position_embeddings.weight', "
                   "'bert.embeddings.token_type_embeddings.weight' and 34 more), and has 39 tensors the model "
                   "does not use ('roberta.embeddings.word_embeddings.weight'"),
            std::string::npos) << m;

  // A checkpoint of fewer layers than config.json says.
  ModelConfig deeper = small_config();
  deeper.num_hidden_layers = 3;
  ParamLayout deeper_layout(deeper);
  write_renamed(path, layout, w.data(), [](const std::string& n) { return n; });
  m = load_error(path, deeper, deeper_layout);
  EXPECT_NE(m.find("lacks 16 of the model's 53 embedding and encoder tensors ('bert.encoder.layer.2."),
            std::string::npos) << m;
}

// With --ignore_mismatched_sizes any tensor of another shape is initialised anew, as in
// transformers, the embeddings' included.
TEST(ModelFiles, IgnoreMismatchedSizesReinitialisesEncoderTensorsToo) {
  test::TempDir dir;
  const ModelConfig c = small_config();
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 3);
  std::vector<NamedTensor> tensors;
  std::vector<float> small_vocab(size_t(100 * c.hidden_size), 1.0f);
  for (const ParamEntry& e : layout.entries()) {
    if (e.name.starts_with("classifier.")) continue;
    if (e.name == "bert.embeddings.word_embeddings.weight")
      tensors.push_back({e.name, Tensor{small_vocab.data(), DType::F32, {100, c.hidden_size}, Device::CPU}});
    else
      tensors.push_back({e.name, Tensor{w.data() + e.offset, DType::F32, e.shape, Device::CPU}});
  }
  const std::string path = dir.path + "/model.safetensors";
  write_safetensors(path, tensors);
  EXPECT_NE(load_error(path, c, layout).find("has shape [100, 24]"), std::string::npos);
  std::vector<float> back(w.size());
  LoadReport r = load_weights(path, c, layout, back.data(), 3, true);
  EXPECT_EQ(r.mismatched, std::vector<std::string>{"bert.embeddings.word_embeddings.weight"});
  EXPECT_EQ(r.initialized, (std::vector<std::string>{"bert.embeddings.word_embeddings.weight", "classifier.weight",
                                                      "classifier.bias"}));
  EXPECT_EQ(std::memcmp(w.data(), back.data(), w.size() * 4), 0);  // the same seed initialises the same
}

TEST(ModelFiles, WrongShapeNamesFileAndTensor) {
  test::TempDir dir;
  const ModelConfig c = small_config();
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  std::vector<NamedTensor> tensors;
  for (const ParamEntry& e : layout.entries()) {
    Shape s = e.shape;
    if (e.name == "classifier.weight") s = {3, c.hidden_size};  // a 3-label head for a 2-label config
    if (s.numel() > e.shape.numel()) continue;
    tensors.push_back({e.name, Tensor{w.data() + e.offset, DType::F32, s, Device::CPU}});
  }
  std::vector<float> head(size_t(3 * c.hidden_size));
  tensors.back() = {"classifier.weight", Tensor{head.data(), DType::F32, {3, c.hidden_size}, Device::CPU}};
  const std::string path = dir.path + "/model.safetensors";
  write_safetensors(path, tensors);
  try {
    load_weights(path, c, layout, w.data(), 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("classifier.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[3, 24]"), std::string::npos) << m;
  }
}

// check_weights_fit: the errors of load_weights from the header alone, before the model the
// config describes is allocated (a config.json whose vocab_size says 10^9 made hone
// allocate hundreds of GB for its weights before load_weights saw the file's shapes).
TEST(ModelFiles, CheckWeightsFitRefusesAModelTheFileDoesNotHold) {
  test::TempDir dir;
  const ModelConfig c = small_config();
  const std::string path = test::save_random_model(dir.path + "/m", c, 1) + "/model.safetensors";
  check_weights_fit(path, c);  // the model the file holds
  ModelConfig huge = c;
  huge.vocab_size = 1000000000;
  try {
    check_weights_fit(path, huge);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path + ": tensor 'bert.embeddings.word_embeddings.weight' has shape"), std::string::npos) << m;
    EXPECT_NE(m.find("[1000000000, "), std::string::npos) << m;
  }
  check_weights_fit(path, huge, true);  // --ignore_mismatched_sizes: initialised anew
  ModelConfig deeper = c;
  deeper.num_hidden_layers = c.num_hidden_layers + 1;
  try {
    check_weights_fit(path, deeper);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lacks 16 of the model's"), std::string::npos) << e.what();
  }
}

TEST(ModelFiles, UnknownModelNameListsBuiltins) {
  try {
    resolve_model("/no/such/dir");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bert-large-uncased"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hone
