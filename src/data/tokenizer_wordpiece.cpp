// WordPiece (BERT's model) as the crate's models/wordpiece: greedy longest match from the
// left, continuation pieces prefixed ("##"); a word longer than max_input_chars_per_word
// or with any rest that matches nothing becomes one unk token.
#include <fmt/format.h>

#include "data/tokenizer_parts.h"
#include "hone/error.h"

namespace hone::tok {
namespace {

class WordPiece final : public Model {
 public:
  std::string unk_token = "[UNK]", prefix = "##";
  size_t max_input_chars_per_word = 100;

  std::string_view type() const override { return "WordPiece"; }

  void tokenize(const std::u32string& word, std::vector<int32_t>& ids,
                std::vector<std::string>* pieces) const override {
    auto unk = [&] {
      auto it = vocab.find(unk_token);
      if (it == vocab.end()) fail("tokenizer: WordPiece: unk_token {} is not in the vocabulary", json(unk_token).dump());
      ids.push_back(it->second);
      if (pieces) pieces->push_back(unk_token);
    };
    if (word.size() > max_input_chars_per_word) return unk();
    std::vector<int32_t> out_ids;
    std::vector<std::string> out_pieces;
    for (size_t start = 0; start < word.size();) {
      size_t end = word.size();
      for (; end > start; --end) {
        std::string key = start > 0 ? prefix : std::string();
        key += encode_utf8(std::u32string_view(word).substr(start, end - start));
        auto it = vocab.find(key);
        if (it != vocab.end()) {
          out_ids.push_back(it->second);
          out_pieces.push_back(std::move(key));
          break;
        }
      }
      if (end == start) return unk();
      start = end;
    }
    ids.insert(ids.end(), out_ids.begin(), out_ids.end());
    if (pieces) pieces->insert(pieces->end(), out_pieces.begin(), out_pieces.end());
  }
};

}  // namespace

std::unique_ptr<Model> load_wordpiece(const json& m, const Source& src) {
  const std::string& file = src.file;
  auto wp = std::make_unique<WordPiece>();
  wp->unk_token = get_string(m, file, "model", "unk_token", "[UNK]");
  wp->prefix = get_string(m, file, "model", "continuing_subword_prefix", "##");
  if (m.contains("max_input_chars_per_word"))
    wp->max_input_chars_per_word =
        size_t(read_count(m["max_input_chars_per_word"], file, "model.max_input_chars_per_word", int64_t(1) << 31));
  const json& vocab = member(m, file, "model", "vocab");
  if (!vocab.is_object()) wrong_type(file, "model.vocab", "an object of token: id", vocab);
  for (const auto& [tok, id_json] : vocab.items())
    wp->add_token(tok, read_id(id_json, file, fmt::format("token {}", json(tok).dump()), src.defined));
  return wp;
}

std::unique_ptr<Model> make_wordpiece(const std::vector<std::string>& lines, const std::string& unk_token) {
  auto wp = std::make_unique<WordPiece>();
  wp->unk_token = unk_token;
  for (size_t i = 0; i < lines.size(); ++i) wp->add_token(lines[i], int32_t(i));
  return wp;
}

}  // namespace hone::tok
