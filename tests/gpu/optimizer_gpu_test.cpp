// Every optimizer's CUDA kernels against the library Trainer builds (tests/fixtures/optim)
// and against the CPU reference, update by update.
#include <gtest/gtest.h>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "optim_fixture.h"

namespace hone {
namespace {

struct GpuFixtureCase {
  const char* name;
  double vs_library;  // max error over each parameter's largest value, per update
  double vs_cpu;
};

class OptimizerGpuFixture : public ::testing::TestWithParam<GpuFixtureCase> {};

TEST_P(OptimizerGpuFixture, FollowsTheLibraryAndTheCpu) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const test::OptimFixture f(GetParam().name);
  std::unique_ptr<Backend> gpu = make_cuda_backend({});
  CpuBackend cpu;
  const auto got = test::replay_optim_fixture(f, *gpu);
  const auto ref = test::replay_optim_fixture(f, cpu);
  for (int k = 0; k < f.steps; ++k) {
    EXPECT_LE(test::worst_param_error(f, got[size_t(k)], f.after[size_t(k)]), GetParam().vs_library)
        << "update " << k + 1;
    EXPECT_LE(test::worst_param_error(f, got[size_t(k)], ref[size_t(k)]), GetParam().vs_cpu) << "update " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, OptimizerGpuFixture,
                         ::testing::Values(GpuFixtureCase{"adamw_torch", 1e-6, 1e-7}, GpuFixtureCase{"sgd", 1e-6, 0},
                                           GpuFixtureCase{"sgd_nesterov", 1e-6, 0},
                                           GpuFixtureCase{"sgd_dampening", 1e-6, 0},
                                           GpuFixtureCase{"adagrad", 1e-6, 0}, GpuFixtureCase{"lion_32bit", 1e-6, 0}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace hone
