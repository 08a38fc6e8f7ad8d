// Embeddings (word + position + token type) and the first-token row gather/scatter.
#include <algorithm>
#include <cstring>

#include "hone/cpu_backend.h"
#include "hone/ops.h"
#include "ops/op_util.h"

namespace hone {

namespace ops {

namespace {

// Checks ids, types and positions (each I32 [B*S], or empty) and the tables (pos and type
// may be empty); returns the embedding width. The tables have dtype `table`: weights in the
// compute dtype or in F32 (mixed precision's master weights), or F32 gradients.
int64_t check_embedding(const char* op, const Tensor& ids, const Tensor& types, const Tensor& positions, int seq,
                        DType table, const Tensor& word, const char* word_name, const Tensor& pos,
                        const char* pos_name, const Tensor& type, const char* type_name) {
  detail::expect_dtype(op, "ids", ids, DType::I32);
  if (types.data) detail::expect(op, "types", types, DType::I32, ids.shape);
  if (positions.data) detail::expect(op, "positions", positions, DType::I32, ids.shape);
  if (seq <= 0 || ids.numel() % seq != 0)
    fail("{}: ids has {} tokens, not a whole number of sequences of {}", op, ids.numel(), seq);
  detail::expect_dtype(op, word_name, word, table);
  detail::expect_rank(op, word_name, word, 2);
  const int64_t hidden = word.shape[1];
  if (pos.data) {
    detail::expect_dtype(op, pos_name, pos, table);
    detail::expect_rank(op, pos_name, pos, 2);
    // Positions given are checked against the table where they are read.
    if ((!positions.data && pos.shape[0] < seq) || pos.shape[1] != hidden)
      fail("{}: {} has shape {}, expected [>= {}, {}]", op, pos_name, pos.shape.str(), seq, hidden);
  } else if (positions.data) {
    fail("{}: position ids given without a {} table", op, pos_name);
  }
  if (!type.data) {
    if (types.data) fail("{}: token types given without a {} table", op, type_name);
    return hidden;
  }
  detail::expect_dtype(op, type_name, type, table);
  detail::expect_rank(op, type_name, type, 2);
  if (type.shape[1] != hidden)
    fail("{}: {} has shape {}, expected [{}, {}]", op, type_name, type.shape.str(), type.shape[0], hidden);
  return hidden;
}

// Checks hidden [B*S, H] against the [CLS] rows [B, H]; names as given.
void check_first_tokens(Backend& be, const char* op, const Tensor& full, const char* full_name, const Tensor& first,
                        const char* first_name, int seq) {
  detail::expect_compute(be, op, full_name, full);
  detail::expect_rank(op, full_name, full, 2);
  if (seq <= 0 || full.shape[0] % seq != 0)
    fail("{}: {} has shape {}, not a whole number of sequences of {}", op, full_name, full.shape.str(), seq);
  detail::expect(op, first_name, first, full.dtype, {full.shape[0] / seq, full.shape[1]});
}

}  // namespace

void embedding_forward(Backend& be, const Tensor& ids, const Tensor& types, const Tensor& positions,
                       const Tensor& word, const Tensor& pos, const Tensor& type, int seq, Tensor& out) {
  detail::expect_compute(be, "embedding_forward", "out", out);
  if (word.dtype != out.dtype && word.dtype != DType::F32)
    fail("embedding_forward: word has dtype {}, expected {} or F32", dtype_name(word.dtype), dtype_name(out.dtype));
  const int64_t hidden = check_embedding("embedding_forward", ids, types, positions, seq, word.dtype, word, "word",
                                         pos, "pos", type, "type");
  detail::expect_shape("embedding_forward", "out", out, {ids.numel(), hidden});
  if (be.dry_run) return;
  // Each token's word row, summed with its position's and type's. Those two tables are
  // shared by every sequence and stay in cache: memory serves each of their rows once
  // (counting them per token put the op past the copy rate, 105% of the roofline).
  const int64_t tokens = ids.numel();
  double table_rows = double(tokens) + double(std::min(tokens, pos.shape[0]));
  if (type.data) table_rows += double(std::min(tokens, type.shape[0]));
  detail::OpScope scope(be, "embedding_forward", OpClass::Elementwise,
                        {0, detail::bytes(ids, types, positions) + double(out.bytes()) +
                                table_rows * double(hidden) * double(dtype_size(word.dtype))});
  be.embedding_forward(ids, types, positions, word, pos, type, seq, out);
}

void embedding_backward(Backend& be, const Tensor& dout, const Tensor& ids, const Tensor& types,
                        const Tensor& positions, int seq, Tensor& dword, Tensor& dpos, Tensor& dtype) {
  const int64_t hidden = check_embedding("embedding_backward", ids, types, positions, seq, DType::F32, dword,
                                         "dword", dpos, "dpos", dtype, "dtype");
  detail::expect_compute(be, "embedding_backward", "dout", dout);
  detail::expect_shape("embedding_backward", "dout", dout, {ids.numel(), hidden});
  if (be.dry_run) return;
  // Each token's gradient is added into its word's F32 row (read and written); the position
  // and type rows, which every sequence shares, are read and written once.
  detail::OpScope scope(be, "embedding_backward", OpClass::Elementwise,
                        {0, detail::bytes(dout, ids, types, positions, dpos, dpos, dtype, dtype) +
                                2.0 * double(dout.numel()) * sizeof(float)});
  be.embedding_backward(dout, ids, types, positions, seq, dword, dpos, dtype);
}

void position_ids_after_padding(Backend& be, const Tensor& ids, int32_t pad, int seq, Tensor& out) {
  const char* op = "position_ids_after_padding";
  detail::expect_dtype(op, "ids", ids, DType::I32);
  detail::expect(op, "out", out, DType::I32, ids.shape);
  if (seq <= 0 || ids.numel() % seq != 0)
    fail("{}: ids has {} tokens, not a whole number of sequences of {}", op, ids.numel(), seq);
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Elementwise, {0, detail::bytes(ids, out)});
  be.position_ids_after_padding(ids, pad, seq, out);
}

namespace {

// hidden [B*S, H] against the mask [B, S] and the pooled rows [B, H].
void check_mean_pool(Backend& be, const char* op, const Tensor& hidden, const char* hidden_name, const Tensor& mask,
                     const Tensor& pooled, const char* pooled_name) {
  detail::expect_compute(be, op, hidden_name, hidden);
  detail::expect_rank(op, hidden_name, hidden, 2);
  detail::expect_dtype(op, "mask", mask, DType::I32);
  detail::expect_rank(op, "mask", mask, 2);
  if (hidden.shape[0] != mask.numel())
    fail("{}: {} has {} rows, expected one per mask element ({})", op, hidden_name, hidden.shape[0], mask.numel());
  detail::expect(op, pooled_name, pooled, hidden.dtype, {mask.shape[0], hidden.shape[1]});
}

}  // namespace

void mean_pool_forward(Backend& be, const Tensor& hidden, const Tensor& mask, Tensor& out) {
  check_mean_pool(be, "mean_pool_forward", hidden, "hidden", mask, out, "out");
  if (be.dry_run) return;
  detail::OpScope scope(be, "mean_pool_forward", OpClass::Elementwise, {double(hidden.numel()), detail::bytes(hidden, mask, out)});
  be.mean_pool_forward(hidden, mask, out);
}

void mean_pool_backward(Backend& be, const Tensor& dout, const Tensor& mask, Tensor& dhidden) {
  check_mean_pool(be, "mean_pool_backward", dhidden, "dhidden", mask, dout, "dout");
  if (be.dry_run) return;
  detail::OpScope scope(be, "mean_pool_backward", OpClass::Elementwise, {double(dhidden.numel()), detail::bytes(dout, mask, dhidden)});
  be.mean_pool_backward(dout, mask, dhidden);
}

// The row starts come from the host's packing, as gather_rows' rows.
void mean_pool_packed(Backend& be, const Tensor& hidden, const Tensor& row_start, Tensor& out) {
  const char* op = "mean_pool_packed";
  detail::expect_compute(be, op, "hidden", hidden);
  detail::expect_rank(op, "hidden", hidden, 2);
  detail::expect_dtype(op, "row_start", row_start, DType::I32);
  detail::expect_rank(op, "row_start", row_start, 1);
  detail::expect(op, "out", out, hidden.dtype, {row_start.shape[0] - 1, hidden.shape[1]});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Elementwise, {double(hidden.numel()), detail::bytes(hidden, row_start, out)});
  be.mean_pool_packed(hidden, row_start, out);
}

void gather_first_tokens(Backend& be, const Tensor& hidden, int seq, Tensor& out) {
  check_first_tokens(be, "gather_first_tokens", hidden, "hidden", out, "out", seq);
  if (be.dry_run) return;
  detail::OpScope scope(be, "gather_first_tokens", OpClass::Copy, {0, detail::bytes(out, out)});
  be.gather_first_tokens(hidden, seq, out);
}

void scatter_first_tokens(Backend& be, const Tensor& dout, int seq, Tensor& dhidden) {
  check_first_tokens(be, "scatter_first_tokens", dhidden, "dhidden", dout, "dout", seq);
  if (be.dry_run) return;
  detail::OpScope scope(be, "scatter_first_tokens", OpClass::Copy, {0, detail::bytes(dout, dhidden)});
  be.scatter_first_tokens(dout, seq, dhidden);
}

// The row indices come from the host's packing, so they are not read here: a bad index is
// the caller's bug, not the user's input.
void gather_rows(Backend& be, const Tensor& src, const Tensor& rows, Tensor& dst) {
  const char* op = "gather_rows";
  detail::expect_rank(op, "src", src, 2);
  detail::expect_rank(op, "rows", rows, 1);
  detail::expect_dtype(op, "rows", rows, DType::I32);
  detail::expect(op, "dst", dst, src.dtype, {rows.shape[0], src.shape[1]});
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Copy, {0, detail::bytes(rows, dst, dst)});
  be.gather_rows(src, rows, dst);
}

void scatter_rows(Backend& be, const Tensor& src, const Tensor& rows, Tensor& dst) {
  const char* op = "scatter_rows";
  detail::expect_rank(op, "dst", dst, 2);
  detail::expect_rank(op, "rows", rows, 1);
  detail::expect_dtype(op, "rows", rows, DType::I32);
  detail::expect(op, "src", src, dst.dtype, {rows.shape[0], dst.shape[1]});
  if (rows.shape[0] > dst.shape[0])
    fail("{}: {} rows do not fit dst of shape {}", op, rows.shape[0], dst.shape.str());
  if (be.dry_run) return;
  detail::OpScope scope(be, op, OpClass::Copy, {0, detail::bytes(rows, src, dst)});
  be.scatter_rows(src, rows, dst);
}

}  // namespace ops

namespace {

// Ids come from user data, so they are checked before any table is indexed.
void check_ids(const Tensor& ids, const Tensor& types, const Tensor& positions, int64_t vocab, int64_t type_vocab,
               int64_t max_positions) {
  const int32_t *ip = ids.ptr<int32_t>(), *tp = types.ptr<int32_t>(), *pp = positions.ptr<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    if (ip[t] < 0 || ip[t] >= vocab)
      fail("token id {} at position {} is out of range for a vocabulary of {}", ip[t], t, vocab);
    if (tp && (tp[t] < 0 || tp[t] >= type_vocab))
      fail("token type {} at position {} is out of range for {} token types", tp[t], t, type_vocab);
    if (pp && (pp[t] < 0 || pp[t] >= max_positions))
      fail("position id {} at token {} is out of range for {} position embeddings", pp[t], t, max_positions);
  }
}

// The embedding rows of token t: position and type (-1: no type term).
struct TokenRows {
  int64_t position, type;
};
TokenRows token_rows(const Tensor& types, const Tensor& positions, const Tensor& type, int64_t t, int seq) {
  const int32_t *tp = types.ptr<int32_t>(), *pp = positions.ptr<int32_t>();
  return {pp ? pp[t] : t % seq, !type.data ? -1 : tp ? tp[t] : 0};
}

}  // namespace

void CpuBackend::embedding_forward(const Tensor& ids, const Tensor& types, const Tensor& positions,
                                   const Tensor& word, const Tensor& pos, const Tensor& type, int seq, Tensor& out) {
  check_ids(ids, types, positions, word.shape[0], type.data ? type.shape[0] : 1, pos.data ? pos.shape[0] : 0);
  const int64_t tokens = ids.numel(), hidden = word.shape[1];
  const int32_t* ip = ids.ptr<int32_t>();
  const float *wp = word.f32(), *pp = pos.data ? pos.f32() : nullptr, *typ = type.data ? type.f32() : nullptr;
  float* op = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const TokenRows r = token_rows(types, positions, type, t, seq);
    const float* w = wp + ip[t] * hidden;
    float* o = op + t * hidden;
    if (!pp) {  // rotary positions (ModernBERT): the word's row alone
      std::copy(w, w + hidden, o);
      continue;
    }
    const float* p = pp + r.position * hidden;
    if (r.type < 0) {
      for (int64_t c = 0; c < hidden; ++c) o[c] = w[c] + p[c];
    } else {
      const float* ty = typ + r.type * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] = w[c] + p[c] + ty[c];
    }
  }
}

void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& types,
                                    const Tensor& positions, int seq, Tensor& dword, Tensor& dpos, Tensor& dtype) {
  check_ids(ids, types, positions, dword.shape[0], dtype.data ? dtype.shape[0] : 1, dpos.data ? dpos.shape[0] : 0);
  const int64_t tokens = ids.numel(), hidden = dword.shape[1];
  const int32_t* ip = ids.ptr<int32_t>();
  const float* dp = dout.f32();
  float *dwp = dword.f32(), *dpp = dpos.data ? dpos.f32() : nullptr, *dtp = dtype.data ? dtype.f32() : nullptr;
  // Tokens repeat ids, so threads split the hidden columns rather than the tokens.
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < hidden; c0 += kBlock) {
    const int64_t c1 = std::min(hidden, c0 + kBlock);
    for (int64_t t = 0; t < tokens; ++t) {
      const TokenRows r = token_rows(types, positions, dtype, t, seq);
      const float* d = dp + t * hidden;
      float* w = dwp + ip[t] * hidden;
      for (int64_t c = c0; c < c1; ++c) w[c] += d[c];
      if (dpp) {
        float* p = dpp + r.position * hidden;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
      if (r.type >= 0) {
        float* ty = dtp + r.type * hidden;
        for (int64_t c = c0; c < c1; ++c) ty[c] += d[c];
      }
    }
  }
}

void CpuBackend::position_ids_after_padding(const Tensor& ids, int32_t pad, int seq, Tensor& out) {
  const int64_t rows = ids.numel() / seq;
  const int32_t* ip = ids.ptr<int32_t>();
  int32_t* op = out.ptr<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    int32_t count = 0;
    for (int64_t t = r * seq; t < (r + 1) * seq; ++t) {
      count += ip[t] != pad;
      op[t] = ip[t] != pad ? pad + count : pad;
    }
  }
}

void CpuBackend::gather_first_tokens(const Tensor& hidden, int seq, Tensor& out) {
  const int64_t batch = out.shape[0], width = out.shape[1];
  const float* hp = hidden.f32();
  float* op = out.f32();
  for (int64_t b = 0; b < batch; ++b) std::memcpy(op + b * width, hp + b * seq * width, width * sizeof(float));
}

namespace {

int64_t attended(const int32_t* mask_row, int64_t seq) {
  int64_t n = 0;
  for (int64_t s = 0; s < seq; ++s) n += mask_row[s] != 0;
  return n;
}

}  // namespace

void CpuBackend::mean_pool_forward(const Tensor& hidden, const Tensor& mask, Tensor& out) {
  const int64_t batch = mask.shape[0], seq = mask.shape[1], width = hidden.shape[1];
  const int32_t* mp = mask.ptr<int32_t>();
  const float* hp = hidden.f32();
  float* op = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = attended(mp + b * seq, seq);
    float* o = op + b * width;
    std::fill(o, o + width, 0.0f);
    for (int64_t s = 0; s < seq; ++s)
      if (mp[b * seq + s])
        for (int64_t c = 0; c < width; ++c) o[c] += hp[(b * seq + s) * width + c];
    if (n > 0)
      for (int64_t c = 0; c < width; ++c) o[c] /= float(n);
  }
}

void CpuBackend::mean_pool_backward(const Tensor& dout, const Tensor& mask, Tensor& dhidden) {
  const int64_t batch = mask.shape[0], seq = mask.shape[1], width = dout.shape[1];
  const int32_t* mp = mask.ptr<int32_t>();
  const float* dp = dout.f32();
  float* hp = dhidden.f32();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    const float n = float(attended(mp + b * seq, seq));
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t c = 0; c < width; ++c)
        hp[(b * seq + s) * width + c] = mp[b * seq + s] ? dp[b * width + c] / n : 0.0f;
  }
}

void CpuBackend::mean_pool_packed(const Tensor& hidden, const Tensor& row_start, Tensor& out) {
  const int64_t batch = out.shape[0], width = hidden.shape[1];
  const int32_t* rs = row_start.ptr<int32_t>();
  const float* hp = hidden.f32();
  float* op = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < batch; ++b) {  // the padded mean's order: row by row, then one division
    float* o = op + b * width;
    std::fill(o, o + width, 0.0f);
    for (int64_t r = rs[b]; r < rs[b + 1]; ++r)
      for (int64_t c = 0; c < width; ++c) o[c] += hp[r * width + c];
    if (rs[b + 1] > rs[b])
      for (int64_t c = 0; c < width; ++c) o[c] /= float(rs[b + 1] - rs[b]);
  }
}

void CpuBackend::gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  const size_t row_bytes = src.bytes() / size_t(src.shape[0]);
  const int32_t* r = rows.ptr<int32_t>();
  const char* from = static_cast<const char*>(src.data);
  char* to = static_cast<char*>(dst.data);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows.numel(); ++i) std::memcpy(to + size_t(i) * row_bytes, from + size_t(r[i]) * row_bytes, row_bytes);
}

void CpuBackend::scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  const size_t row_bytes = dst.bytes() / size_t(dst.shape[0]);
  const int32_t* r = rows.ptr<int32_t>();
  const char* from = static_cast<const char*>(src.data);
  char* to = static_cast<char*>(dst.data);
  std::memset(to, 0, dst.bytes());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows.numel(); ++i) std::memcpy(to + size_t(r[i]) * row_bytes, from + size_t(i) * row_bytes, row_bytes);
}

void CpuBackend::scatter_first_tokens(const Tensor& dout, int seq, Tensor& dhidden) {
  const int64_t batch = dout.shape[0], width = dout.shape[1];
  const float* dp = dout.f32();
  float* hp = dhidden.f32();
  std::memset(hp, 0, dhidden.bytes());
  for (int64_t b = 0; b < batch; ++b) std::memcpy(hp + b * seq * width, dp + b * width, width * sizeof(float));
}

}  // namespace hone
