#include "hone/memory.h"

#include "hone/cpu_backend.h"

#include <gtest/gtest.h>

namespace hone {
namespace {

TEST(MemoryPlan, BuffersWithDisjointLifetimesShareBytes) {
  MemoryPlanner p;
  p.begin_phase(Phase::Setup);
  p.take(Category::Weights, "w", -1, DType::F32, {1000});
  p.end_phase();
  p.begin_phase(Phase::MicroStep);
  Tensor a = p.take(Category::Workspace, "a", -1, DType::F32, {1024});  // 4096 bytes
  p.release(a);
  Tensor b = p.take(Category::Workspace, "b", -1, DType::F32, {512});  // fits where a was
  Tensor c = p.take(Category::Workspace, "c", -1, DType::F32, {512});  // alive with b
  p.release(b);
  p.release(c);
  p.end_phase();
  MemoryPlan plan = p.finish();
  EXPECT_EQ(plan.category_bytes[size_t(Category::Weights)], 4096u);
  EXPECT_EQ(plan.category_bytes[size_t(Category::Workspace)], 4096u);
  EXPECT_EQ(plan.unshared_bytes()[size_t(Category::Workspace)], 8192u);
  EXPECT_NE(plan.buffers[2].offset, plan.buffers[3].offset);
}

TEST(MemoryPlan, ReplayServesPlannedOffsetsAndRejectsDivergence) {
  MemoryPlanner p;
  p.begin_phase(Phase::MicroStep);
  Tensor a = p.take(Category::Activations, "a", 0, DType::F32, {64});
  p.release(a);
  p.end_phase();
  CpuBackend be;
  PlannedMemory mem(p.finish(), be);
  mem.set_check_overlaps(true);
  for (int step = 0; step < 3; ++step) {
    mem.begin_phase(Phase::MicroStep);
    Tensor t = mem.take(Category::Activations, "a", 0, DType::F32, {32});  // smaller is fine
    EXPECT_NE(t.data, nullptr);
    mem.release(t);
    mem.end_phase();
  }
  mem.begin_phase(Phase::MicroStep);
  EXPECT_THROW(mem.take(Category::Activations, "b", 0, DType::F32, {32}), Error);
}

TEST(MemoryPlan, UnreleasedStepBufferIsAnError) {
  MemoryPlanner p;
  p.begin_phase(Phase::MicroStep);
  p.take(Category::Workspace, "leak", -1, DType::F32, {8});
  EXPECT_THROW(p.end_phase(), Error);
}

}  // namespace
}  // namespace hone
