// gpu_memory and the `hone env` report on a real GPU.
#include "hone/gpu_info.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cuda/flash_hopper.h"
#include "hone/cuda.h"
#include "test_util.h"

namespace hone {
namespace {

class GpuInfo : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  }
  int devices = 0;
};

TEST_F(GpuInfo, EveryDeviceReportsConsistentMemory) {
  for (int dev = 0; dev < devices; ++dev) {
    const std::optional<GpuMemory> m = gpu_memory(dev);
    ASSERT_TRUE(m) << "device " << dev;
    EXPECT_GT(m->total, 0u);
    EXPECT_LE(m->used, m->total);
    EXPECT_LE(m->free, m->total);
    EXPECT_FALSE(m->source.empty());
  }
  EXPECT_FALSE(gpu_memory(devices));
  EXPECT_FALSE(gpu_memory(-1));
}

TEST_F(GpuInfo, AllocationShowsInUsedMemory) {
  std::unique_ptr<Backend> be = make_cuda_backend({});  // the context exists before the first reading
  constexpr uint64_t kBytes = 256ull << 20;
  const std::optional<GpuMemory> before = gpu_memory(0);
  ASSERT_TRUE(before);
  void* p = be->allocate(kBytes);
  const std::optional<GpuMemory> after = gpu_memory(0);
  be->deallocate(p);
  ASSERT_TRUE(after);
  // Which path answered, for whoever reads the log: NVML, or the fallback and why.
  const std::string mine = after->process_known ? std::to_string(after->process_used >> 20) + " MiB" : "unknown";
  std::printf("gpu_memory(0) source: %s; this process: %s\n", after->source.c_str(), mine.c_str());
  EXPECT_GE(after->used, before->used + kBytes) << after->source;
  if (after->process_known) {
    EXPECT_GE(after->process_used, kBytes);
  }
}

TEST_F(GpuInfo, EnvironmentReportNamesEveryGpu) {
  const std::string report = gpu_environment_report();
  for (int dev = 0; dev < devices; ++dev) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
    EXPECT_NE(report.find("GPU " + std::to_string(dev) + ": "), std::string::npos) << report;
    EXPECT_NE(report.find(std::to_string(prop.major) + "." + std::to_string(prop.minor)), std::string::npos)
        << report;
  }
  EXPECT_NE(report.find("hone features: fp32 yes, tf32 yes, bf16 yes, fp16 yes, fused attention yes"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("none usable"), std::string::npos) << report;
}

// `hone env` checks with PTX compilation off, so "machine code" means the driver loaded SASS
// built for this GPU (the GPU tests' build is for it) rather than compiling PTX.
TEST_F(GpuInfo, EnvSaysTheKernelsAreMachineCodeForThisGpu) {
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const test::CommandResult r = test::run_hone("env");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(fmt::format("hone's kernels: machine code for sm_{}{} in this binary", prop.major, prop.minor)),
            std::string::npos)
      << r.out;
  // On Hopper it says which attention kernels run: the wgmma/TMA ones when this binary has
  // their sm_90a image (every build for 90a, as the device builds are).
  if (prop.major == 9 && prop.minor == 0) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    const bool hopper = cuda::flash::hopper_kernels_present();
    std::printf("  sm_90a attention kernels in this binary: %s\n", hopper ? "yes" : "no");
    const std::string wgmma = "attention: Hopper's wgmma/TMA kernels for head sizes 32, 64 and 128";
    EXPECT_EQ(r.out.find(wgmma) != std::string::npos, hopper) << r.out;
    EXPECT_EQ(r.out.find("attention: the mma.sync kernels only") != std::string::npos, !hopper) << r.out;
  }
}

}  // namespace
}  // namespace hone
