// Optimizers as components: --optim and --optim_args, each optimizer against the update
// of the library Trainer builds (tests/fixtures/optim), and its state in checkpoints.
#include <gtest/gtest.h>

#include <tuple>

#include "hone/config.h"
#include "hone/cpu_backend.h"
#include "hone/error.h"
#include "hone/optimizer.h"
#include "optim_fixture.h"

namespace hone {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The half copy of a mixed-precision run starts at half_begin (after the embedding
// tables): ranges before it have no copy to write, ranges after it are shifted, and a
// range across it is a caller's error.
TEST(OptimizerTarget, HalfRowsStartAtHalfBegin) {
  const ModelConfig c = *builtin_config("bert-tiny");
  const ParamLayout layout(c);
  std::vector<uint16_t> half_data(size_t(layout.count() - layout.tables_end()));
  const std::vector<Tensor> grads;
  OptimizerTarget t{layout, Tensor{}, Tensor{half_data.data(), DType::BF16, Shape{int64_t(half_data.size())}, Device::CPU},
                    grads, Tensor{}, Tensor{}};
  t.half_begin = layout.tables_end();
  const int64_t b = t.half_begin;
  EXPECT_EQ(t.half_rows(0, b).data, nullptr);
  const Tensor after = t.half_rows(b + 4, b + 10);
  EXPECT_EQ(after.data, half_data.data() + 4);
  EXPECT_EQ(after.numel(), 6);
  EXPECT_EQ(t.half_of(layout.entries()[0]).data, nullptr);  // the word table
  EXPECT_NE(error_of([&] { t.half_rows(b - 1, b + 1); }).find("straddle"), std::string::npos);
}

TEST(OptimArgs, ParsesAsTrainerDoes) {
  EXPECT_TRUE(parse_optim_args("").empty());
  const OptimArgs a = parse_optim_args(" momentum = 0.9, nesterov=True ");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a.at("momentum"), "0.9");
  EXPECT_EQ(a.at("nesterov"), "True");
  for (const char* bad : {"momentum", "=0.9", "a=1,,b=2", "a=1=2"})
    EXPECT_NE(error_of([&] { parse_optim_args(bad); }).find("--optim_args"), std::string::npos) << bad;
}

TEST(OptimArgs, UnknownKeysAndOptimizersAreErrors) {
  TrainingArguments a;
  a.optim_args = "momentum=0.9";
  const std::string keys = error_of([&] { validate_optimizer(a); });
  EXPECT_NE(keys.find("adamw_torch takes no arguments"), std::string::npos) << keys;
  EXPECT_NE(keys.find("momentum"), std::string::npos) << keys;
  a.optim = "galore_adamw";
  a.optim_args.clear();
  const std::string name = error_of([&] { validate_optimizer(a); });
  EXPECT_NE(name.find("adamw_torch_fused"), std::string::npos) << name;
}

TEST(OptimArgs, SgdAndAdagradTakeTrainersKeysAndTorchsRules) {
  TrainingArguments a;
  auto error = [&](const std::string& optim, const std::string& args) {
    a.optim = optim;
    a.optim_args = args;
    return error_of([&] { validate_optimizer(a); });
  };
  EXPECT_EQ(error("sgd", "momentum=0.9,dampening=0.1"), "");
  EXPECT_EQ(error("sgd", "momentum=0.9,nesterov=True"), "");
  EXPECT_EQ(error("adagrad", "lr_decay=0.01,eps=1e-8"), "");
  EXPECT_NE(error("sgd", "nesterov=true").find("momentum > 0"), std::string::npos);
  EXPECT_NE(error("sgd", "momentum=0.9,dampening=0.5,nesterov=1").find("dampening 0"), std::string::npos);
  EXPECT_NE(error("sgd", "momentum=x").find("momentum=x"), std::string::npos);
  EXPECT_NE(error("sgd", "nesterov=maybe").find("true or false"), std::string::npos);
  EXPECT_NE(error("sgd", "weight_decay=0.1").find("--weight_decay"), std::string::npos);
  EXPECT_NE(error("adagrad", "momentum=0.9").find("has no setting 'momentum'; it takes"), std::string::npos);
  EXPECT_NE(error("lion_32bit", "beta1=0.9").find("takes no arguments"), std::string::npos);
  // The state each keeps, by name, as the checkpoint holds it.
  a.optim_args.clear();
  for (auto [optim, args, names] : {std::tuple{"sgd", "", std::vector<std::string>{}},
                                    std::tuple{"sgd", "momentum=0.9", std::vector<std::string>{"momentum_buffer"}},
                                    std::tuple{"adagrad", "", std::vector<std::string>{"sum"}},
                                    std::tuple{"lion_32bit", "", std::vector<std::string>{"exp_avg"}}}) {
    a.optim = optim;
    a.optim_args = args;
    std::unique_ptr<Optimizer> o = make_optimizer(a);
    MemoryPlanner plan;
    plan.begin_phase(Phase::Setup);
    o->take_state(plan, ParamLayout(ModelConfig{}));
    plan.end_phase();
    std::vector<std::string> got;
    for (const StateTensor& t : o->state()) got.push_back(t.name);
    EXPECT_EQ(got, names) << optim << " " << args;
    EXPECT_EQ(plan.finish().category_bytes[size_t(Category::OptimizerState)],
              names.empty() ? 0 : (ParamLayout(ModelConfig{}).count() * 4 + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment)
        << optim;
  }
}

// Each registered optimizer's updates against its fixture, on the CPU reference.
struct FixtureCase {
  const char* name;
  double tolerance;  // max error over each parameter's largest value, per update
};

class OptimizerFixture : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(OptimizerFixture, FollowsTheLibraryTrainerBuilds) {
  const test::OptimFixture f(GetParam().name);
  CpuBackend be;
  const auto got = test::replay_optim_fixture(f, be);
  for (int k = 0; k < f.steps; ++k) {
    // The parameters moved, so the comparison is not of the initial values.
    EXPECT_NE(f.after[size_t(k)], f.init);
    EXPECT_LE(test::worst_param_error(f, got[size_t(k)], f.after[size_t(k)]), GetParam().tolerance)
        << "update " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, OptimizerFixture,
                         ::testing::Values(FixtureCase{"adamw_torch", 1e-6}, FixtureCase{"adafactor", 1e-6},
                                           FixtureCase{"sgd", 1e-6},
                                           FixtureCase{"sgd_nesterov", 1e-6}, FixtureCase{"sgd_dampening", 1e-6},
                                           FixtureCase{"adagrad", 1e-6}, FixtureCase{"lion_32bit", 1e-6},
                                           // bitsandbytes' __powf: 3e-5 of AdamW's first steps
                                           FixtureCase{"adamw_bnb_8bit", 5e-5}, FixtureCase{"adamw_8bit", 5e-5},
                                           FixtureCase{"lion_8bit", 5e-7},
                                           FixtureCase{"adamw_8bit_blockwise", 5e-5},
                                           FixtureCase{"lion_8bit_blockwise", 5e-7}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace hone
