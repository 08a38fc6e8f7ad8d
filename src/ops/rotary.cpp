// Rotary position embeddings on the query and key columns of the fused QKV projection.
#include <omp.h>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "hone/rotary.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

void rotary(Backend& be, Tensor& qkv, const Tensor& rows, int seq, int heads, int head_dim, float theta,
            bool inverse) {
  const char* op = "rotary";
  if (seq <= 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0)
    fail("{}: seq {}, heads {} and head_dim {} must be positive, head_dim even", op, seq, heads, head_dim);
  if (!(theta > 0.0f) || !std::isfinite(theta)) fail("{}: theta must be a positive number, got {}", op, theta);
  detail::expect_compute(be, op, "qkv", qkv);
  detail::expect_rank(op, "qkv", qkv, 2);
  if (qkv.shape[1] != 3 * int64_t(heads) * head_dim)
    fail("{}: qkv has shape {}, expected [tokens, {}]", op, qkv.shape.str(), 3 * int64_t(heads) * head_dim);
  if (rows.data) detail::expect(op, "rows", rows, DType::I32, {qkv.shape[0]});
  else if (qkv.shape[0] % seq != 0)
    fail("{}: qkv has {} rows, not a whole number of sequences of {}", op, qkv.shape[0], seq);
  if (be.dry_run) return;
  // Per pair: 4 multiplies and 2 adds for each of query and key.
  const double pairs = double(qkv.shape[0]) * heads * (head_dim / 2) * 2;
  detail::OpScope scope(be, op, OpClass::Elementwise, {6 * pairs, 2.0 * 2 / 3 * double(qkv.bytes()) + detail::bytes(rows)});
  be.rotary(qkv, rows, seq, heads, head_dim, theta, inverse);
}

}  // namespace ops

void CpuBackend::rotary(Tensor& qkv, const Tensor& rows, int seq, int heads, int head_dim, float theta,
                        bool inverse) {
  const int64_t tokens = qkv.shape[0], hidden = int64_t(heads) * head_dim, half = head_dim / 2;
  const int32_t* rp = rows.data ? rows.ptr<int32_t>() : nullptr;
  float* p = qkv.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t pos = (rp ? rp[t] : t) % seq;
    float* row = p + t * 3 * hidden;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = rotary_angle(pos, rotary_inv_freq(theta, int(i), head_dim));
      const float c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
      for (int64_t h = 0; h < 2 * heads; ++h) {  // the query's heads, then the key's
        float* x = row + h * head_dim;
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace hone
