#pragma once
// Datasets hand out examples as fixed-length rows; the loader stages batches on the host.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hone {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int seq_len() const = 0;            // every example is padded to this length
  virtual bool float_labels() const = 0;      // regression targets rather than class ids
  // Writes example i: seq_len() ids, attention mask and token types, and its label.
  virtual void example(int64_t i, int32_t* ids, int32_t* mask, int32_t* types, float* label) const = 0;
  virtual std::string description() const = 0;
};

// The seed notebook's data: token ids uniform in [100, 30000), attention mask all ones,
// token types 0, label 0 (np.random.randint(0, 1) is always 0), regression target 0.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t n, int len, uint64_t seed, bool float_labels);
  int64_t size() const override { return n_; }
  int seq_len() const override { return len_; }
  bool float_labels() const override { return float_labels_; }
  void example(int64_t i, int32_t* ids, int32_t* mask, int32_t* types, float* label) const override;
  std::string description() const override;
  static constexpr int32_t kMinId = 100, kEndId = 30000;

 private:
  int64_t n_;
  int len_;
  uint64_t seed_;
  bool float_labels_;
};

// "synthetic:NxL" → a SyntheticDataset; anything else is an error naming the flag.
std::unique_ptr<Dataset> open_dataset(const std::string& spec, uint64_t seed, bool float_labels);

// The order of one epoch: a permutation of [0, n) that depends only on (seed, epoch).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace hone
