// Optimizers as components: --optim and --optim_args, each optimizer against the update
// of the library Trainer builds (tests/fixtures/optim), and its state in checkpoints.
#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Cpu, OptimizerFixture, ::testing::Values(FixtureCase{"adamw_torch", 1e-6}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace hone
