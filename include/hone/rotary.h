#pragma once
// The rotation angle of rotary position embeddings, shared by the CPU and CUDA backends so
// that both turn by the same float: pos * inv_freq(i), inv_freq(i) = 1 / theta^(2i / d), each
// step rounded to float as transformers computes it (torch.arange in float32).
#include <cmath>
#include <cstdint>

#include "hone/philox.h"  // HONE_HD

namespace hone {

HONE_HD float rotary_inv_freq(float theta, int i, int head_dim) {
  return 1.0f / powf(theta, float(2 * i) / float(head_dim));
}

HONE_HD float rotary_angle(int64_t pos, float inv_freq) { return float(pos) * inv_freq; }

}  // namespace hone
