#pragma once
// BERT's WordPiece tokenizer, giving the same ids as the `tokenizers` package (what
// transformers' BertTokenizer / BertTokenizerFast run): BertNormalizer, then
// BertPreTokenizer, then WordPiece, then the post-processor's [CLS]/[SEP] template.
// Special tokens written in the text ("[MASK]") are recognised as in `tokenizers`.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hone {

struct Encoding {
  std::vector<int32_t> ids, type_ids;  // with [CLS]/[SEP]; unpadded
};

class WordPieceTokenizer {
 public:
  // From a directory: tokenizer.json when present, else vocab.txt (+ tokenizer_config.json
  // and special_tokens_map.json when present, defaults as transformers' BertTokenizer).
  // Anything hone cannot reproduce exactly throws hone::Error naming the file.
  static WordPieceTokenizer load(const std::string& dir);

  // A text or a pair (pair may be null). max_length > 0 truncates as `tokenizers` does
  // with strategy longest_first; the special tokens count toward max_length. Text must be
  // valid UTF-8 (anything else throws hone::Error).
  Encoding encode(std::string_view text, const std::string_view* pair, int max_length) const;
  // The word pieces of a text, without the template's special tokens.
  std::vector<std::string> tokenize(std::string_view text) const;

  int32_t cls_id() const { return cls_id_; }
  int32_t sep_id() const { return sep_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  int vocab_size() const { return int(tokens_.size()); }
  // The file the vocabulary came from (tokenizer.json or vocab.txt), for messages.
  const std::string& vocabulary_file() const { return vocabulary_file_; }
  // The largest token type id the post-processor gives (0 or 1 for BERT's template).
  int max_type_id() const;
  const std::string& token(int32_t id) const;

  // Writes what transformers' AutoTokenizer.from_pretrained needs into dir: the source's
  // tokenizer files as they were, plus vocab.txt and tokenizer_config.json where the
  // source had none.
  void save(const std::string& dir) const;

  // Implementation details (public for the helpers in tokenizer.cpp).
  // A piece of the post-processor's template: a special token or sequence A / B.
  struct TemplatePiece {
    int sequence = -1;             // 0: A, 1: B, -1: the special ids below
    std::vector<int32_t> ids;
    int type_id = 0;
  };
  struct AddedToken {
    std::u32string content;        // normalized form when `normalized`
    int32_t id = 0;
    bool normalized = false;       // matched in the normalized text rather than the raw one
  };

 private:
  std::vector<int32_t> encode_sequence(std::string_view text, std::vector<std::string>* pieces) const;
  std::u32string normalize(std::u32string_view s) const;
  void word_piece(const std::u32string& word, std::vector<int32_t>& ids,
                  std::vector<std::string>* pieces) const;
  int32_t require_id(const std::string& name, const std::string& what, const std::string& file) const;

  // BertNormalizer
  bool clean_text_ = true, handle_chinese_chars_ = true, lowercase_ = true;
  std::optional<bool> strip_accents_;  // unset: follows lowercase_
  // WordPiece
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;    // by id
  std::string unk_token_ = "[UNK]", prefix_ = "##";
  int max_input_chars_per_word_ = 100;
  std::vector<AddedToken> added_;
  std::vector<TemplatePiece> single_, pair_;
  std::string cls_token_ = "[CLS]", sep_token_ = "[SEP]", pad_token_ = "[PAD]", mask_token_ = "[MASK]";
  int32_t cls_id_ = 0, sep_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  std::map<std::string, std::string> source_files_;  // file name -> content, for save()
  std::string vocabulary_file_;
};

}  // namespace hone
