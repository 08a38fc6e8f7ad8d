// Dropout masks on the CPU, sixteen Philox blocks at a time where the CPU has AVX-512 (F,
// BW) and BMI2: the same integer operations as philox.h's scalar generator on vector lanes,
// so the masks are the scalar ones to the bit (tests/philox_test.cpp), and the GPU's.
#pragma once

#include <cstdint>

#include "hone/backend.h"

namespace hone::cpu_dropout {

// keep[k] = dropout_keep(d.seed, dropout_stream(d), begin + k, d.p), k in [0, n).
void keep_mask(const DropoutSpec& d, uint64_t begin, int64_t n, uint8_t* keep);

// keep[k] = attention_keep(d.seed, dropout_stream(d), begin + k, d.p), k in [0, n).
void attention_keep_mask(const DropoutSpec& d, uint64_t begin, int64_t n, uint8_t* keep);

}  // namespace hone::cpu_dropout
