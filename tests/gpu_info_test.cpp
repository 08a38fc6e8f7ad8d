// gpu_memory and the `hone env` report where no GPU is usable: a CPU-only build, or a
// CUDA build on a machine without a GPU or driver. hone_gpu_tests covers the GPU case.
#include "hone/gpu_info.h"

#include <gtest/gtest.h>

#include <string>

#include "hone/cuda.h"

namespace hone {
namespace {

TEST(GpuInfoWithoutGpu, NoMemoryAndTheReportSaysWhy) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is usable: hone_gpu_tests covers this machine";
  EXPECT_FALSE(gpu_memory(0));
  const std::string report = gpu_environment_report();
  EXPECT_NE(report.find("GPU: none usable: " + why), std::string::npos) << report;
}

}  // namespace
TEST(PeakFlops, KnownPartsAndPrecisions) {
  EXPECT_EQ(peak_flops("NVIDIA H100 80GB HBM3", "tf32"), 494.7e12);
  EXPECT_EQ(peak_flops("NVIDIA H100 80GB HBM3", "bf16"), 989.4e12);
  EXPECT_EQ(peak_flops("NVIDIA H100 PCIe", "fp32"), 51.2e12);
  EXPECT_EQ(peak_flops("cuda:0 (NVIDIA H200)", "fp16"), 989.4e12);
  EXPECT_EQ(peak_flops("NVIDIA A100-SXM4-80GB", "tf32"), 156e12);
  EXPECT_FALSE(peak_flops("NVIDIA GeForce GTX 1080", "fp32"));
  EXPECT_FALSE(peak_flops("NVIDIA H100 80GB HBM3", "int8"));
}

}  // namespace hone
