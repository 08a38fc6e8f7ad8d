#pragma once
// The tokenizer of a model directory, giving the same ids as the `tokenizers` package (what
// transformers' fast tokenizers run). It is built as `tokenizers` builds one: added tokens
// are split off the text, the rest is normalized, pre-tokenized into words, and each word
// goes through the model (WordPiece, BPE or Unigram); the post-processor then adds the
// special tokens of its template, after truncation.
//   - BERT: tokenizer.json, or vocab.txt alone (transformers' BertTokenizer defaults).
//   - RoBERTa, GPT-2, ModernBERT: byte-level BPE.
//   - XLM-RoBERTa: Unigram with sentencepiece's Precompiled normalizer and Metaspace.
// Anything hone cannot reproduce exactly is a hone::Error naming the file and the component.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hone {

struct Encoding {
  std::vector<int32_t> ids, type_ids;  // with the template's special tokens; unpadded
};

class Tokenizer {
 public:
  // From a directory: tokenizer.json when present, else vocab.txt (+ tokenizer_config.json
  // and special_tokens_map.json when present). Anything hone cannot reproduce exactly
  // throws hone::Error naming the file.
  static Tokenizer load(const std::string& dir);

  // A text or a pair (pair may be null). max_length > 0 truncates as `tokenizers` does
  // with strategy longest_first; the special tokens count toward max_length. Text must be
  // valid UTF-8 (anything else throws hone::Error).
  Encoding encode(std::string_view text, const std::string_view* pair, int max_length) const;
  // The tokens of a text, without the template's special tokens.
  std::vector<std::string> tokenize(std::string_view text) const;

  // "WordPiece", "BPE" or "Unigram".
  std::string_view model_type() const;
  // The template's first and last special token of a single text ([CLS] and [SEP] for
  // BERT, <s> and </s> for RoBERTa); -1 where the template adds none.
  int32_t cls_id() const { return cls_id_; }
  int32_t sep_id() const { return sep_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }  // -1 where the model has no unknown token
  // One more than the largest id (the rows the model's embedding needs).
  int vocab_size() const { return int(tokens_.size()); }
  // The file the vocabulary came from (tokenizer.json or vocab.txt), for messages.
  const std::string& vocabulary_file() const { return vocabulary_file_; }
  // The largest token type id the post-processor gives (1 for BERT's template, 0 for RoBERTa's).
  int max_type_id() const;
  const std::string& token(int32_t id) const;

  // Writes what transformers' AutoTokenizer.from_pretrained needs into dir: the source's
  // tokenizer files as they were, plus, for a BERT vocabulary, vocab.txt and
  // tokenizer_config.json where the source had none.
  void save(const std::string& dir) const;

  struct Pipeline;  // normalizer, pre-tokenizer, model, templates, added tokens (tokenizer.cpp)

 private:
  std::vector<int32_t> encode_sequence(std::string_view text, std::vector<std::string>* pieces) const;

  std::shared_ptr<const Pipeline> pipeline_;
  std::vector<std::string> tokens_;  // by id: the model's, then the added tokens'
  int32_t cls_id_ = -1, sep_id_ = -1, pad_id_ = 0, unk_id_ = -1;
  std::map<std::string, std::string> source_files_;  // file name -> content, for save()
  std::string vocabulary_file_;
};

}  // namespace hone
