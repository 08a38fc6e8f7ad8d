// Peak throughput per GPU and precision, for MFU. Dense (no 2:4 sparsity) figures from
// NVIDIA's datasheets: H100 SXM and H200 share the same compute (the H200 has more and
// faster memory); the PCIe H100 runs fewer SMs at lower clocks.
#include <array>

#include "hone/gpu_info.h"

namespace hone {
namespace {

struct Peak {
  std::string_view name;  // a part of the CUDA device name; the first match wins
  double fp32, tf32, bf16;  // TFLOP/s; fp16 equals bf16 on these parts
};

constexpr std::array<Peak, 4> kPeaks = {{
    {"H100 PCIe", 51.2, 378.0, 756.0},
    {"H100", 66.9, 494.7, 989.4},
    {"H200", 66.9, 494.7, 989.4},
    {"A100", 19.5, 156.0, 312.0},
}};

}  // namespace

std::optional<double> peak_flops(std::string_view gpu_name, std::string_view precision) {
  for (const Peak& p : kPeaks) {
    if (gpu_name.find(p.name) == std::string_view::npos) continue;
    if (precision == "fp32") return p.fp32 * 1e12;
    if (precision == "tf32") return p.tf32 * 1e12;
    if (precision == "bf16" || precision == "fp16") return p.bf16 * 1e12;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace hone
