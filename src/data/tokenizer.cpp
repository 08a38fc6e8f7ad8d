// BERT WordPiece tokenization with the semantics of the Rust `tokenizers` crate
// (normalizers/bert.rs, pre_tokenizers/bert.rs, models/wordpiece, added_vocabulary.rs,
// utils/truncation.rs). Text is handled as code points; utf8proc supplies the Unicode data.
#include "hone/tokenizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hone/error.h"
#include "hone/safetensors.h"

namespace hone {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- UTF-8

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    utf8proc_int32_t c;
    utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                          utf8proc_ssize_t(s.size() - pos), &c);
    // `tokenizers` only ever sees Python strs, which are valid Unicode: there is no
    // replacement behaviour to match, so malformed input is an error.
    if (n < 0) fail("invalid UTF-8 at byte {} of the text", pos);
    out.push_back(char32_t(c));
    pos += size_t(n);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_int32_t(c), buf);
  out.append(reinterpret_cast<const char*>(buf), size_t(n));
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// ---------------------------------------------------------------- character classes

// `tokenizers` takes punctuation, nonspacing marks and format characters from the crate
// unicode_categories 0.1.1, whose tables are Unicode 8.0 and frozen; utf8proc 2.8 has
// Unicode 15.0. These are the code points where the two disagree, found by running every
// code point through both (tests/tokenizer_parity.py --full checks them all again):
// characters assigned after 8.0, which the crate treats as unassigned, and a few whose
// category changed since.
struct Range {
  char32_t lo, hi;
};
template <size_t N>
bool in(const Range (&ranges)[N], char32_t c) {
  return std::any_of(ranges, ranges + N, [c](const Range& r) { return c >= r.lo && c <= r.hi; });
}
constexpr Range kNewPunctuation[] = {
    {0x61D, 0x61D}, {0x9FD, 0x9FD}, {0xA76, 0xA76}, {0xC77, 0xC77}, {0xC84, 0xC84}, {0x1B7D, 0x1B7E},
    {0x2E43, 0x2E4F}, {0x2E52, 0x2E5D}, {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89},
    {0x1144B, 0x1144F}, {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x11660, 0x1166C}, {0x116B9, 0x116B9},
    {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C},
    {0x11A9E, 0x11AA2}, {0x11B00, 0x11B09}, {0x11C41, 0x11C45}, {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8},
    {0x11F43, 0x11F4F}, {0x11FFF, 0x11FFF}, {0x12FF1, 0x12FF2}, {0x16E97, 0x16E9A}, {0x16FE2, 0x16FE2},
    {0x1E95E, 0x1E95F}};
constexpr Range kNewNonspacingMarks[] = {
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8E1}, {0x9FE, 0x9FE}, {0xAFA, 0xAFF}, {0xB55, 0xB55}, {0xC04, 0xC04},
    {0xC3C, 0xC3C}, {0xD00, 0xD00}, {0xD3B, 0xD3C}, {0xD81, 0xD81}, {0xEBA, 0xEBA}, {0xECE, 0xECE},
    {0x180F, 0x180F}, {0x1885, 0x1886}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFB}, {0xA82C, 0xA82C}, {0xA8C5, 0xA8C5},
    {0xA8FF, 0xA8FF}, {0xA9BD, 0xA9BD}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x11073, 0x11074}, {0x110C2, 0x110C2},
    {0x111C9, 0x111C9}, {0x111CF, 0x111CF}, {0x1123E, 0x1123E}, {0x11241, 0x11241}, {0x1133B, 0x1133B},
    {0x11438, 0x1143F}, {0x11442, 0x11444}, {0x11446, 0x11446}, {0x1145E, 0x1145E}, {0x1182F, 0x11837},
    {0x11839, 0x1183A}, {0x1193B, 0x1193C}, {0x1193E, 0x1193E}, {0x11943, 0x11943}, {0x119D4, 0x119D7},
    {0x119DA, 0x119DB}, {0x119E0, 0x119E0}, {0x11A01, 0x11A0A}, {0x11A33, 0x11A38}, {0x11A3B, 0x11A3E},
    {0x11A47, 0x11A47}, {0x11A51, 0x11A56}, {0x11A59, 0x11A5B}, {0x11A8A, 0x11A96}, {0x11A98, 0x11A99},
    {0x11C30, 0x11C36}, {0x11C38, 0x11C3D}, {0x11C3F, 0x11C3F}, {0x11C92, 0x11CA7}, {0x11CAA, 0x11CB0},
    {0x11CB2, 0x11CB3}, {0x11CB5, 0x11CB6}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D},
    {0x11D3F, 0x11D45}, {0x11D47, 0x11D47}, {0x11D90, 0x11D91}, {0x11D95, 0x11D95}, {0x11D97, 0x11D97},
    {0x11EF3, 0x11EF4}, {0x11F00, 0x11F01}, {0x11F36, 0x11F3A}, {0x11F40, 0x11F40}, {0x11F42, 0x11F42},
    {0x13440, 0x13440}, {0x13447, 0x13455}, {0x16F4F, 0x16F4F}, {0x16FE4, 0x16FE4}, {0x1CF00, 0x1CF2D},
    {0x1CF30, 0x1CF46}, {0x1E000, 0x1E006}, {0x1E008, 0x1E018}, {0x1E01B, 0x1E021}, {0x1E023, 0x1E024},
    {0x1E026, 0x1E02A}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF}, {0x1E944, 0x1E94A}};
constexpr Range kNewFormat[] = {
    {0x890, 0x891}, {0x8E2, 0x8E2}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}};

// Punctuation (Po) in 8.0, no longer P* now: U+166D (So since 12.0), U+111C9 (Mn since 11.0).
bool was_punctuation(char32_t c) { return c == 0x166D || c == 0x111C9; }
// A nonspacing mark in 8.0 that is Mc now: U+1734 (since 14.0).
bool was_nonspacing_mark(char32_t c) { return c == 0x1734; }

utf8proc_category_t category(char32_t c) { return utf8proc_category(utf8proc_int32_t(c)); }

// Rust's char::is_whitespace (the White_Space property): \t..\r, U+0085 and Z*. The crate's
// BERT-specific is_whitespace adds \t \n \r, which White_Space already holds.
bool is_whitespace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x85) return true;
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

// unicode_categories' is_other(), which bert.rs calls is_control: Cc, Cf and Co (not Cn,
// so unassigned code points survive clean_text); \t \n \r are whitespace instead.
bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CO || (k == UTF8PROC_CATEGORY_CF && !in(kNewFormat, c));
}

// ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~) or any P* category.
bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
    return true;
  auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO && !in(kNewPunctuation, c)) || was_punctuation(c);
}

bool is_nonspacing_mark(char32_t c) {
  return (category(c) == UTF8PROC_CATEGORY_MN && !in(kNewNonspacingMarks, c)) || was_nonspacing_mark(c);
}

// The CJK Unified Ideographs blocks as bert.rs lists them (Hangul, kana etc. are not).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Canonical decomposition (NFD) of the whole string, as the crate's NormalizedString::nfd:
// each code point decomposed, then each run of combining marks stably sorted by combining
// class. The crate's tables (unicode-normalization-alignments) are Unicode 9.0: U+11938,
// whose decomposition came with 13.0, stays whole. (Marks added after 9.0 are starters
// there and are ordered here by their real class; the ids can differ only where two of
// them meet and the vocabulary holds them, which BERT's vocabularies do not.)
std::u32string nfd(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    utf8proc_int32_t buf[8];
    utf8proc_ssize_t n =
        c == 0x11938 ? 0 : utf8proc_decompose_char(utf8proc_int32_t(c), buf, 8, UTF8PROC_DECOMPOSE, nullptr);
    HONE_CHECK(n >= 0 && n <= 8, "utf8proc_decompose_char(U+{:04X}): {}", uint32_t(c), n);
    if (n == 0) out += c;
    for (utf8proc_ssize_t i = 0; i < n; ++i) out += char32_t(buf[i]);
  }
  auto ccc = [](char32_t c) { return utf8proc_get_property(utf8proc_int32_t(c))->combining_class; };
  for (size_t i = 0; i < out.size();) {
    size_t j = i;
    while (j < out.size() && ccc(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + i, out.begin() + j, [&](char32_t x, char32_t y) { return ccc(x) < ccc(y); });
    i = j + 1;
  }
  return out;
}

// ---------------------------------------------------------------- files

std::string read_file(const fs::path& p) {
  // A directory opens as a stream that reads nothing: an empty vocab.txt ("cls_token is not
  // in the vocabulary") or JSON file ("unexpected end of input"), not the error it is.
  if (fs::is_directory(p)) fail("tokenizer: {} is a directory, not a file", p.string());
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("tokenizer: cannot read {}: {}", p.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("tokenizer: cannot read {}: read error", p.string());
  return ss.str();
}

json parse_json(const std::string& content, const fs::path& p) {
  try {
    return json::parse(content);
  } catch (const json::exception& e) {
    fail("tokenizer: {} is not valid JSON: {}", p.string(), e.what());
  }
}

// ---------------------------------------------------------------- typed reads
// nlohmann's own type errors ("type must be string, but is number") name neither the file
// nor the field: these do both, and say what the field must be.

std::string describe(const json& v) {
  if (v.is_structured() || v.is_null()) return v.type_name();
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return fmt::format("{} {}", v.type_name(), s);
}

[[noreturn]] void wrong_type(const std::string& file, const std::string& field, std::string_view expected,
                             const json& v) {
  fail("tokenizer: {}: {} must be {}, got {}", file, field, expected, describe(v));
}

std::string field_name(const std::string& where, std::string_view key) {
  return where.empty() ? std::string(key) : where + "." + std::string(key);
}

// obj[key], or null when absent; `obj` (the field `where`, "" for the whole file) must be
// an object.
const json& member(const json& obj, const std::string& file, const std::string& where, std::string_view key) {
  static const json null_value;
  if (!obj.is_object()) wrong_type(file, where.empty() ? "the file's JSON" : where, "an object", obj);
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

// An object field that must be present.
const json& object_member(const json& obj, const std::string& file, const std::string& where, std::string_view key) {
  const json& v = member(obj, file, where, key);
  if (!v.is_object()) wrong_type(file, field_name(where, key), "an object", v);
  return v;
}

bool get_bool(const json& obj, const std::string& file, const std::string& where, std::string_view key,
              bool fallback) {
  const json& v = member(obj, file, where, key);
  if (v.is_null() && !obj.contains(key)) return fallback;
  if (!v.is_boolean()) wrong_type(file, field_name(where, key), "true or false", v);
  return v.get<bool>();
}

// Absent or null: unset (strip_accents: follow lowercase).
std::optional<bool> get_nullable_bool(const json& obj, const std::string& file, const std::string& where,
                                      std::string_view key) {
  const json& v = member(obj, file, where, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean()) wrong_type(file, field_name(where, key), "true, false or null", v);
  return v.get<bool>();
}

std::string get_string(const json& obj, const std::string& file, const std::string& where, std::string_view key,
                       const std::string& fallback) {
  const json& v = member(obj, file, where, key);
  if (v.is_null() && !obj.contains(key)) return fallback;
  if (!v.is_string()) wrong_type(file, field_name(where, key), "a string", v);
  return v.get<std::string>();
}

std::string require_string(const json& obj, const std::string& file, const std::string& where,
                           std::string_view key) {
  const json& v = member(obj, file, where, key);
  if (!v.is_string()) wrong_type(file, field_name(where, key), "a string", v);
  return v.get<std::string>();
}

// An array field; absent or null is empty.
const json& get_array(const json& obj, const std::string& file, const std::string& where, std::string_view key) {
  static const json empty = json::array();
  const json& v = member(obj, file, where, key);
  if (v.is_null()) return empty;
  if (!v.is_array()) wrong_type(file, field_name(where, key), "an array", v);
  return v;
}

// A special token in tokenizer_config.json / special_tokens_map.json: "[CLS]" or
// {"content": "[CLS]", ...}.
void read_special_names(const json& j, const std::string& file, std::string* cls, std::string* sep,
                        std::string* pad, std::string* unk, std::string* mask) {
  const std::pair<const char*, std::string*> fields[] = {
      {"cls_token", cls}, {"sep_token", sep}, {"pad_token", pad}, {"unk_token", unk}, {"mask_token", mask}};
  for (auto [key, out] : fields) {
    const json& v = member(j, file, "", key);
    if (v.is_null()) continue;
    const json& name = v.is_object() ? member(v, file, key, "content") : v;
    if (!name.is_string()) {
      if (v.is_object()) wrong_type(file, field_name(key, "content"), "a string", name);
      wrong_type(file, key, "a token (a string, or an object with a string \"content\")", v);
    }
    *out = name.get<std::string>();
  }
}

// A non-negative integer field (a count, a type id). JSON has one number type, and
// nlohmann's get<int> would take 1.5 as 1 and 2^32 as 0: anything but an integer in
// [0, limit) is an error naming the file and the field.
int64_t read_count(const json& v, const std::string& file, const std::string& what, int64_t limit) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    wrong_type(file, what, "a non-negative integer", v);
  if (v.get<uint64_t>() >= uint64_t(limit))
    fail("tokenizer: {}: {} is {}, more than hone's limit of {}", file, what, v.dump(), limit - 1);
  return int64_t(v.get<uint64_t>());
}

// A token id of a file that defines `defined` tokens (its vocabulary and its added
// tokens): ids are positions in one vocabulary, so a larger one has no token, and would
// make the vocabulary (a vector indexed by id) as long as the id.
int32_t read_id(const json& v, const std::string& file, const std::string& what, size_t defined) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    fail("tokenizer: {}: {} has id {}, which is not a token id (a non-negative integer)", file, what,
         v.is_number() ? v.dump() : describe(v));
  if (v.get<uint64_t>() >= defined)
    fail("tokenizer: {}: {} has id {}, but the file defines {} tokens (ids 0 to {})", file, what, v.dump(), defined,
         defined - 1);
  return int32_t(v.get<uint64_t>());
}

}  // namespace

// ---------------------------------------------------------------- loading

WordPieceTokenizer WordPieceTokenizer::load(const std::string& dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) fail("tokenizer: {} is not a directory", dir);
  WordPieceTokenizer t;
  for (const char* name : {"tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(root / name)) t.source_files_[name] = read_file(root / name);
  if (!t.source_files_.count("tokenizer.json") && !t.source_files_.count("vocab.txt"))
    fail("tokenizer: {} holds neither tokenizer.json nor vocab.txt", dir);

  // transformers reads special token names from both files; the map file wins.
  std::string unk_name;
  json config = json::object();
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    auto it = t.source_files_.find(name);
    if (it == t.source_files_.end()) continue;
    json j = parse_json(it->second, root / name);
    if (!j.is_object()) fail("tokenizer: {} is not a JSON object", (root / name).string());
    read_special_names(j, (root / name).string(), &t.cls_token_, &t.sep_token_, &t.pad_token_, &unk_name,
                       &t.mask_token_);
    if (std::string(name) == "tokenizer_config.json") config = std::move(j);
  }

  // Added tokens: the whole-token matches `tokenizers` makes before the model runs.
  // lstrip / rstrip / single_word change what surrounds a match; no BERT tokenizer sets them.
  // `where` names the entry in messages; `defined`: how many tokens the file defines,
  // which bounds the ids.
  auto add_token = [&t](const json& a, const std::string& file, const std::string& where, size_t defined) {
    if (!a.is_object()) wrong_type(file, where, "an object", a);
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (get_bool(a, file, where, flag, false))
        fail("tokenizer: {}: added token {} sets {}, which hone does not support", file, a.dump(), flag);
    std::string content = require_string(a, file, where, "content");
    if (content.empty()) return;
    AddedToken tok;
    tok.id = read_id(member(a, file, where, "id"), file, fmt::format("added token {}", json(content).dump()), defined);
    tok.normalized = get_bool(a, file, where, "normalized", !get_bool(a, file, where, "special", false));
    tok.content = decode_utf8(content);
    if (size_t(tok.id) >= t.tokens_.size()) t.tokens_.resize(size_t(tok.id) + 1);
    t.tokens_[size_t(tok.id)] = content;  // as the crate's id_to_token, added tokens first
    t.added_.push_back(std::move(tok));
  };

  if (auto it = t.source_files_.find("tokenizer.json"); it != t.source_files_.end()) {
    const std::string file = (root / "tokenizer.json").string();
    json j = parse_json(it->second, root / "tokenizer.json");
    try {
      const json& m = object_member(j, file, "", "model");
      const std::string type = get_string(m, file, "model", "type", "");
      if (type != "WordPiece")
        fail("tokenizer: {}: model type {} is not supported (only WordPiece)", file, type.empty() ? "(none)" : type);
      t.unk_token_ = get_string(m, file, "model", "unk_token", "[UNK]");
      t.prefix_ = get_string(m, file, "model", "continuing_subword_prefix", "##");
      if (m.contains("max_input_chars_per_word"))
        t.max_input_chars_per_word_ = int(read_count(m["max_input_chars_per_word"], file,
                                                     "model.max_input_chars_per_word", int64_t(1) << 31));
      const json& vocab = member(m, file, "model", "vocab");
      if (!vocab.is_object()) wrong_type(file, "model.vocab", "an object of token: id", vocab);
      const json& added = get_array(j, file, "", "added_tokens");
      const size_t defined = vocab.size() + added.size();
      for (const auto& [tok, id_json] : vocab.items()) {
        const int32_t id = read_id(id_json, file, fmt::format("token {}", json(tok).dump()), defined);
        if (size_t(id) >= t.tokens_.size()) t.tokens_.resize(size_t(id) + 1);
        t.tokens_[size_t(id)] = tok;
        t.vocab_[tok] = id;
      }

      const json& norm = member(j, file, "", "normalizer");
      if (norm.is_null()) {
        // No normalizer: the text reaches the pre-tokenizer untouched.
        t.clean_text_ = t.handle_chinese_chars_ = t.lowercase_ = false;
        t.strip_accents_ = false;
      } else if (const std::string type = get_string(norm, file, "normalizer", "type", "");
                 type == "BertNormalizer") {
        t.clean_text_ = get_bool(norm, file, "normalizer", "clean_text", true);
        t.handle_chinese_chars_ = get_bool(norm, file, "normalizer", "handle_chinese_chars", true);
        t.lowercase_ = get_bool(norm, file, "normalizer", "lowercase", true);
        t.strip_accents_ = get_nullable_bool(norm, file, "normalizer", "strip_accents");
      } else {
        fail("tokenizer: {}: normalizer {} is not supported (only BertNormalizer)", file, type.empty() ? "?" : type);
      }

      const json& pre = member(j, file, "", "pre_tokenizer");
      if (!pre.is_object() || !pre.contains("type") || pre.at("type") != "BertPreTokenizer")
        fail("tokenizer: {}: pre_tokenizer {} is not supported (only BertPreTokenizer)", file, describe(pre));

      for (size_t i = 0; i < added.size(); ++i) add_token(added[i], file, fmt::format("added_tokens[{}]", i), defined);

      const json& post = member(j, file, "", "post_processor");
      auto seq = [](int s, int type_id) { return TemplatePiece{s, {}, type_id}; };
      // The post-processor's ids are added to every encoding: each must be a token.
      auto special_id = [&](const json& v, const std::string& what) {
        return read_id(v, file, "post_processor " + what, t.tokens_.size());
      };
      auto type_id = [&](const json& piece, const std::string& where) {
        return piece.contains("type_id") ? int(read_count(piece["type_id"], file, where + ".type_id", 1 << 16)) : 0;
      };
      const std::string post_type = post.is_null() ? "" : get_string(post, file, "post_processor", "type", "");
      if (post.is_null()) {
        // No post-processor: the pair's tokens carry type id 1, nothing is added.
        t.single_ = {seq(0, 0)};
        t.pair_ = {seq(0, 0), seq(1, 1)};
      } else if (post_type == "BertProcessing") {
        auto pair_id = [&](const char* key) {
          const json& v = member(post, file, "post_processor", key);
          if (!v.is_array() || v.size() != 2)
            wrong_type(file, field_name("post_processor", key), "a [token, id] pair", v);
          return special_id(v[1], key);
        };
        TemplatePiece cls{-1, {pair_id("cls")}, 0};
        TemplatePiece sep{-1, {pair_id("sep")}, 0};
        TemplatePiece sep1 = sep;
        sep1.type_id = 1;
        t.single_ = {cls, seq(0, 0), sep};
        t.pair_ = {cls, seq(0, 0), sep, seq(1, 1), sep1};
      } else if (post_type == "TemplateProcessing") {
        const json& specials = object_member(post, file, "post_processor", "special_tokens");
        auto parse = [&](const char* key) {
          std::vector<TemplatePiece> out;
          const json& items = get_array(post, file, "post_processor", key);
          for (size_t i = 0; i < items.size(); ++i) {
            const std::string where = fmt::format("post_processor.{}[{}]", key, i);
            const json& item = items[i];
            if (!item.is_object() || (!item.contains("Sequence") && !item.contains("SpecialToken")))
              wrong_type(file, where, "an object with \"Sequence\" or \"SpecialToken\"", item);
            if (item.contains("Sequence")) {
              const json& s = object_member(item, file, where, "Sequence");
              const std::string which = require_string(s, file, where + ".Sequence", "id");
              if (which != "A" && which != "B")
                fail("tokenizer: {}: {}.Sequence.id is {}: a template sequence is \"A\" or \"B\"", file, where,
                     json(which).dump());
              out.push_back(seq(which == "A" ? 0 : 1, type_id(s, where + ".Sequence")));
            } else {
              const json& s = object_member(item, file, where, "SpecialToken");
              const std::string name = require_string(s, file, where + ".SpecialToken", "id");
              if (!specials.contains(name))
                fail("tokenizer: {}: template token {} is not in post_processor.special_tokens", file,
                     json(name).dump());
              TemplatePiece p{-1, {}, type_id(s, where + ".SpecialToken")};
              const std::string special = fmt::format("special_tokens[{}]", json(name).dump());
              const json& ids = get_array(specials[name], file, "post_processor." + special, "ids");
              for (const json& id : ids) p.ids.push_back(special_id(id, "special token " + json(name).dump()));
              out.push_back(std::move(p));
            }
          }
          return out;
        };
        t.single_ = parse("single");
        t.pair_ = parse("pair");
      } else {
        fail("tokenizer: {}: post_processor {} is not supported", file, post_type.empty() ? "(no type)" : post_type);
      }
    } catch (const json::exception& e) {  // what the typed reads above do not cover
      fail("tokenizer: {}: {}", file, e.what());
    }
  } else {
    // vocab.txt: what transformers' BertTokenizer builds from it. Python reads the file in
    // universal-newline mode, so \n, \r\n and \r all end a token; every line is one id.
    const std::string file = (root / "vocab.txt").string();
    const std::string& text = t.source_files_["vocab.txt"];
    for (size_t pos = 0, line = 1; pos < text.size(); ++line) {
      size_t end = text.find_first_of("\r\n", pos);
      if (end == std::string::npos) end = text.size();
      std::string tok = text.substr(pos, end - pos);
      try {
        decode_utf8(tok);
      } catch (const Error&) {
        fail("tokenizer: {}: line {} is not valid UTF-8", file, line);
      }
      t.vocab_[tok] = int32_t(t.tokens_.size());  // a repeated token keeps its last id, as in Python's dict
      t.tokens_.push_back(std::move(tok));
      pos = end;
      if (pos < text.size()) pos += (text.compare(pos, 2, "\r\n") == 0) ? 2 : 1;
    }
    const std::string cfg_file = (root / "tokenizer_config.json").string();
    try {
      const std::string cls = get_string(config, cfg_file, "", "tokenizer_class", "BertTokenizer");
      if (cls != "BertTokenizer" && cls != "BertTokenizerFast" && cls != "DistilBertTokenizer" &&
          cls != "DistilBertTokenizerFast")
        fail("tokenizer: {}: tokenizer_class {} is not a BERT WordPiece tokenizer", cfg_file, cls);
      t.lowercase_ = get_bool(config, cfg_file, "", "do_lower_case", true);
      t.handle_chinese_chars_ = get_bool(config, cfg_file, "", "tokenize_chinese_chars", true);
      t.strip_accents_ = get_nullable_bool(config, cfg_file, "", "strip_accents");
      if (!unk_name.empty()) t.unk_token_ = unk_name;
      // transformers registers the special tokens as added tokens (matched in the raw
      // text), and so the entries of added_tokens_decoder.
      const json& decoder = member(config, cfg_file, "", "added_tokens_decoder");
      if (!decoder.is_null() && !decoder.is_object())
        wrong_type(cfg_file, "added_tokens_decoder", "an object of id: token", decoder);
      const size_t defined = t.tokens_.size() + decoder.size();
      for (const std::string* name : {&t.pad_token_, &t.unk_token_, &t.cls_token_, &t.sep_token_, &t.mask_token_}) {
        auto v = t.vocab_.find(*name);
        if (v != t.vocab_.end())
          add_token(json{{"content", *name}, {"id", v->second}, {"special", true}, {"normalized", false}}, cfg_file,
                    "special token " + json(*name).dump(), defined);
      }
      if (decoder.is_object())
        for (const auto& [key, a] : decoder.items()) {
          // Keys are ids written as strings: digits only, as Python's int() of a saved id.
          uint64_t id = 0;
          const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
          if (key.empty() || ec != std::errc() || end != key.data() + key.size())
            fail("tokenizer: {}: added_tokens_decoder key {} is not a token id (a non-negative integer)", cfg_file,
                 json(key).dump());
          const std::string where = fmt::format("added_tokens_decoder[{}]", json(key).dump());
          if (!a.is_object()) wrong_type(cfg_file, where, "an object", a);
          json entry = a;
          entry["id"] = id;
          add_token(entry, cfg_file, where, defined);
        }
    } catch (const json::exception& e) {  // what the typed reads above do not cover
      fail("tokenizer: {}: {}", cfg_file, e.what());
    }
    TemplatePiece cls{-1, {t.require_id(t.cls_token_, "cls_token", file)}, 0};
    TemplatePiece sep{-1, {t.require_id(t.sep_token_, "sep_token", file)}, 0};
    TemplatePiece sep1 = sep;
    sep1.type_id = 1;
    t.single_ = {cls, {0, {}, 0}, sep};
    t.pair_ = {cls, {0, {}, 0}, sep, {1, {}, 1}, sep1};
  }

  // Normalized added tokens match the normalized text, so their patterns are normalized too.
  for (AddedToken& a : t.added_)
    if (a.normalized) a.content = t.normalize(a.content);
  // Longest first: the scan below takes the first token that matches at a position.
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

  const std::string where =
      (root / (t.source_files_.count("tokenizer.json") ? "tokenizer.json" : "vocab.txt")).string();
  t.vocabulary_file_ = where;
  // WordPiece's [UNK] comes from the model's own vocabulary, not the added tokens.
  auto unk = t.vocab_.find(t.unk_token_);
  if (unk == t.vocab_.end())
    fail("tokenizer: {}: unk_token {} is not in the vocabulary", where, json(t.unk_token_).dump());
  t.unk_id_ = unk->second;
  t.cls_id_ = t.require_id(t.cls_token_, "cls_token", where);
  t.sep_id_ = t.require_id(t.sep_token_, "sep_token", where);
  t.pad_id_ = t.require_id(t.pad_token_, "pad_token", where);
  return t;
}

int32_t WordPieceTokenizer::require_id(const std::string& name, const std::string& what,
                                       const std::string& file) const {
  for (const AddedToken& a : added_)
    if (!a.normalized && size_t(a.id) < tokens_.size() && tokens_[size_t(a.id)] == name) return a.id;
  auto it = vocab_.find(name);
  if (it == vocab_.end()) fail("tokenizer: {}: {} {} is not in the vocabulary", file, what, json(name).dump());
  return it->second;
}

int WordPieceTokenizer::max_type_id() const {
  int m = 0;
  for (const auto* pieces : {&single_, &pair_})
    for (const TemplatePiece& p : *pieces) m = std::max(m, p.type_id);
  return m;
}

const std::string& WordPieceTokenizer::token(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size())
    fail("tokenizer: token id {} is outside the vocabulary of {}", id, tokens_.size());
  return tokens_[size_t(id)];
}

// ---------------------------------------------------------------- encoding

// BertNormalizer: clean_text, handle_chinese_chars, strip_accents, lowercase, in that order.
std::u32string WordPieceTokenizer::normalize(std::u32string_view s) const {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (clean_text_) {
      if (c == 0 || c == 0xFFFD || is_control(c)) continue;
      if (is_whitespace(c)) c = ' ';
    }
    if (handle_chinese_chars_ && is_chinese_char(c)) {
      out += U' ';
      out += c;
      out += U' ';
    } else {
      out += c;
    }
  }
  if (strip_accents_.value_or(lowercase_)) {
    out = nfd(out);
    std::erase_if(out, is_nonspacing_mark);
  }
  if (lowercase_) {
    std::u32string lower;
    lower.reserve(out.size());
    for (char32_t c : out) {
      // Rust's char::to_lowercase is the full mapping; the only code point whose full
      // lowercase differs from the simple one utf8proc gives is U+0130 (İ -> i + U+0307).
      if (c == 0x130) lower += U"i\u0307";
      else lower += char32_t(utf8proc_tolower(utf8proc_int32_t(c)));
    }
    out = std::move(lower);
  }
  return out;
}

namespace {

// Splits s at the added tokens with the given `normalized` flag: leftmost match first and,
// at one position, the longest (the crate's LeftmostLongest Aho-Corasick). `added` is
// sorted longest first.
template <typename Text, typename Token>
void split_added(std::u32string_view s, const std::vector<WordPieceTokenizer::AddedToken>& added, bool normalized,
                 Text on_text, Token on_token) {
  size_t done = 0;
  for (size_t i = 0; i < s.size();) {
    const WordPieceTokenizer::AddedToken* hit = nullptr;
    for (const auto& a : added)
      if (a.normalized == normalized && s.substr(i).starts_with(a.content)) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > done) on_text(s.substr(done, i - done));
    on_token(*hit);
    i += hit->content.size();
    done = i;
  }
  if (done < s.size()) on_text(s.substr(done));
}

}  // namespace

// WordPiece: greedy longest match from the left; a word longer than
// max_input_chars_per_word or with any unmatched rest becomes one [UNK].
void WordPieceTokenizer::word_piece(const std::u32string& word, std::vector<int32_t>& ids,
                                    std::vector<std::string>* pieces) const {
  auto unk = [&] {
    ids.push_back(unk_id_);
    if (pieces) pieces->push_back(unk_token_);
  };
  if (word.size() > size_t(max_input_chars_per_word_)) return unk();
  std::vector<int32_t> out_ids;
  std::vector<std::string> out_pieces;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    for (; end > start; --end) {
      std::string key = start > 0 ? prefix_ : std::string();
      key += encode_utf8(std::u32string_view(word).substr(start, end - start));
      auto it = vocab_.find(key);
      if (it != vocab_.end()) {
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

std::vector<int32_t> WordPieceTokenizer::encode_sequence(std::string_view text,
                                                         std::vector<std::string>* pieces) const {
  std::vector<int32_t> ids;
  auto on_token = [&](const AddedToken& a) {
    ids.push_back(a.id);
    if (pieces) pieces->push_back(tokens_[size_t(a.id)]);
  };
  // BertPreTokenizer: whitespace separates words and is dropped; punctuation is a word.
  auto pre_tokenize = [&](std::u32string_view s) {
    std::u32string word;
    for (char32_t c : s) {
      bool space = is_whitespace(c), punct = !space && is_punctuation(c);
      if (space || punct) {
        if (!word.empty()) word_piece(word, ids, pieces);
        word.clear();
        if (punct) word_piece(std::u32string(1, c), ids, pieces);
      } else {
        word += c;
      }
    }
    if (!word.empty()) word_piece(word, ids, pieces);
  };
  split_added(decode_utf8(text), added_, false,
              [&](std::u32string_view raw) { split_added(normalize(raw), added_, true, pre_tokenize, on_token); },
              on_token);
  return ids;
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  encode_sequence(text, &pieces);
  return pieces;
}

Encoding WordPieceTokenizer::encode(std::string_view text, const std::string_view* pair, int max_length) const {
  if (max_length < 0) fail("tokenizer: max_length {} is negative", max_length);
  std::vector<int32_t> seq[2];
  seq[0] = encode_sequence(text, nullptr);
  if (pair) seq[1] = encode_sequence(*pair, nullptr);
  const std::vector<TemplatePiece>& tmpl = pair ? pair_ : single_;
  if (max_length > 0) {
    size_t n_special = 0;
    for (const TemplatePiece& p : tmpl) n_special += p.ids.size();
    // `tokenizers` subtracts in unsigned arithmetic here and then skips truncation.
    if (size_t(max_length) < n_special)
      fail("tokenizer: max_length {} is shorter than the {} special tokens", max_length, n_special);
    size_t limit = size_t(max_length) - n_special;
    size_t n1 = seq[0].size(), n2 = seq[1].size();
    if (n1 + n2 > limit) {
      if (!pair) {
        n1 = limit;
      } else {
        // longest_first: cut the longer sequence down to the shorter one's length, then
        // split what is left evenly (the extra token to the longer one).
        bool swap = n1 > n2;
        if (swap) std::swap(n1, n2);
        n2 = n1 > limit ? n1 : std::max(n1, limit - n1);
        if (n1 + n2 > limit) {
          n1 = limit / 2;
          n2 = n1 + limit % 2;
        }
        if (swap) std::swap(n1, n2);
      }
      if (seq[0].size() > n1) seq[0].resize(n1);
      if (seq[1].size() > n2) seq[1].resize(n2);
    }
  }
  Encoding e;
  for (const TemplatePiece& p : tmpl) {
    const std::vector<int32_t>& ids = p.sequence < 0 ? p.ids : seq[p.sequence];
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.type_ids.insert(e.type_ids.end(), ids.size(), p.type_id);
  }
  return e;
}

// ---------------------------------------------------------------- saving

void WordPieceTokenizer::save(const std::string& dir) const {
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail("tokenizer: cannot create {}: {}", dir, ec.message());
  for (const auto& [name, content] : source_files_) {
    std::string out = content;
    if (name == "tokenizer_config.json") {
      // AutoTokenizer needs the class when the directory has no config.json naming the model.
      json j = json::parse(content);
      if (!j.contains("tokenizer_class")) {
        j["tokenizer_class"] = "BertTokenizer";
        out = j.dump(2) + "\n";
      }
    }
    write_file_atomic((root / name).string(), out);
  }
  if (!source_files_.count("vocab.txt")) {
    std::string vocab;
    for (const std::string& tok : tokens_) vocab += tok + "\n";
    write_file_atomic((root / "vocab.txt").string(), vocab);
  }
  if (!source_files_.count("tokenizer_config.json")) {
    json j = {{"tokenizer_class", "BertTokenizer"},
              {"do_lower_case", lowercase_},
              {"strip_accents", strip_accents_ ? json(*strip_accents_) : json()},
              {"tokenize_chinese_chars", handle_chinese_chars_},
              {"model_max_length", 512},
              {"cls_token", cls_token_},
              {"sep_token", sep_token_},
              {"pad_token", pad_token_},
              {"unk_token", unk_token_},
              {"mask_token", mask_token_}};
    write_file_atomic((root / "tokenizer_config.json").string(), j.dump(2) + "\n");
  }
}

}  // namespace hone
