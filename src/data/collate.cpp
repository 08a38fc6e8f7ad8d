// Padding examples into micro-batches, and the length-grouped epoch order.
#include <algorithm>
#include <cstring>

#include "hone/data.h"
#include "hone/error.h"
#include "hone/philox.h"

namespace hone {
namespace {
// The stream of length_grouped_order's shuffle, apart from the other data streams
// (synthetic.cpp: 1 << 62 and (1 << 62) | (1 << 61)), weight init's (1 << 63) and
// dropout's (step << 12 | site).
constexpr uint64_t kLengthGroupStream = (uint64_t(1) << 62) | (uint64_t(1) << 60);

// Uniform in [0, bound) from a 32-bit word (multiply-shift; bias < bound / 2^32).
uint32_t below(uint32_t word, uint64_t bound) { return uint32_t((uint64_t(word) * bound) >> 32); }
}  // namespace

int Dataset::length(int64_t i) const {
  // Scratch per thread, grown once: lengths are asked for every example of a dataset.
  thread_local std::vector<int32_t> ids, types;
  const size_t cap = size_t(std::max(max_seq_len(), 1));
  if (ids.size() < cap) {
    ids.resize(cap);
    types.resize(cap);
  }
  float label = 0.0f;
  return example(i, ids.data(), types.data(), &label);
}

void collate(const Dataset& d, const std::vector<int64_t>& indices, int pad_multiple, Batch& out) {
  const int max_len = d.max_seq_len();
  const int rows = int(indices.size());
  HONE_CHECK(max_len > 0, "dataset with max_seq_len {}", max_len);
  HONE_CHECK(rows == 0 || (out.ids && out.mask && out.types && out.labels), "collate into a batch without buffers");
  // Each example first goes to row r at stride max_len (the buffers hold rows x
  // max_len), which needs no scratch memory; the rows are then packed to stride seq.
  int longest = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = indices[size_t(r)];
    HONE_CHECK(i >= 0 && i < d.size(), "example {} of a dataset of {}", i, d.size());
    const size_t o = size_t(r) * size_t(max_len);
    const int n = d.example(i, out.ids + o, out.types + o, out.labels + r);
    HONE_CHECK(n >= 0 && n <= max_len, "example {} has length {}, the dataset's maximum is {}", i, n, max_len);
    out.mask[o] = n;  // row r's length, until its mask is written
    longest = std::max(longest, n);
  }
  int seq = std::max(longest, rows > 0 ? 1 : 0);
  if (pad_multiple > 1) seq = (seq + pad_multiple - 1) / pad_multiple * pad_multiple;
  seq = std::min(seq, max_len);

  // Row r moves from r * max_len down to r * seq, in increasing r: its new place ends at
  // (r + 1) * seq <= (r + 1) * max_len, before any row not yet moved (and before the
  // lengths of those rows in the mask buffer). Row r's own length is read first.
  const int32_t pad = d.pad_id();
  for (int r = 0; r < rows; ++r) {
    const size_t src = size_t(r) * size_t(max_len), dst = size_t(r) * size_t(seq);
    const size_t n = size_t(out.mask[src]);
    if (src != dst && n > 0) {
      std::memmove(out.ids + dst, out.ids + src, n * sizeof(int32_t));
      std::memmove(out.types + dst, out.types + src, n * sizeof(int32_t));
    }
    std::fill(out.ids + dst + n, out.ids + dst + size_t(seq), pad);
    std::fill(out.types + dst + n, out.types + dst + size_t(seq), 0);
    std::fill(out.mask + dst, out.mask + dst + n, 1);
    std::fill(out.mask + dst + n, out.mask + dst + size_t(seq), 0);
  }
  out.rows = rows;
  out.seq = seq;
  out.indices.assign(indices.begin(), indices.end());  // no allocation once reserved
}

std::vector<int64_t> length_grouped_order(const std::vector<int>& lengths, int batch_size, uint64_t seed,
                                          int64_t epoch) {
  HONE_CHECK(batch_size > 0, "length-grouped order with batch size {}", batch_size);
  const int64_t n = int64_t(lengths.size());
  // transformers' get_length_grouped_indices: a random permutation cut into megabatches
  // of min(n / (4 * batch_size), 50) batches (at least one), each sorted by length,
  // longest first (Python's sort is stable: ties keep the permutation's order).
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    uint32_t w = philox_word(seed, kLengthGroupStream | uint64_t(epoch), uint64_t(i));
    std::swap(order[size_t(i)], order[below(w, uint64_t(i) + 1)]);
  }
  const int64_t mult = std::clamp<int64_t>(n / (4 * int64_t(batch_size)), 1, 50);
  const int64_t mega = mult * batch_size;
  auto longer = [&](int64_t a, int64_t b) { return lengths[size_t(a)] > lengths[size_t(b)]; };
  int64_t best = 0;  // the megabatch whose first (longest) example is the longest overall
  for (int64_t lo = 0; lo < n; lo += mega) {
    const int64_t hi = std::min(n, lo + mega);
    std::stable_sort(order.begin() + lo, order.begin() + hi, longer);
    if (lengths[size_t(order[size_t(lo)])] > lengths[size_t(order[size_t(best)])]) best = lo;
  }
  // Then the longest example is swapped to the very front, so that the first batch is
  // the largest and an out-of-memory error shows at once (the element swap, as
  // transformers does; the megabatch it came from gets megabatch 0's longest instead).
  if (n > 0) std::swap(order[0], order[size_t(best)]);
  return order;
}

}  // namespace hone
