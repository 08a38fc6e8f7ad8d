// A dataset's examples made once, in parallel, and served from memory (data.h).
#include <algorithm>
#include <cstring>
#include <exception>

#include "hone/data.h"
#include "hone/error.h"

namespace hone {

PreparedDataset::PreparedDataset(const Dataset& d) : data_(d) {
  const int64_t n = d.size();
  const size_t cap = size_t(std::max(d.max_seq_len(), 1));
  offsets_.assign(size_t(n) + 1, 0);
  labels_.resize(size_t(n));
  // In chunks of about 2 Mi tokens of scratch (4096 rows of 512; 256 of ModernBERT's 8192),
  // so that beside the kept tokens only one chunk's rows of max_seq_len are held.
  const int64_t kChunk = std::max<int64_t>(1, (int64_t(1) << 21) / int64_t(cap));
  const int64_t rows = std::min(n, kChunk);
  std::vector<int32_t> ids(size_t(rows) * cap), types(size_t(rows) * cap);
  std::vector<int> lengths(static_cast<size_t>(rows));
  for (int64_t lo = 0; lo < n; lo += kChunk) {
    const int64_t hi = std::min(n, lo + kChunk);
    std::exception_ptr error;  // the first example that failed: rethrown here, not inside the parallel loop
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = lo; i < hi; ++i) {
      const size_t at = size_t(i - lo) * cap;
      try {
        lengths[size_t(i - lo)] = d.example(i, &ids[at], &types[at], &labels_[size_t(i)]);
      } catch (...) {
#pragma omp critical(prepared_dataset_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (int64_t i = lo; i < hi; ++i) {
      const int len = lengths[size_t(i - lo)];
      HONE_CHECK(len >= 0 && size_t(len) <= cap, "example {} of {} has {} tokens, past its {}", i, d.description(),
                 len, cap);
      const size_t at = size_t(i - lo) * cap;
      ids_.insert(ids_.end(), ids.begin() + at, ids.begin() + at + len);
      types_.insert(types_.end(), types.begin() + at, types.begin() + at + len);
      offsets_[size_t(i) + 1] = offsets_[size_t(i)] + len;
    }
  }
}

int PreparedDataset::example(int64_t i, int32_t* ids, int32_t* types, float* label) const {
  const size_t from = size_t(offsets_[size_t(i)]), len = size_t(offsets_[size_t(i) + 1]) - from;
  std::memcpy(ids, ids_.data() + from, len * sizeof(int32_t));
  std::memcpy(types, types_.data() + from, len * sizeof(int32_t));
  *label = labels_[size_t(i)];
  return int(len);
}

}  // namespace hone
