// hone profile: the op timings add up to the steps, the op costs to the model's FLOPs, and
// the table, JSON, trace and picture describe the same ops.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "hone/cpu_backend.h"
#include "hone/profile.h"
#include "hone/trainer.h"
#include "test_util.h"

namespace hone {
namespace {

constexpr int kBatch = 4, kSeq = 16, kSteps = 3;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 30522;  // the synthetic data's ids
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 48;
  c.max_position_embeddings = 32;
  return c;
}

// Three profiled training steps of a tiny BERT on the CPU (the first step unprofiled).
struct ProfiledRun {
  CpuBackend be;
  TrainingArguments args;
  std::unique_ptr<TrainingRun> run;
  Profile profile;

  ProfiledRun() {
    args.per_device_train_batch_size = kBatch;
    args.dataset = "synthetic:16x16";
    args.cuda_graphs = false;
    run = std::make_unique<TrainingRun>(args, tiny_config(), kSeq, be);
    run->init_weights(1);
    SyntheticDataset data(kBatch, kSeq, 3, false);
    std::vector<int32_t> ids(kBatch * kSeq), types(ids.size()), mask(ids.size(), 1);
    std::vector<float> labels(kBatch);
    for (int b = 0; b < kBatch; ++b) data.example(b, &ids[size_t(b * kSeq)], &types[size_t(b * kSeq)], &labels[size_t(b)]);
    OpProfiler profiler(be);
    for (int step = 0; step <= kSteps; ++step) {
      if (step == 1) profiler.start();
      if (step > 1) profiler.next_step();
      run->micro_step(ids.data(), mask.data(), types.data(), labels.data(), kBatch, 1.0f, uint64_t(step));
      run->optimizer_step(1e-4, step + 1);
    }
    profile = profiler.finish();
  }
};

const ProfiledRun& profiled() {
  static ProfiledRun r;
  return r;
}

TEST(OpProfile, OpsAndTheGapsBetweenThemAddUpToTheSteps) {
  const Profile& p = profiled().profile;
  ASSERT_EQ(p.steps(), kSteps);
  ASSERT_FALSE(p.ops.empty());
  // Stamps are taken in order: no op starts before the one before it ended.
  for (size_t i = 1; i < p.ops.size(); ++i) EXPECT_GE(p.ops[i].start, p.ops[i - 1].start + p.ops[i - 1].seconds);
  const Roofline roof{1e11, 1e10, "", ""};
  const ProfileSummary s = summarize(p, roof);
  double sum = 0;
  for (int c = 0; c < kNumOpClasses; ++c) sum += s.class_total(OpClass(c)).seconds;
  for (double g : s.gap_seconds) sum += g;
  EXPECT_NEAR(sum, p.seconds(), 1e-9 * p.seconds());
  EXPECT_NEAR(s.step_seconds * kSteps, p.seconds(), 1e-12);
  // Every step runs the same ops.
  EXPECT_EQ(p.ops.size() % kSteps, 0u);
  for (OpClass c : {OpClass::Contraction, OpClass::Attention, OpClass::Normalization, OpClass::Elementwise,
                    OpClass::Optimizer})
    EXPECT_GT(s.class_total(c).calls, 0) << op_class_name(c);
}

TEST(OpProfile, ProductsAndAttentionCountTheModelsFlops) {
  const ProfiledRun& r = profiled();
  double flops = 0;
  for (const TimedOp& op : r.profile.ops)
    if (op.cls == OpClass::Contraction || op.cls == OpClass::Attention) flops += op.cost.flops;
  const double model = r.run->model().training_flops(kBatch, kSeq);
  EXPECT_NEAR(flops / kSteps, model, 1e-9 * model);
}

// Right-padded rows run packed (training and inference): the products and attention count
// the attended tokens' work, each sequence's attention at its own length.
TEST(OpProfile, PackedBatchesCountTheAttendedTokensFlops) {
  CpuBackend be;
  TrainingArguments args;
  args.per_device_train_batch_size = kBatch;
  args.cuda_graphs = false;
  TrainingRun run(args, tiny_config(), kSeq, be, GradientMemory::Persistent, RunPhases{true, kBatch});
  run.init_weights(1);
  const int lengths[kBatch] = {16, 3, 9, 1};
  std::vector<int32_t> ids(kBatch * kSeq, 0), types(ids.size(), 0), mask(ids.size(), 0);
  for (int b = 0; b < kBatch; ++b)
    for (int t = 0; t < lengths[b]; ++t) {
      ids[size_t(b * kSeq + t)] = 1000 + 7 * t + b;
      mask[size_t(b * kSeq + t)] = 1;
    }
  std::vector<float> labels(kBatch, 0.0f), logits(kBatch * 2);
  auto flops_of = [&](const Profile& p, const char* packed_op) {
    double flops = 0;
    bool packed = false;
    for (const TimedOp& op : p.ops) {
      if (op.cls == OpClass::Contraction || op.cls == OpClass::Attention) flops += op.cost.flops;
      if (std::strcmp(op.name, packed_op) == 0) {
        packed = true;
        EXPECT_GT(op.cost.flops, 0) << op.name;
      }
    }
    EXPECT_TRUE(packed) << "no " << packed_op;
    return flops;
  };
  OpProfiler profiler(be);
  profiler.start();
  run.micro_step(ids.data(), mask.data(), types.data(), labels.data(), kBatch, 1.0f, 1);
  const double model = run.model().training_flops(mask.data(), kBatch, kSeq);
  EXPECT_NEAR(flops_of(profiler.finish(), "attention_backward_packed"), model, 1e-9 * model);

  // Inference: the attention of every layer but the last, whose reader takes only the first
  // query's row.
  profiler.start();
  run.infer(Batch{kBatch, kSeq, ids.data(), mask.data(), types.data(), nullptr, {}}, ForwardOutputs{logits.data()});
  const Profile p = profiler.finish();
  double attention = 0;
  for (const TimedOp& op : p.ops)
    if (std::strcmp(op.name, "attention_forward_packed") == 0) attention += op.cost.flops;
  const ModelConfig c = tiny_config();
  double pairs = 0, first_rows = 0;  // the last layer's attention: the first query of each
  for (int n : lengths) pairs += double(n) * n, first_rows += n;
  EXPECT_DOUBLE_EQ(attention, 4.0 * c.hidden_size * ((c.num_hidden_layers - 1) * pairs + first_rows));
  EXPECT_GT(flops_of(p, "attention_forward_packed"), attention);
}

TEST(OpProfile, EachOpIsInThePhaseThatRanIt) {
  std::set<std::string> seen;
  for (const TimedOp& op : profiled().profile.ops) {
    const std::string name = op.name;
    seen.insert(name);
    if (name.ends_with("_forward")) {
      EXPECT_EQ(op.phase, StepSpan::Forward) << name;
    } else if (name.ends_with("_backward")) {
      EXPECT_EQ(op.phase, StepSpan::Backward) << name;
    } else if (name == "adamw" || name == "clip_coefficient") {
      EXPECT_EQ(op.phase, StepSpan::Optimizer) << name;
    }
  }
  for (const char* name : {"linear_forward", "linear_backward", "attention_forward", "attention_backward",
                           "cross_entropy", "adamw", "sum_squares"})
    EXPECT_TRUE(seen.count(name)) << name;
}

TEST(OpProfile, RooflineBoundIsTheSlowerOfComputeAndMemory) {
  const Roofline r{1e12, 1e9, "", ""};
  EXPECT_DOUBLE_EQ(r.bound_seconds({1e12, 0}), 1.0);
  EXPECT_DOUBLE_EQ(r.bound_seconds({0, 1e9}), 1.0);
  EXPECT_DOUBLE_EQ(r.bound_seconds({1e12, 2e9}), 2.0);
}

TEST(OpProfile, GapsCountInThePhaseOfTheOpAfterThem) {
  Profile p;
  p.step_bounds = {0.0, 1.0};
  p.ops.push_back({"linear_forward", OpClass::Contraction, StepSpan::Forward, {2e9, 0}, 0.1, 0.2});
  p.ops.push_back({"linear_backward", OpClass::Contraction, StepSpan::Backward, {4e9, 0}, 0.5, 0.1});
  const ProfileSummary s = summarize(p, Roofline{1e10, 1e9, "", ""});
  EXPECT_NEAR(s.gap_seconds[size_t(StepSpan::Forward)], 0.1, 1e-12);
  EXPECT_NEAR(s.gap_seconds[size_t(StepSpan::Backward)], 0.2 + 0.4, 1e-12);  // before it, and the step's tail
  const OpTotals c = s.class_total(OpClass::Contraction);
  EXPECT_NEAR(c.seconds, 0.3, 1e-12);
  EXPECT_NEAR(c.roofline_fraction(), (0.2 + 0.4) / 0.3, 1e-12);  // the bound: 6e9 FLOPs at 1e10
  ASSERT_EQ(s.by_op.size(), 2u);
  EXPECT_EQ(s.by_op[0].name, "linear_forward");  // most time first
}

TEST(OpProfile, TableJsonTraceAndPictureDescribeTheSameOps) {
  const Profile& p = profiled().profile;
  const Roofline roof{1e11, 1e10, "fp32 product", "copy"};
  const ProfileSummary s = summarize(p, roof);
  const ProfileContext ctx{"tiny & <odd> name", "cpu", "wall clock"};

  const nlohmann::ordered_json trace = chrome_trace(p, ctx);
  size_t ops = 0;
  double op_us = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == 3) ++ops, op_us += e["dur"].get<double>();
  EXPECT_EQ(ops, p.ops.size());
  double op_seconds = 0;
  for (const TimedOp& op : p.ops) op_seconds += op.seconds;
  EXPECT_NEAR(op_us, op_seconds * 1e6, 1e-6 * op_seconds * 1e6);

  const nlohmann::ordered_json j = profile_json(s, roof, ctx);
  EXPECT_EQ(j["steps"], kSteps);
  double shares = 0;
  for (const auto& [name, c] : j["classes"].items()) shares += c["share"].get<double>();
  EXPECT_NEAR(shares, 1.0, 1e-3);
  EXPECT_EQ(j["ops"].size(), s.by_op.size());

  const std::string table = profile_table(s, roof, ctx);
  for (const char* row : {"contractions", "attention", "normalizations", "element-wise", "optimizer", "between ops",
                          "step", "linear_backward"})
    EXPECT_NE(table.find(row), std::string::npos) << row;

  const std::string svg = profile_svg(s, roof, ctx);
  EXPECT_TRUE(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_NE(svg.find("tiny &amp; &lt;odd&gt; name"), std::string::npos);
  EXPECT_EQ(svg.find("tiny & <odd>"), std::string::npos);
  EXPECT_NE(svg.find("forward contractions"), std::string::npos);
}

TEST(OpProfile, CommandWritesItsFilesAndRefusesNoSteps) {
  test::TempDir dir;
  const test::CommandResult r =
      test::run_hone("profile --model_name_or_path bert-tiny --dataset synthetic:32x16 --device cpu "
                     "--per_device_train_batch_size 4 --profile_steps 2 --skip_steps 1 --output_dir " +
                     dir.path);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("operation anatomy of 2 steps"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not used by a profile"), std::string::npos) << r.out;
  for (const char* f : {"profile.json", "profile_trace.json", "profile.svg"}) {
    std::ifstream in(dir.path + "/" + f);
    EXPECT_TRUE(in.good()) << f;
  }
  std::ifstream in(dir.path + "/profile.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_GT(j["roofline"]["tflops"].get<double>(), 0);
  // Train's flags that a profile does not use are named, not silently dropped.
  const test::CommandResult noted =
      test::run_hone("profile --model_name_or_path bert-tiny --dataset synthetic:32x16 --device cpu "
                     "--per_device_train_batch_size 4 --profile_steps 1 --skip_steps 0 --max_steps 9 "
                     "--report_to tensorboard --output_dir " + dir.path);
  ASSERT_EQ(noted.code, 0) << noted.out;
  EXPECT_NE(noted.out.find("not used by a profile: --max_steps"), std::string::npos) << noted.out;
  EXPECT_NE(noted.out.find("--report_to"), std::string::npos) << noted.out;
  const test::CommandResult none = test::run_hone("profile --model_name_or_path bert-tiny --device cpu --profile_steps 0");
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.out.find("profile_steps"), std::string::npos) << none.out;
}

}  // namespace
}  // namespace hone
