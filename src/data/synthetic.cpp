#include <fmt/format.h>

#include "hone/args.h"
#include "hone/data.h"
#include "hone/philox.h"

namespace hone {
namespace {
// Streams of the data generators, apart from dropout's and weight init's.
constexpr uint64_t kDataStream = uint64_t(1) << 62;
constexpr uint64_t kShuffleStream = (uint64_t(1) << 62) | (uint64_t(1) << 61);

// Uniform in [0, bound) from a 32-bit word (multiply-shift; bias < bound / 2^32).
uint32_t below(uint32_t word, uint64_t bound) { return uint32_t((uint64_t(word) * bound) >> 32); }
}  // namespace

SyntheticDataset::SyntheticDataset(int64_t n, int len, uint64_t seed, bool float_labels)
    : n_(n), len_(len), seed_(seed), float_labels_(float_labels) {}

int SyntheticDataset::example(int64_t i, int32_t* ids, int32_t* types, float* label) const {
  for (int t = 0; t < len_; ++t) {
    uint32_t w = philox_word(seed_, kDataStream, uint64_t(i) * uint64_t(len_) + uint64_t(t));
    ids[t] = kMinId + int32_t(below(w, kEndId - kMinId));
    types[t] = 0;
  }
  *label = 0.0f;
  return len_;
}

std::string SyntheticDataset::description() const {
  return fmt::format("synthetic: {} sequences of {} token ids in [{}, {}), label 0", n_, len_, kMinId, kEndId);
}

std::unique_ptr<Dataset> open_dataset(const std::string& spec, uint64_t seed, bool float_labels) {
  SyntheticSpec s = parse_synthetic_dataset(spec);
  return std::make_unique<SyntheticDataset>(s.n, s.len, seed, float_labels);
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  // Fisher-Yates, drawing from Philox so that the order is the same on every platform.
  for (int64_t i = n - 1; i > 0; --i) {
    uint32_t w = philox_word(seed, kShuffleStream | uint64_t(epoch), uint64_t(i));
    std::swap(order[size_t(i)], order[below(w, uint64_t(i) + 1)]);
  }
  return order;
}

}  // namespace hone
