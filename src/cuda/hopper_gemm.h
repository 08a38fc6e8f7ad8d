#pragma once
// A product with BERT's erf GELU in its epilogue, for Hopper (hopper_gemm.cu): y = GELU(x w^T
// + b), and where a backward keeps it (training) the product before the GELU as well.
// cuBLASLt's GELU epilogue is the tanh form only, so without this kernel the erf GELU is a
// pass of its own over the product's output, which reads and writes the feed-forward
// block's widest matrix again (bert-large's up-projection at 16384 tokens on an H100: 0.289
// ms for cuBLASLt and the pass, 0.25 for this kernel writing both, 0.242 for y alone).
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "hone/dtype.h"

namespace hone::cuda {

// HONE_GELU_EPILOGUE: unset or "on" (the kernel where it runs), "off" (cuBLASLt's product
// and a GELU pass); any other value is an error that lists the choices.
bool gelu_epilogue_allowed();

// Whether the kernel runs this product here: a 9.0 GPU with the sm_90a image, BF16 or F16,
// k a positive multiple of 64, n of 128, at least two 128 x 128 tiles of y for each of the
// GPU's `sms` multiprocessors, 16-byte aligned data (x, w, b, y, pre; null b and pre pass),
// and gelu_epilogue_allowed().
bool hopper_gelu_product_runs(DType t, int64_t m, int64_t n, int64_t k, int sms,
                              std::initializer_list<const void*> data);

// x [m, k], w [n, k], b [n] (may be null), y and pre [m, n] (pre may be null: the product
// before the GELU, rounded to t, which backward reads), all of dtype t; one CTA per SM.
void hopper_gelu_product(cudaStream_t stream, int sms, DType t, const void* x, const void* w, const void* b,
                         void* y, void* pre, int64_t m, int64_t n, int64_t k);

}  // namespace hone::cuda
