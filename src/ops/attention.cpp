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
#include "ops/cpu_dropout.h"
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

// first_rows_only leaves rows of the context (and their statistics) unwritten: a forward's
// choice in inference, never a backward's, nor with dropout.
void check_first_rows(const char* op, const AttentionDims& d, const DropoutSpec& drop, bool backward) {
  if (d.first_rows_only && (backward || drop.p > 0.0f))
    fail("{}: first_rows_only is for an inference forward, without dropout{}", op,
         backward ? "; a backward needs every row" : "");
}

void check_attention(const char* op, Backend& be, const AttentionDims& d, const DropoutSpec& drop,
                     const Tensor& qkv, const Tensor& mask, const Tensor& stats, const Tensor& keep,
                     const Tensor& workspace, bool backward) {
  check_dims(op, d);
  check_first_rows(op, d, drop, backward);
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
// has weight, S * S of them in a sequence of S without a window; only the first query's
// with first_rows_only (the work its reader needs, whether or not the backend leaves the
// rest out). Packed, each sequence at its own length, where the host's row starts are known.
double attention_flops(const AttentionDims& d) {
  auto sequence_pairs = [&](int n) {
    const int queries = d.first_rows_only ? std::min(n, 1) : n;
    if (d.window < 0 || d.window >= n) return double(queries) * n;
    double pairs = 0;
    for (int i = 0; i < queries; ++i) {
      const auto [lo, hi] = window_keys(d.window, i, n);
      pairs += hi - lo;
    }
    return pairs;
  };
  double pairs = 0;
  if (d.host_row_start) {
    for (int b = 0; b < d.batch; ++b) pairs += sequence_pairs(d.host_row_start[b + 1] - d.host_row_start[b]);
  } else {
    pairs = d.batch * sequence_pairs(d.seq);
  }
  return 4.0 * d.heads * pairs * d.head_dim;
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
  check_attention("attention_forward", be, d, drop, qkv, mask, stats, keep, workspace, false);
  detail::expect("attention_forward", "ctx", ctx, qkv.dtype, {int64_t(d.batch) * d.seq, d.hidden()});
  if (be.dry_run) return;
  detail::OpScope scope(be, "attention_forward", OpClass::Attention, [&] {
    return OpCost{attention_flops(d), detail::bytes(qkv, mask, stats, ctx) + keep_bytes(be, d, qkv.dtype, drop, keep)};
  });
  be.attention_forward(qkv, mask, d, drop, stats, keep, ctx, workspace);
}

void attention_backward(Backend& be, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& mask,
                        const Tensor& stats, const Tensor& keep, const AttentionDims& d, const DropoutSpec& drop,
                        Tensor& dqkv, Tensor& workspace) {
  check_attention("attention_backward", be, d, drop, qkv, mask, stats, keep, workspace, true);
  const int64_t tokens = int64_t(d.batch) * d.seq;
  detail::expect("attention_backward", "dctx", dctx, qkv.dtype, {tokens, d.hidden()});
  detail::expect("attention_backward", "ctx", ctx, qkv.dtype, {tokens, d.hidden()});
  detail::expect("attention_backward", "dqkv", dqkv, qkv.dtype, {tokens, 3 * int64_t(d.hidden())});
  if (be.dry_run) return;
  // Twice the forward's products (dV, dP, dQ and dK); the recomputed scores are not counted.
  detail::OpScope scope(be, "attention_backward", OpClass::Attention, [&] {
    return OpCost{2 * attention_flops(d),
                  detail::bytes(dctx, qkv, ctx, mask, stats, dqkv) + keep_bytes(be, d, qkv.dtype, drop, keep)};
  });
  be.attention_backward(dctx, qkv, ctx, mask, stats, keep, d, drop, dqkv, workspace);
}

namespace {

// The checks of both packed directions. Training checks stats and keep as check_attention
// does (the padded layout of d); inference, that nothing is dropped.
void check_packed(const char* op, Backend& be, const AttentionDims& d, const DropoutSpec& drop, const Tensor& qkv,
                  const Tensor& row_start, const Tensor& stats, const Tensor& keep, const Tensor& workspace,
                  bool training, bool backward = false) {
  check_dims(op, d);
  check_first_rows(op, d, drop, backward);
  detail::expect_dropout(op, drop);
  detail::expect_compute(be, op, "qkv", qkv);
  detail::expect_rank(op, "qkv", qkv, 2);
  detail::expect_shape(op, "qkv", qkv, {qkv.shape[0], 3 * int64_t(d.hidden())});
  if (qkv.shape[0] > int64_t(d.batch) * d.seq)
    fail("{}: qkv has {} rows, more than {} sequences of at most {}", op, qkv.shape[0], d.batch, d.seq);
  detail::expect(op, "row_start", row_start, DType::I32, {d.batch + 1});
  if (training) {
    detail::expect(op, "stats", stats, DType::F32, {d.batch, d.heads, d.seq, 2});
    if (const int words = attention_keep_words(be, d, qkv.dtype, drop); words > 0)
      detail::expect(op, "keep", keep, DType::I32, {d.batch, d.heads, d.seq, words});
  } else if (drop.p > 0.0f) {
    fail("{}: dropout {} in inference, which keeps no statistics for a backward", op, drop.p);
  }
  detail::expect_dtype(op, "workspace", workspace, DType::F32);
  if (workspace.numel() < be.attention_workspace_elems(d, qkv.dtype))
    fail("{}: workspace has {} elements, expected at least {}", op, workspace.numel(),
         be.attention_workspace_elems(d, qkv.dtype));
  if (!be.dry_run && !(training ? be.packs_training_attention(d, qkv.dtype) : be.packs_attention(d, qkv.dtype)))
    fail("{}: the {} backend does not pack {} attention in {}", op, be.name(), training ? "training" : "inference",
         dtype_name(qkv.dtype));
}

}  // namespace

// The work of the packed ops depends on the lengths: counted from the host's copy of the
// row starts where the caller passed it (d.host_row_start), else not at all (bytes only).
// Like every attention op's cost, counted only while a profiler listens (a walk per call).
namespace {
double packed_flops(const AttentionDims& d) { return d.host_row_start ? attention_flops(d) : 0.0; }
}  // namespace

void attention_forward_packed(Backend& be, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                              const DropoutSpec& drop, Tensor& stats, Tensor& keep, Tensor& ctx, Tensor& workspace) {
  const char* op = "attention_forward_packed";
  check_packed(op, be, d, drop, qkv, row_start, stats, keep, workspace, true);
  detail::expect(op, "ctx", ctx, qkv.dtype, {qkv.shape[0], d.hidden()});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Attention, [&] {
    return OpCost{packed_flops(d),
                  detail::bytes(qkv, row_start, stats, ctx) + keep_bytes(be, d, qkv.dtype, drop, keep)};
  });
  be.attention_forward_packed(qkv, row_start, d, drop, stats, keep, ctx, workspace);
}

void attention_forward_packed(Backend& be, const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                              Tensor& ctx, Tensor& workspace) {
  const char* op = "attention_forward_packed";
  Tensor none;
  check_packed(op, be, d, {}, qkv, row_start, none, none, workspace, false);
  detail::expect(op, "ctx", ctx, qkv.dtype, {qkv.shape[0], d.hidden()});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Attention,
                        [&] { return OpCost{packed_flops(d), detail::bytes(qkv, row_start, ctx)}; });
  be.attention_forward_packed(qkv, row_start, d, {}, none, none, ctx, workspace);
}

void attention_backward_packed(Backend& be, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                               const Tensor& row_start, const Tensor& stats, const Tensor& keep, const AttentionDims& d,
                               const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) {
  const char* op = "attention_backward_packed";
  check_packed(op, be, d, drop, qkv, row_start, stats, keep, workspace, true, true);
  const int64_t T = qkv.shape[0];
  detail::expect(op, "dctx", dctx, qkv.dtype, {T, d.hidden()});
  detail::expect(op, "ctx", ctx, qkv.dtype, {T, d.hidden()});
  detail::expect(op, "dqkv", dqkv, qkv.dtype, {T, 3 * int64_t(d.hidden())});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Attention, [&] {
    return OpCost{2 * packed_flops(d),
                  detail::bytes(dctx, qkv, ctx, row_start, stats, dqkv) + keep_bytes(be, d, qkv.dtype, drop, keep)};
  });
  be.attention_backward_packed(dctx, qkv, ctx, row_start, stats, keep, d, drop, dqkv, workspace);
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

// The probabilities of a row of recomputed scores, from its saved {max, 1 / sum} (mask
// null: every key attended).
void probs_row(float* row, const int32_t* mask, int n, std::pair<int, int> keys, float mx, float inv) {
  for (int j = 0; j < n; ++j) {
    if (j < keys.first || j >= keys.second)
      row[j] = -kInf;
    else if (mask && mask[j] == 0)
      row[j] += kMasked;
    row[j] = std::exp(row[j] - mx) * inv;
  }
}

}  // namespace

namespace {

// A thread's scratch in F32 elements: three [S, S] blocks (scores/probs, dropped probs,
// score gradient), then the head's dropout mask, a byte per element.
int64_t scratch_elems(int64_t S) { return 3 * S * S + (S * S + 3) / 4; }

}  // namespace

// Heads run in parallel, one per thread, each with its own scratch.
int64_t CpuBackend::attention_workspace_elems(const AttentionDims& d, DType) const {
  return int64_t(omp_get_max_threads()) * scratch_elems(d.seq);
}

namespace {

// One (sequence, head) pair bh of a call: n rows from row `first` of qkv and ctx, the mask
// of its keys (null: every one attended), and the padded layout's S, which indexes its
// statistics (row i: bh S + i) and dropout elements (row i, key j: (bh S + i) S + j).
struct HeadRows {
  int bh, h;
  int64_t first;
  int n, S;
  const int32_t* mask;
};

HeadRows padded_head(const AttentionDims& d, const int32_t* mask, int bh) {
  const int b = bh / d.heads;
  return {bh, bh % d.heads, int64_t(b) * d.seq, d.seq, d.seq, mask + int64_t(b) * d.seq};
}

HeadRows packed_head(const AttentionDims& d, const int32_t* row_start, int bh) {
  const int b = bh / d.heads;
  return {bh, bh % d.heads, row_start[b], row_start[b + 1] - row_start[b], d.seq, nullptr};
}

void check_row_start(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d) {
  const int32_t* rs = row_start.ptr<int32_t>();
  HONE_CHECK(rs[0] == 0 && rs[d.batch] == qkv.shape[0], "packed attention: rows {} .. {} of {}", rs[0], rs[d.batch],
             qkv.shape[0]);
  for (int b = 0; b < d.batch; ++b)
    HONE_CHECK(rs[b + 1] > rs[b] && rs[b + 1] - rs[b] <= d.seq,
               "packed attention: sequence {} has {} rows (at most {})", b, rs[b + 1] - rs[b], d.seq);
}

// The scaled scores Q K^T of one head, [n, n], written into this thread's scratch (three
// [S, S] blocks: scores/probs, dropped probs, score gradient). Forward and backward both
// call it, so backward recomputes exactly the forward's scores.
float* head_scores(const AttentionDims& d, const float* qkvp, const Tensor& workspace, const HeadRows& r) {
  const int H = d.hidden(), ld = 3 * H;
  const float* q = qkvp + r.first * ld + r.h * d.head_dim;
  float* p = workspace.f32() + int64_t(omp_get_thread_num()) * scratch_elems(r.S);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r.n, r.n, d.head_dim, d.scale, q, ld, q + H, ld, 0.0f, p, r.n);
  return p;
}

// The head's dropout mask in this thread's scratch: row i, key j at i S + j. The rows'
// elements (row i: (bh S + i) S + j) are drawn as one run, with the S - n past each row's
// end, so that the generator's vector passes are not cut at each row.
const uint8_t* head_mask(const DropoutSpec& drop, const Tensor& workspace, const HeadRows& r) {
  const int64_t S = r.S;
  auto* keep = reinterpret_cast<uint8_t*>(workspace.f32() + int64_t(omp_get_thread_num()) * scratch_elems(S) + 3 * S * S);
  cpu_dropout::attention_keep_mask(drop, uint64_t(r.bh) * uint64_t(S * S), (r.n - 1) * S + r.n, keep);
  return keep;
}

// ctx = dropout(softmax(scores)) V for one head; its statistics into stats (when given).
void forward_head(const AttentionDims& d, const DropoutSpec& drop, const float* qkvp, const HeadRows& r,
                  float* statsp, float* ctxp, const Tensor& workspace) {
  const int n = r.n, H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const bool dropping = drop.p > 0.0f;
  const float keep_scale = dropping ? 1.0f / (1.0f - drop.p) : 1.0f;
  float* p = head_scores(d, qkvp, workspace, r);
  float* dropped = p + int64_t(n) * n;
  const uint8_t* keep = dropping ? head_mask(drop, workspace, r) : nullptr;
  for (int i = 0; i < n; ++i) {
    float* row = p + int64_t(i) * n;
    const auto [mx, inv] = masked_softmax_row(row, r.mask, n, window_keys(d.window, i, n));
    if (statsp) {
      statsp[2 * (int64_t(r.bh) * r.S + i)] = mx;
      statsp[2 * (int64_t(r.bh) * r.S + i) + 1] = inv;
    }
    if (dropping) {
      float* out = dropped + int64_t(i) * n;
      const uint8_t* kept = keep + int64_t(i) * r.S;
      for (int j = 0; j < n; ++j) out[j] = kept[j] ? row[j] * keep_scale : 0.0f;
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n, 1.0f, dropping ? dropped : p, n,
              qkvp + r.first * ld + 2 * H + r.h * hd, ld, 0.0f, ctxp + r.first * H + r.h * hd, H);
}

// dQ, dK, dV of one head into dqkv, from the forward's statistics.
void backward_head(const AttentionDims& d, const DropoutSpec& drop, const float* qkvp, const float* dctxp,
                   const float* statsp, float* dqkvp, const HeadRows& r, const Tensor& workspace) {
  const int n = r.n, H = d.hidden(), hd = d.head_dim, ld = 3 * H;
  const bool dropping = drop.p > 0.0f;
  const float keep_scale = dropping ? 1.0f / (1.0f - drop.p) : 1.0f;
  // The forward's probabilities again: the same product, then the saved statistics.
  float* p = head_scores(d, qkvp, workspace, r);
  float* dropped = p + int64_t(n) * n;
  float* dscores = dropped + int64_t(n) * n;
  for (int i = 0; i < n; ++i) {
    const float* st = statsp + 2 * (int64_t(r.bh) * r.S + i);
    probs_row(p + int64_t(i) * n, r.mask, n, window_keys(d.window, i, n), st[0], st[1]);
  }
  const int64_t off = r.first * ld + r.h * hd;
  const float* q = qkvp + off;
  const float* k = q + H;
  const float* v = q + 2 * H;
  float* dq = dqkvp + off;
  float* dk = dq + H;
  float* dv = dq + 2 * H;
  const float* dc = dctxp + r.first * H + r.h * hd;
  const uint8_t* keep = dropping ? head_mask(drop, workspace, r) : nullptr;
  // d(dropped probs) = dctx V^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hd, 1.0f, dc, H, v, ld, 0.0f, dscores, n);
  for (int i = 0; i < n; ++i) {
    const float* prow = p + int64_t(i) * n;
    float* g = dscores + int64_t(i) * n;
    if (dropping) {
      // One walk of the mask gives both the dropped probs (for dV) and d(probs).
      float* out = dropped + int64_t(i) * n;
      const uint8_t* kept = keep + int64_t(i) * r.S;
      for (int j = 0; j < n; ++j) {
        out[j] = kept[j] ? prow[j] * keep_scale : 0.0f;
        g[j] = kept[j] ? g[j] * keep_scale : 0.0f;
      }
    }
    // Softmax backward: dS = P * (dP - sum(dP * P)).
    double dot = 0;
    for (int j = 0; j < n; ++j) dot += double(g[j]) * prow[j];
    for (int j = 0; j < n; ++j) g[j] = prow[j] * (g[j] - float(dot));
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, n, 1.0f, dropping ? dropped : p, n, dc, H, 0.0f, dv,
              ld);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n, d.scale, dscores, n, k, ld, 0.0f, dq, ld);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, n, d.scale, dscores, n, q, ld, 0.0f, dk, ld);
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, const Tensor& mask, const AttentionDims& d,
                                   const DropoutSpec& drop, Tensor& stats, Tensor& /*keep*/, Tensor& ctx,
                                   Tensor& workspace) {
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh)
    forward_head(d, drop, qkv.f32(), padded_head(d, mask.ptr<int32_t>(), bh), stats.f32(), ctx.f32(), workspace);
}

// As attention_forward, one sequence's rows at a time (the window counted from the
// sequence's first row); statistics and dropout elements in the padded layout.
void CpuBackend::attention_forward_packed(const Tensor& qkv, const Tensor& row_start, const AttentionDims& d,
                                          const DropoutSpec& drop, Tensor& stats, Tensor& /*keep*/, Tensor& ctx,
                                          Tensor& workspace) {
  check_row_start(qkv, row_start, d);
  float* statsp = stats.data ? stats.f32() : nullptr;
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh)
    forward_head(d, drop, qkv.f32(), packed_head(d, row_start.ptr<int32_t>(), bh), statsp, ctx.f32(), workspace);
}

void CpuBackend::attention_backward(const Tensor& dctx, const Tensor& qkv, const Tensor& /*ctx*/, const Tensor& mask,
                                    const Tensor& stats, const Tensor& /*keep*/, const AttentionDims& d,
                                    const DropoutSpec& drop, Tensor& dqkv, Tensor& workspace) {
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh)
    backward_head(d, drop, qkv.f32(), dctx.f32(), stats.f32(), dqkv.f32(), padded_head(d, mask.ptr<int32_t>(), bh),
                  workspace);
}

void CpuBackend::attention_backward_packed(const Tensor& dctx, const Tensor& qkv, const Tensor& /*ctx*/,
                                           const Tensor& row_start, const Tensor& stats, const Tensor& /*keep*/,
                                           const AttentionDims& d, const DropoutSpec& drop, Tensor& dqkv,
                                           Tensor& workspace) {
  check_row_start(qkv, row_start, d);
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < d.batch * d.heads; ++bh)
    backward_head(d, drop, qkv.f32(), dctx.f32(), stats.f32(), dqkv.f32(),
                  packed_head(d, row_start.ptr<int32_t>(), bh), workspace);
}

}  // namespace hone
