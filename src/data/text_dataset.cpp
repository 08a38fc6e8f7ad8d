// A text file as a dataset: labels encoded up front, text tokenized on demand.
#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "hone/data.h"
#include "hone/error.h"
#include "hone/tokenizer.h"

namespace hone {

TextDataset::TextDataset(TextTable table, std::shared_ptr<const Tokenizer> tokenizer,
                         const LabelSpace& labels, int max_seq_length, bool with_labels)
    : table_(std::move(table)), tok_(std::move(tokenizer)), max_len_(max_seq_length), regression_(labels.regression) {
  HONE_CHECK(tok_ != nullptr, "text dataset without a tokenizer");
  if (max_len_ < 1) fail("max_seq_length must be positive, got {}", max_len_);
  const size_t n = table_.text.size();
  HONE_CHECK(table_.text_pair.empty() || table_.text_pair.size() == n, "{} pairs for {} texts",
             table_.text_pair.size(), n);
  if (!with_labels) return;
  if (table_.labels.size() != n) fail("{}: the file has no labels", table_.path);
  // Each distinct label is encoded once: a classification has few of them.
  std::unordered_map<std::string_view, float> seen;
  labels_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& l = table_.labels[i];
    auto it = seen.find(l);
    if (it == seen.end())
      it = seen.emplace(l, labels.encode(l, i < table_.line.size()
                                                ? fmt::format("{}:{}", table_.path, table_.line[i])
                                                : fmt::format("{} (row {})", table_.path, i + 1)))
               .first;
    labels_[i] = it->second;
  }
}

int32_t TextDataset::pad_id() const { return tok_->pad_id(); }

int TextDataset::example(int64_t i, int32_t* ids, int32_t* types, float* label) const {
  const size_t r = size_t(i);
  HONE_CHECK(i >= 0 && r < table_.text.size(), "example {} of {}", i, table_.text.size());
  Encoding e;
  if (table_.text_pair.empty()) {
    e = tok_->encode(table_.text[r], nullptr, max_len_);
  } else {
    const std::string_view pair = table_.text_pair[r];
    e = tok_->encode(table_.text[r], &pair, max_len_);
  }
  const int n = int(e.ids.size());
  HONE_CHECK(n <= max_len_ && e.type_ids.size() == e.ids.size(), "example {}: {} ids and {} token types for at most {}",
             i, e.ids.size(), e.type_ids.size(), max_len_);
  std::copy(e.ids.begin(), e.ids.end(), ids);
  std::copy(e.type_ids.begin(), e.type_ids.end(), types);
  *label = labels_.empty() ? 0.0f : labels_[r];
  return n;
}

std::string TextDataset::description() const {
  return fmt::format("{}: {} {}, {}, at most {} tokens each", table_.path, table_.text.size(),
                     table_.text_pair.empty() ? "texts" : "text pairs",
                     labels_.empty() ? "no labels" : regression_ ? "regression targets" : "class labels", max_len_);
}

}  // namespace hone
