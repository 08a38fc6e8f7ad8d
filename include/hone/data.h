#pragma once
// Datasets hand out examples unpadded; the collator pads each micro-batch to its longest
// example, and the loader prepares batches ahead of the step in (pinned) host memory.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hone {

class Backend;
class Tokenizer;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int max_seq_len() const = 0;        // no example is longer
  virtual bool float_labels() const = 0;      // regression targets rather than class ids
  virtual int32_t pad_id() const { return 0; }
  // Writes example i unpadded, at most max_seq_len() token ids and token types, and its
  // label; returns its length. Safe to call from several threads at once.
  virtual int example(int64_t i, int32_t* ids, int32_t* types, float* label) const = 0;
  // The length of example i (for --group_by_length); by default through example().
  virtual int length(int64_t i) const;
  virtual std::string description() const = 0;
};

// The seed notebook's data: token ids uniform in [100, 30000), attention mask all ones,
// token types 0, label 0 (np.random.randint(0, 1) is always 0), regression target 0.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t n, int len, uint64_t seed, bool float_labels);
  int64_t size() const override { return n_; }
  int max_seq_len() const override { return len_; }
  bool float_labels() const override { return float_labels_; }
  int example(int64_t i, int32_t* ids, int32_t* types, float* label) const override;
  int length(int64_t) const override { return len_; }
  std::string description() const override;
  static constexpr int32_t kMinId = 100, kEndId = 30000;

 private:
  int64_t n_;
  int len_;
  uint64_t seed_;
  bool float_labels_;
};

// Every example of a dataset made once, in parallel, and held in host memory (8 bytes a
// token): evaluation sorts its examples by length, which tokenizes every text anyway, and
// its batches then copy them rather than tokenizing again one batch at a time in the
// loop, where the GPU waits for the host.
class PreparedDataset final : public Dataset {
 public:
  explicit PreparedDataset(const Dataset& d);
  int64_t size() const override { return int64_t(labels_.size()); }
  int max_seq_len() const override { return data_.max_seq_len(); }
  bool float_labels() const override { return data_.float_labels(); }
  int32_t pad_id() const override { return data_.pad_id(); }
  int example(int64_t i, int32_t* ids, int32_t* types, float* label) const override;
  int length(int64_t i) const override { return int(offsets_[size_t(i) + 1] - offsets_[size_t(i)]); }
  std::string description() const override { return data_.description(); }

 private:
  const Dataset& data_;
  std::vector<int64_t> offsets_;  // example i's tokens are [offsets_[i], offsets_[i + 1])
  std::vector<int32_t> ids_, types_;
  std::vector<float> labels_;
};

// "synthetic:NxL" → a SyntheticDataset; anything else is an error naming the flag.
std::unique_ptr<Dataset> open_dataset(const std::string& spec, uint64_t seed, bool float_labels);

// The order of one epoch: a permutation of [0, n) that depends only on (seed, epoch).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// --group_by_length: a shuffled order in which each batch holds examples of similar
// length (Trainer's LengthGroupedSampler: megabatches of min(n / (4 batch_size), 50)
// batches, at least one, each sorted by length, longest first; then the longest example
// overall is swapped to the very front). Depends only on (lengths, seed, epoch).
std::vector<int64_t> length_grouped_order(const std::vector<int>& lengths, int batch_size, uint64_t seed,
                                          int64_t epoch);

// ---------------------------------------------------------------- collation

// One micro-batch in host memory: rows x seq, row-major, padded with pad_id, mask 0 and
// token type 0. Buffers hold up to batch_size x max_seq_len entries.
struct Batch {
  int rows = 0, seq = 0;
  int32_t *ids = nullptr, *mask = nullptr, *types = nullptr;
  float* labels = nullptr;
  std::vector<int64_t> indices;  // the examples, in row order
};

// Fills `out` with the examples `indices`, padded to the longest of them rounded up to a
// multiple of pad_multiple, but not past the dataset's max_seq_len(). out's buffers must
// hold indices.size() x max_seq_len() entries (collate uses them as scratch).
void collate(const Dataset& d, const std::vector<int64_t>& indices, int pad_multiple, Batch& out);

// ---------------------------------------------------------------- loading

struct LoaderOptions {
  int num_workers = 0;    // threads preparing batches ahead; 0: prepared in the caller's thread (as in HF)
  bool pin_memory = true; // page-locked staging buffers on a GPU
  int pad_to_multiple_of = 8;
  int batch_size = 8;     // the largest batch
};

// Prepares the given batches, in order, into staging buffers allocated once. With
// workers, each prepares batches ahead (two per worker, as DataLoader's prefetch_factor);
// an error in a worker is rethrown by next().
class BatchLoader {
 public:
  BatchLoader(const Dataset& d, std::vector<std::vector<int64_t>> batches, const LoaderOptions& o, Backend& be);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;
  // The next batch; nullptr after the last. Valid until the following call: the buffer
  // of the previous batch is recycled once the backend has finished copying from it.
  const Batch* next();

 private:
  struct Slot;
  void work();
  void release(Slot* s);

  const Dataset& data_;
  std::vector<std::vector<int64_t>> batches_;
  LoaderOptions opt_;
  Backend& be_;
  bool pinned_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Slot*> free_;
  size_t next_to_fill_ = 0;      // batch index a worker takes next
  size_t next_to_hand_ = 0;      // batch index next() returns next
  Slot* handed_ = nullptr;       // returned by the last next()
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

// ---------------------------------------------------------------- text files

// Which columns hold the text, the optional second text of a pair, and the label.
struct TextColumns {
  std::string text = "sentence";
  std::string text_pair;  // empty: single sentences
  std::string label = "label";
};

// The rows of a JSONL, CSV or TSV file (by extension: .jsonl/.json, .csv, .tsv), read in
// full: a malformed line, a missing column, text that is not UTF-8 or holds a NUL byte,
// or an empty file is an error naming the file and line (and the column). Labels are kept
// as written (JSON numbers in their shortest form).
struct TextTable {
  std::string path;
  std::vector<std::string> text, text_pair, labels;  // labels empty when not required
  std::vector<int64_t> line;                         // 1-based line of each row, for messages
  std::string label_column;                          // where the labels come from, for messages
};
TextTable read_text_table(const std::string& path, const TextColumns& columns, bool require_labels);

// The label set of a run: class names in id order, or a regression target.
struct LabelSpace {
  bool regression = false;
  std::vector<std::string> names;  // id -> name
  // From training labels, typed as pandas types a column: numbers of which some are
  // written as floats ("2.5", "1.0") make a regression; non-negative integers keep their
  // values as ids 0..max (unless more than half of those ids would be unused); other
  // labels (strings, or sparse or negative integers by value) are sorted (as run_glue does).
  // Throws when there are no labels, when class names are mixed with numbers (naming the
  // line of the first value of the rarer kind), and when every label is the same class,
  // unless regression_model (the model's config is a regression) and that label is an
  // integer: then the labels are regression targets.
  static LabelSpace infer(const TextTable& train, bool regression_model = false);
  // A label's id (or value, for regression); nullopt for a label outside the set.
  std::optional<float> find(const std::string& label) const;
  // The same, where an unknown label is an error naming where.
  float encode(const std::string& label, const std::string& where) const;
};

// Examples tokenized on demand (in the loader's threads).
class TextDataset final : public Dataset {
 public:
  // Without labels (prediction), every label is 0.
  TextDataset(TextTable table, std::shared_ptr<const Tokenizer> tokenizer, const LabelSpace& labels,
              int max_seq_length, bool with_labels);
  int64_t size() const override { return int64_t(table_.text.size()); }
  int max_seq_len() const override { return max_len_; }
  bool float_labels() const override { return regression_; }
  int32_t pad_id() const override;
  int example(int64_t i, int32_t* ids, int32_t* types, float* label) const override;
  std::string description() const override;
  const TextTable& table() const { return table_; }

 private:
  TextTable table_;
  std::shared_ptr<const Tokenizer> tok_;
  std::vector<float> labels_;
  int max_len_;
  bool regression_;
};

}  // namespace hone
