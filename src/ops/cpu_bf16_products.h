#pragma once
// Matrix products with bf16 operands on the CPU (`--bf16 --device cpu`): the operands are
// rounded to bf16 (nearest even), the products summed in F32, the results F32, and every
// other op stays F32. oneDNN's matmul runs them, on AMX tiles where the CPU has them
// (Sapphire Rapids and later): 1300-1930 GFLOP/s on two cores of the device machines'
// host against 260-310 in F32. Without AMX, AVX512-BF16 alone ran them slower than F32 (a
// 2-core Xeon VM: 134-154 against 233-256), which the CLI tells the user. Where this
// build has oneDNN: cpu_bf16_products_available (hone/cpu_backend.h).

namespace hone::cpu_bf16 {

// Row-major c[m, n] = op(a)[m, k] op(b)[k, n] (+ c where accumulate), op(a) = a^T where
// ta (a stored [k, m]), op(b) = b^T where tb (b stored [n, k]); lda, ldb, ldc as in BLAS.
void product(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate,
             float* c, int ldc);

// x rounded to bf16, nearest even (NaN stays NaN), as the products' operands are.
float round_to_bf16(float x);

}  // namespace hone::cpu_bf16
