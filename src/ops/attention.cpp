// Scaled dot-product self-attention over the fused QKV projection. Q, K and V head
// slices are read in place from qkv (leading dimension 3H); (batch, head) pairs run in
// parallel, each with a few [S, S] blocks of scratch. Backward recomputes the
// probabilities from the saved row statistics instead of keeping them. With a window, the
// whole [S, S] products still run (this is the reference, not the fast path) and the keys
// outside each query's window get -inf scores.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace {

// The keys [lo, hi) of n that query i weighs: those within `window` of it (all without one).
std::pair<int, int> window_keys(int window, int i, int n) {
  if (window < 0) return {0, n};
  return {int(std::max<int64_t>(0, int64_t(i) - window)), int(std::min<int64_t>(n, int64_t(i) + window + 1))};
}

}  // namespace

namespace ops {

namespace {

void check_dims(const char* op, const AttentionDims& d) {
  if (d.batch <= 0 || d.seq <= 0 || d.heads <= 0 || d.head_dim <= 0)
    fail("{}: dims batch={} seq={} heads={} head_dim={} must be positive", op, d.batch, d.seq, d.heads, d.head_dim);
  if (d.window < -1) fail("{}: window {} must be -1 (no window) or a distance >= 0", op, d.window);
}

void check_attention(const char* op, Backend& be, const AttentionDims& d, const DropoutSpec& drop,
                     const Tensor& qkv, const Tensor& mask, const Tensor& stats, const Tensor& keep,
                     const Tensor& workspace) {
  check_dims(op, d);
  detail::expect_dropout(op, drop);
  const int64_t tokens = int64_t(d.batch) * d.seq;
  detail::expect_compute(be, op, "qkv", qkv);
  detail::expect_shape(op, "qkv", qkv, {tokens, 3 * int64_t(d.hidden())});
  detail::expect(op, "mask", mask, DType::I32, {d.batch, d.seq});
  detail::expect(op, "stats", stats, DType::F32, {d.batch, d.heads, d.seq, 2});
  if (const int words = attention_keep_words(be, d, qkv.dtype, drop); words > 0)
    detail::expect(op, "keep", keep, DType::I32, {d.batch, d.heads, d.seq, words});
  detail::expect_dtype(op, "workspace", workspace, DType::F32);
  const int64_t need = be.attention_workspace_elems(d, qkv.dtype);
  if (workspace.numel() < need)
    fail("{}: workspace has {} elements, expected at least {}", op, workspace.numel(), need);
}

// Q K^T and P V over every (batch, head): 2 * 2 * head_dim per (query, key) pair that
// has weight, S * S of them without a window.
double attention_flops(const AttentionDims& d) {
  double pairs = double(d.seq) * d.seq;
  if (d.window >= 0 && d.window < d.seq) {
    pairs = 0;
    for (int i = 0; i < d.seq; ++i) {
      const auto [lo, hi] = window_keys(d.window, i, d.seq);
      pairs += hi - lo;
    }
  }
  return 4.0 * d.batch * d.heads * pairs * d.head_dim;
}

double keep_bytes(const Backend& be, const AttentionDims& d, DType t, const DropoutSpec& drop, const Tensor& keep) {
  return be.attention_keep_words(d, t) > 0 && drop.p > 0.0f ? double(keep.bytes()) : 0.0;
}

}  // namespace

int attention_keep_words(const Backend& be, const AttentionDims& d, DType t, const DropoutSpec& drop) {
  return drop.p > 0.0f ? be.attention_keep_words(d, t) : 0;
}

void attention_forward(Backend& be, const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                       const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace) {
  check_attention("attention_forward", be, d, drop, qkv, mask, stats, keep, workspace);
  detail::expect("attention_forward", "ctx", ctx, qkv.dtype, {int64_t(d.batch) * d.seq, d.hidden()});
  if (be.dry_run) return;
  detail::OpScope scope(be, "attention_forward", OpClass::Attention,
                        {attention_flops(d), detail::bytes(qkv, mask, stats, ctx) + keep_bytes(be, d, qkv.dtype, drop, keep)});
  be.attention_forward(qkv, mask, d, drop, stats, keep, ctx, workspace);
}

void attention_backward(Backend& be, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& mask,
                        const Tensor& stats, const Tensor& keep, const AttentionDims& d, const DropoutSpec& drop,
                        Tensor& dqkv, Tensor& workspace) {
  check_attention("attention_backward", be, d, drop, qkv, mask, stats, keep, workspace);
  const int64_t tokens = int64_t(d.batch) * d.seq;
  detail::expect("attention_backward", "dctx", dctx, qkv.dtype, {tokens, d.hidden()});
  detail::expect("attention_backward", "ctx", ctx, qkv.dtype, {tokens, d.hidden()});
  detail::expect("attention_backward", "dqkv", dqkv, qkv.dtype, {tokens, 3 * int64_t(d.hidden())});
  if (be.dry_run) return;
  // Twice the forward's products (dV, dP, dQ and dK); the recomputed scores are not counted.
  detail::OpScope scope(be, "attention_backward", OpClass::Attention,
                        {2 * attention_flops(d), detail::bytes(dctx, qkv, ctx, mask, stats, dqkv) +
                                                     keep_bytes(be, d, qkv.dtype, drop, keep)});
  be.attention_backward(dctx, qkv, ctx, mask, stats, keep, d, drop, dqkv, workspace);
}

void attention_forward_packed(Backend& be, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                              Tensor& ctx, Tensor& workspace) {
  const char* op = "attention_forward_packed";
  check_dims(op, d);
  detail::expect_compute(be, op, "qkv", qkv);
  detail::expect_rank(op, "qkv", qkv, 2);
  detail::expect_shape(op, "qkv", qkv, {qkv.shape[0], 3 * int64_t(d.hidden())});
  detail::expect(op, "row_start", row_start, DType::I32, {d.batch + 1});
  detail::expect(op, "ctx", ctx, qkv.dtype, {qkv.shape[0], d.hidden()});
  detail::expect_dtype(op, "workspace", workspace, DType::F32);
  if (workspace.numel() < be.attention_workspace_elems(d, qkv.dtype))
    fail("{}: workspace has {} elements, expected at least {}", op, workspace.numel(),
         be.attention_workspace_elems(d, qkv.dtype));
  if (!be.dry_run && !be.packs_attention(d, qkv.dtype))
    fail("{}: the {} backend does not pack attention in {}", op, be.name(), dtype_name(qkv.dtype));
  if (be.dry_run) return;
  // The work depends on the lengths, which live in the backend's memory: bytes only.
  detail::OpScope scope(be, op, OpClass::Attention, {0, detail::bytes(qkv, row_start, ctx)});
  be.attention_forward_packed(qkv, row_start, d, ctx, workspace);
}

}  // namespace ops

namespace {

// Hugging Face's additive mask value, torch.finfo(torch.float32).min. Added to scores of
// size far below its ulp it gives exactly this value, so a row with every key masked
// becomes uniform, as in transformers.
constexpr float kMasked = std::numeric_limits<float>::lowest();

constexpr float kInf = std::numeric_limits<float>::infinity();

// Softmax of one row of scores, in place (mask null: every key attended), over the keys
// [keys.first, keys.second) of the query's window (the others get probability 0); returns
// {max, 1 / sum}, with which probs_row() recomputes the same probabilities.
std::pair<float, float> masked_softmax_row(float* row, const int32_t* mask, int n, std::pair<int, int> keys) {
  float mx = -kInf;
  for (int j = 0; j < n; ++j) {
    if (j < keys.first || j >= keys.second)
      row[j] = -kInf;
    else if (mask && mask[j] == 0)
      row[j] += kMasked;
    mx = std::max(mx, row[j]);
  }
  double sum = 0;
  for (int j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const float inv = float(1.0 / sum);
  for (int j = 0; j < n; ++j) row[j] *= inv;
  return {mx, inv};
}

// The probabilities of a row of recomputed scores, from its saved {max, 1 / sum}.
void probs_row(float* row, const int32_t* mask, int n, std::pair<int, int> keys, float mx, float inv) {
  for (int j = 0; j < n; ++j) {
    if (j < keys.first || j >= keys.second)
      row[j] = -kInf;
    else if (mask[j] == 0)
      row[j] += kMasked;
    row[j] = std::exp(row[j] - mx) * inv;
  }
}

}  // namespace

// Heads run in parallel, one per thread, each with its own scratch: the probabilities,
// the dropped probabilities and the score gradient of one head.
int64_t CpuBackend::attention_workspace_elems(const AttentionDims& d, DType) const {
  return int64_t(omp_get_max_threads()) * 3 * int64_t(d.seq) * d.seq;
}

namespace {

// The scaled scores Q K^T of head pair bh, written into this thread's scratch (three
// [S, S] blocks: scores/probs, dropped probs, score gradient). Forward and backward both
// call it, so backward recomputes exactly the forward's scores.
float* head_scores(const AttentionDims& d, const float* qkvp, const Tensor& workspace, int bh) {
  const int S = d.seq, H = d.hidden(), ld = 3 * H;
  const int b = bh / d.heads, h = bh % d.heads;
  const float* q = qkvp + int64_t(b) * S * ld + h * d.head_dim;
  float* p = workspace.f32() + int64_t(omp_get_thread_num()) * 3 * S * S;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, d.head_dim, d.scale, q, ld, q + H, ld, 0.0f, p, S);
  return p;
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                                   const DropoutSpec& drop, Tensor& stats, Tensor& /*keep*/, Tensor& ctx,
                                   Tensor& workspace) {
  const int S = d.seq, H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const bool dropping = drop.p > 0.0f;
  const float keep_scale = dropping ? 1.0f / (1.0f - drop.p) : 1.0f;
  const float* qkvp = qkv.f32();
  const int32_t* maskp = mask.ptr<int32_t>();
  float* statsp = stats.f32();
  float* ctxp = ctx.f32();
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh) {
    const int b = bh / d.heads, h = bh % d.heads;
    float* p = head_scores(d, qkvp, workspace, bh);
    float* dropped = p + int64_t(S) * S;
    const int32_t* m = maskp + int64_t(b) * S;
    const float* v = qkvp + int64_t(b) * S * ld + 2 * H + h * hd;
    const uint64_t base = uint64_t(bh) * S * S;  // flat index of probs[b, h, 0, 0]
    for (int i = 0; i < S; ++i) {
      float* row = p + int64_t(i) * S;
      const auto [mx, inv] = masked_softmax_row(row, m, S, window_keys(d.window, i, S));
      statsp[2 * (int64_t(bh) * S + i)] = mx;
      statsp[2 * (int64_t(bh) * S + i) + 1] = inv;
      if (dropping) {
        float* out = dropped + int64_t(i) * S;
        ops::detail::for_each_attention_keep(drop, base + uint64_t(i) * S, S,
                                   [&](int64_t j, bool keep) { out[j] = keep ? row[j] * keep_scale : 0.0f; });
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1.0f, dropping ? dropped : p, S, v, ld, 0.0f,
                ctxp + int64_t(b) * S * H + h * hd, H);
  }
}

// As attention_forward without a mask or dropout, one sequence's rows at a time (the window
// counted from the sequence's first row).
void CpuBackend::attention_forward_packed(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                                          Tensor& ctx, Tensor& workspace) {
  const int H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const int32_t* rs = row_start.ptr<int32_t>();
  HONE_CHECK(rs[0] == 0 && rs[d.batch] == qkv.shape[0], "packed attention: rows {} .. {} of {}", rs[0], rs[d.batch],
             qkv.shape[0]);
  for (int b = 0; b < d.batch; ++b)
    HONE_CHECK(rs[b + 1] > rs[b] && rs[b + 1] - rs[b] <= d.seq, "packed attention: sequence {} has {} rows (at most {})",
               b, rs[b + 1] - rs[b], d.seq);
  const float* qkvp = qkv.f32();
  float* ctxp = ctx.f32();
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh) {
    const int b = bh / d.heads, h = bh % d.heads, n = rs[b + 1] - rs[b];
    const float* q = qkvp + int64_t(rs[b]) * ld + h * hd;
    float* p = workspace.f32() + int64_t(omp_get_thread_num()) * 3 * d.seq * d.seq;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hd, d.scale, q, ld, q + H, ld, 0.0f, p, n);
    for (int i = 0; i < n; ++i) masked_softmax_row(p + int64_t(i) * n, nullptr, n, window_keys(d.window, i, n));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n, 1.0f, p, n, q + 2 * H, ld, 0.0f,
                ctxp + int64_t(rs[b]) * H + h * hd, H);
  }
}

void CpuBackend::attention_backward(const Tensor& dctx, const Tensor& qkv, const Tensor& /*ctx*/, const Tensor& mask,
                                    const Tensor& stats, const Tensor& /*keep*/, const AttentionDims& d,
                                    const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) {
  const int S = d.seq, H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const bool dropping = drop.p > 0.0f;
  const float keep_scale = dropping ? 1.0f / (1.0f - drop.p) : 1.0f;
  const float* qkvp = qkv.f32();
  const float* dctxp = dctx.f32();
  const float* statsp = stats.f32();
  const int32_t* maskp = mask.ptr<int32_t>();
  float* dqkvp = dqkv.f32();
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh) {
    const int b = bh / d.heads, h = bh % d.heads;
    // The forward's probabilities again: the same product, then the saved statistics.
    float* p = head_scores(d, qkvp, workspace, bh);
    float* dropped = p + int64_t(S) * S;
    float* dscores = dropped + int64_t(S) * S;
    const int32_t* m = maskp + int64_t(b) * S;
    for (int i = 0; i < S; ++i) {
      const float* st = statsp + 2 * (int64_t(bh) * S + i);
      probs_row(p + int64_t(i) * S, m, S, window_keys(d.window, i, S), st[0], st[1]);
    }
    const int64_t off = int64_t(b) * S * ld + h * hd;
    const float* q = qkvp + off;
    const float* k = q + H;
    const float* v = q + 2 * H;
    float* dq = dqkvp + off;
    float* dk = dq + H;
    float* dv = dq + 2 * H;
    const float* dc = dctxp + int64_t(b) * S * H + h * hd;
    const uint64_t base = uint64_t(bh) * S * S;
    // d(dropped probs) = dctx V^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, 1.0f, dc, H, v, ld, 0.0f, dscores, S);
    for (int i = 0; i < S; ++i) {
      const float* prow = p + int64_t(i) * S;
      float* g = dscores + int64_t(i) * S;
      if (dropping) {
        // One walk of the mask gives both the dropped probs (for dV) and d(probs).
        float* out = dropped + int64_t(i) * S;
        ops::detail::for_each_attention_keep(drop, base + uint64_t(i) * S, S, [&](int64_t j, bool keep) {
          out[j] = keep ? prow[j] * keep_scale : 0.0f;
          g[j] = keep ? g[j] * keep_scale : 0.0f;
        });
      }
      // Softmax backward: dS = P * (dP - sum(dP * P)).
      double dot = 0;
      for (int j = 0; j < S; ++j) dot += double(g[j]) * prow[j];
      for (int j = 0; j < S; ++j) g[j] = prow[j] * (g[j] - float(dot));
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1.0f, dropping ? dropped : p, S, dc, H, 0.0f,
                dv, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, d.scale, dscores, S, k, ld, 0.0f, dq, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, d.scale, dscores, S, q, ld, 0.0f, dk, ld);
  }
}

}  // namespace hone
