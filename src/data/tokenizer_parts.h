#pragma once
// The pieces a Tokenizer is built from, as `tokenizers` builds one (normalizer ->
// pre-tokenizer -> model -> post-processor), and the helpers they share: UTF-8, Unicode
// classes and typed reads of tokenizer.json that name the file and the field on error.
// Internal to src/data/tokenizer*.cpp.
#include <utf8proc.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hone::tok {

using json = nlohmann::json;

// ---------------------------------------------------------------- text

std::u32string decode_utf8(std::string_view s);  // hone::Error on invalid UTF-8
void append_utf8(std::string& out, char32_t c);
std::string encode_utf8(std::u32string_view s);

inline utf8proc_category_t category(char32_t c) { return utf8proc_category(utf8proc_int32_t(c)); }
// Rust's char::is_whitespace (White_Space), which is also Oniguruma's and Rust regex's \s.
bool is_whitespace(char32_t c);
// Rust's full char::to_lowercase.
void append_lowercase(std::u32string& out, char32_t c);
// Canonical decomposition as the crate's NormalizedString::nfd.
std::u32string nfd(std::u32string_view s);

// A JSON number's text as `tokenizers` (serde_json) reads it; see tokenizer_text.cpp.
double serde_f64(std::string_view s);

// ---------------------------------------------------------------- typed JSON reads
// Each names `file` and the field (`where` + key) in its message.

std::string describe(const json& v);
[[noreturn]] void wrong_type(const std::string& file, const std::string& field, std::string_view expected,
                             const json& v);
std::string field_name(const std::string& where, std::string_view key);
const json& member(const json& obj, const std::string& file, const std::string& where, std::string_view key);
const json& object_member(const json& obj, const std::string& file, const std::string& where, std::string_view key);
bool get_bool(const json& obj, const std::string& file, const std::string& where, std::string_view key,
              bool fallback);
std::optional<bool> get_nullable_bool(const json& obj, const std::string& file, const std::string& where,
                                      std::string_view key);
std::string get_string(const json& obj, const std::string& file, const std::string& where, std::string_view key,
                       const std::string& fallback);
std::string require_string(const json& obj, const std::string& file, const std::string& where,
                           std::string_view key);
const json& get_array(const json& obj, const std::string& file, const std::string& where, std::string_view key);
int64_t read_count(const json& v, const std::string& file, const std::string& what, int64_t limit);
int32_t read_id(const json& v, const std::string& file, const std::string& what, size_t defined);
// A component's "type" (obj must be an object).
std::string component_type(const json& obj, const std::string& file, const std::string& where);
// "component X is not supported (hone has A, B, C)".
[[noreturn]] void unsupported(const std::string& file, const std::string& component, const std::string& type,
                              std::string_view supported);

// ---------------------------------------------------------------- pipeline

// A split of the text on its way to the model. at_start: it begins at offset 0 of the
// original sequence (Metaspace's prepend_scheme "first" asks).
struct Piece {
  std::u32string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::u32string normalize(std::u32string s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and may rewrite) every piece; empty pieces are dropped by the caller.
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string_view type() const = 0;
  // The ids (and, with `pieces`, the token strings) of one pre-tokenized word.
  virtual void tokenize(const std::u32string& word, std::vector<int32_t>& ids,
                        std::vector<std::string>* pieces) const = 0;
  // token -> id, and id -> token with "" where no token has the id.
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;
  void add_token(const std::string& token, int32_t id);  // a repeated token keeps its last id
};

// A piece of the post-processor's template: a special token or sequence A / B.
struct TemplatePiece {
  int sequence = -1;  // 0: A, 1: B, -1: the special ids below
  std::vector<int32_t> ids;
  int type_id = 0;
};
struct Templates {
  std::vector<TemplatePiece> single, pair;
};

// Where a component's JSON came from, for messages; `defined` bounds the ids.
struct Source {
  std::string file;
  size_t defined = 0;
};

std::unique_ptr<Normalizer> load_normalizer(const json& j, const Source& src, const std::string& where);
std::unique_ptr<PreTokenizer> load_pre_tokenizer(const json& j, const Source& src, const std::string& where);
// `model_tokens`: the post-processor's ids must be below it.
Templates load_post_processor(const json& j, const Source& src, size_t model_tokens);

// BERT's pieces, built directly for a vocab.txt directory too.
std::unique_ptr<Normalizer> make_bert_normalizer(bool clean_text, bool handle_chinese_chars,
                                                 std::optional<bool> strip_accents, bool lowercase);
std::unique_ptr<PreTokenizer> make_bert_pre_tokenizer();

std::unique_ptr<Model> load_wordpiece(const json& m, const Source& src);
// vocab.txt's WordPiece: one token a line, ids in line order.
std::unique_ptr<Model> make_wordpiece(const std::vector<std::string>& lines, const std::string& unk_token);
std::unique_ptr<Model> load_bpe(const json& m, const Source& src);
std::unique_ptr<Model> load_unigram(const json& m, const Source& src);

}  // namespace hone::tok
