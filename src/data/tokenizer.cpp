// The Tokenizer: loading tokenizer.json (or a BERT vocab.txt) into its pipeline, added
// tokens (the crate's added_vocabulary.rs), truncation (utils/truncation.rs), the
// post-processor's template, and save(). The pieces are in tokenizer_{pipeline,wordpiece,
// bpe,unigram}.cpp.
#include "hone/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/tokenizer_parts.h"
#include "hone/error.h"
#include "hone/safetensors.h"

namespace hone {

using namespace tok;

// A token matched whole in the text before the model runs.
struct AddedToken {
  std::u32string content;  // normalized form when `normalized`
  int32_t id = 0;
  bool normalized = false;  // matched in the normalized text rather than the raw one
  bool lstrip = false, rstrip = false, single_word = false;
};

struct Tokenizer::Pipeline {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  Templates templates;
  std::vector<AddedToken> added;  // longest first
  // A BERT vocabulary's settings, for the tokenizer_config.json save() writes.
  bool lowercase = true, handle_chinese_chars = true;
  std::optional<bool> strip_accents;
  std::string cls_token = "[CLS]", sep_token = "[SEP]", pad_token = "[PAD]", unk_token = "[UNK]",
              mask_token = "[MASK]";
};

namespace {

namespace fs = std::filesystem;

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

// Floats as `tokenizers` reads them (serde_f64), so Unigram's scores are its scores.
struct SerdeFloatParser : nlohmann::detail::json_sax_dom_parser<json> {
  using Base = nlohmann::detail::json_sax_dom_parser<json>;
  using Base::Base;
  bool number_float(double, const std::string& text) { return Base::number_float(serde_f64(text), text); }
};

json parse_json(const std::string& content, const fs::path& p) {
  try {
    json j;
    SerdeFloatParser sax(j, true);
    json::sax_parse(content, &sax);
    return j;
  } catch (const json::exception& e) {
    fail("tokenizer: {} is not valid JSON: {}", p.string(), e.what());
  }
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
// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c) {
  auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D ||
         (c >= 0x24B6 && c <= 0x24E9);
}

// Splits s at the added tokens with the given `normalized` flag as the crate's
// AddedVocabulary::find_matches: leftmost match first and, at one position, the longest
// (`added` is sorted longest first); single_word matches inside a word are skipped;
// lstrip / rstrip take the whitespace before / after into the token. on_text gets each
// stretch between tokens with its offset in s.
template <typename Text, typename Token>
void split_added(std::u32string_view s, const std::vector<AddedToken>& added, bool normalized, Text on_text,
                 Token on_token) {
  size_t done = 0;
  for (size_t i = 0; i < s.size();) {
    const AddedToken* hit = nullptr;
    for (const auto& a : added)
      if (a.normalized == normalized && s.substr(i).starts_with(a.content)) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    i = stop;  // the search goes on after the match, kept or not
    if (hit->single_word) {
      const bool alone_before = start == 0 || !is_word_char(s[start - 1]);
      const bool alone_after = stop == s.size() || !is_word_char(s[stop]);
      if (!alone_before || !alone_after) continue;
    }
    if (hit->lstrip) {
      while (start > done && is_whitespace(s[start - 1])) --start;
    }
    if (hit->rstrip)
      while (stop < s.size() && is_whitespace(s[stop])) ++stop;
    if (start > done) on_text(s.substr(done, start - done), done);
    on_token(*hit);
    done = std::max(done, stop);
  }
  if (done < s.size()) on_text(s.substr(done), done);
}

}  // namespace

// ---------------------------------------------------------------- loading

Tokenizer Tokenizer::load(const std::string& dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) fail("tokenizer: {} is not a directory", dir);
  Tokenizer t;
  auto pipe = std::make_shared<Pipeline>();
  Pipeline& p = *pipe;
  for (const char* name : {"tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(root / name)) t.source_files_[name] = read_file(root / name);
  if (!t.source_files_.count("tokenizer.json") && !t.source_files_.count("vocab.txt"))
    fail("tokenizer: {} holds neither tokenizer.json nor vocab.txt", dir);

  // transformers reads special token names from both files; the map file wins.
  std::string unk_name;
  bool pad_named = false;
  json config = json::object();
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    auto it = t.source_files_.find(name);
    if (it == t.source_files_.end()) continue;
    json j = parse_json(it->second, root / name);
    if (!j.is_object()) fail("tokenizer: {} is not a JSON object", (root / name).string());
    read_special_names(j, (root / name).string(), &p.cls_token, &p.sep_token, &p.pad_token, &unk_name,
                       &p.mask_token);
    pad_named = pad_named || !member(j, (root / name).string(), "", "pad_token").is_null();
    if (std::string(name) == "tokenizer_config.json") config = std::move(j);
  }

  // Added tokens: the whole-token matches `tokenizers` makes before the model runs.
  // `where` names the entry in messages; `defined`: how many tokens the file defines,
  // which bounds the ids.
  auto add_token = [&p, &t](const json& a, const std::string& file, const std::string& where, size_t defined) {
    if (!a.is_object()) wrong_type(file, where, "an object", a);
    std::string content = require_string(a, file, where, "content");
    if (content.empty()) return;
    AddedToken tok;
    tok.id = read_id(member(a, file, where, "id"), file, fmt::format("added token {}", json(content).dump()), defined);
    tok.normalized = get_bool(a, file, where, "normalized", !get_bool(a, file, where, "special", false));
    tok.lstrip = get_bool(a, file, where, "lstrip", false);
    tok.rstrip = get_bool(a, file, where, "rstrip", false);
    tok.single_word = get_bool(a, file, where, "single_word", false);
    tok.content = decode_utf8(content);
    if (size_t(tok.id) >= t.tokens_.size()) t.tokens_.resize(size_t(tok.id) + 1);
    t.tokens_[size_t(tok.id)] = content;  // as the crate's id_to_token, added tokens first
    p.added.push_back(std::move(tok));
  };

  if (auto it = t.source_files_.find("tokenizer.json"); it != t.source_files_.end()) {
    const std::string file = (root / "tokenizer.json").string();
    json j = parse_json(it->second, root / "tokenizer.json");
    try {
      const json& m = object_member(j, file, "", "model");
      const std::string type = get_string(m, file, "model", "type", "");
      const json& vocab = member(m, file, "model", "vocab");
      const json& added = get_array(j, file, "", "added_tokens");
      const Source src{file, (vocab.is_structured() ? vocab.size() : 0) + added.size()};
      if (type == "WordPiece") p.model = load_wordpiece(m, src);
      else if (type == "BPE") p.model = load_bpe(m, src);
      else if (type == "Unigram") p.model = load_unigram(m, src);
      else unsupported(file, "model type", type.empty() ? "(none)" : type, "WordPiece, BPE, Unigram");
      t.tokens_ = p.model->tokens;

      p.normalizer = load_normalizer(member(j, file, "", "normalizer"), src, "normalizer");
      p.pre_tokenizer = load_pre_tokenizer(member(j, file, "", "pre_tokenizer"), src, "pre_tokenizer");
      for (size_t i = 0; i < added.size(); ++i) add_token(added[i], file, fmt::format("added_tokens[{}]", i), src.defined);
      p.templates = load_post_processor(member(j, file, "", "post_processor"), src, t.tokens_.size());
      if (type == "WordPiece") p.unk_token = get_string(m, file, "model", "unk_token", "[UNK]");
    } catch (const json::exception& e) {  // what the typed reads above do not cover
      fail("tokenizer: {}: {}", file, e.what());
    }
  } else {
    // vocab.txt: what transformers' BertTokenizer builds from it. Python reads the file in
    // universal-newline mode, so \n, \r\n and \r all end a token; every line is one id.
    const std::string file = (root / "vocab.txt").string();
    const std::string& text = t.source_files_["vocab.txt"];
    std::vector<std::string> lines;
    for (size_t pos = 0, line = 1; pos < text.size(); ++line) {
      size_t end = text.find_first_of("\r\n", pos);
      if (end == std::string::npos) end = text.size();
      std::string tok = text.substr(pos, end - pos);
      try {
        decode_utf8(tok);
      } catch (const Error&) {
        fail("tokenizer: {}: line {} is not valid UTF-8", file, line);
      }
      lines.push_back(std::move(tok));
      pos = end;
      if (pos < text.size()) pos += (text.compare(pos, 2, "\r\n") == 0) ? 2 : 1;
    }
    const std::string cfg_file = (root / "tokenizer_config.json").string();
    try {
      const std::string cls = get_string(config, cfg_file, "", "tokenizer_class", "BertTokenizer");
      if (cls != "BertTokenizer" && cls != "BertTokenizerFast" && cls != "DistilBertTokenizer" &&
          cls != "DistilBertTokenizerFast")
        fail("tokenizer: {}: tokenizer_class {} is not a BERT WordPiece tokenizer", cfg_file, cls);
      p.lowercase = get_bool(config, cfg_file, "", "do_lower_case", true);
      p.handle_chinese_chars = get_bool(config, cfg_file, "", "tokenize_chinese_chars", true);
      p.strip_accents = get_nullable_bool(config, cfg_file, "", "strip_accents");
      if (!unk_name.empty()) p.unk_token = unk_name;
      p.model = make_wordpiece(lines, p.unk_token);
      t.tokens_ = p.model->tokens;
      p.normalizer = make_bert_normalizer(true, p.handle_chinese_chars, p.strip_accents, p.lowercase);
      p.pre_tokenizer = make_bert_pre_tokenizer();
      // transformers registers the special tokens as added tokens (matched in the raw
      // text), and so the entries of added_tokens_decoder.
      const json& decoder = member(config, cfg_file, "", "added_tokens_decoder");
      if (!decoder.is_null() && !decoder.is_object())
        wrong_type(cfg_file, "added_tokens_decoder", "an object of id: token", decoder);
      const size_t defined = t.tokens_.size() + decoder.size();
      const auto& vocab = p.model->vocab;
      for (const std::string* name : {&p.pad_token, &p.unk_token, &p.cls_token, &p.sep_token, &p.mask_token}) {
        auto v = vocab.find(*name);
        if (v != vocab.end())
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
          for (const char* flag : {"lstrip", "rstrip", "single_word"})
            if (get_bool(entry, cfg_file, where, flag, false))
              fail("tokenizer: {}: added token {} sets {}, which hone does not support for a vocab.txt", cfg_file,
                   entry.dump(), flag);
          add_token(entry, cfg_file, where, defined);
        }
    } catch (const json::exception& e) {  // what the typed reads above do not cover
      fail("tokenizer: {}: {}", cfg_file, e.what());
    }
  }

  // Normalized added tokens match the normalized text, so their patterns are normalized too.
  for (AddedToken& a : p.added)
    if (a.normalized && p.normalizer) a.content = p.normalizer->normalize(a.content);
  std::erase_if(p.added, [](const AddedToken& a) { return a.content.empty(); });
  // Longest first: the scan takes the first token that matches at a position.
  std::stable_sort(p.added.begin(), p.added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

  const bool from_json = t.source_files_.count("tokenizer.json") > 0;
  const std::string where = (root / (from_json ? "tokenizer.json" : "vocab.txt")).string();
  t.vocabulary_file_ = where;
  // An id of the model's own vocabulary, or of a non-normalized added token.
  auto find_id = [&](const std::string& name) -> std::optional<int32_t> {
    for (const AddedToken& a : p.added)
      if (!a.normalized && size_t(a.id) < t.tokens_.size() && t.tokens_[size_t(a.id)] == name) return a.id;
    auto it = p.model->vocab.find(name);
    if (it != p.model->vocab.end()) return it->second;
    return std::nullopt;
  };
  auto require_id = [&](const std::string& name, const char* what) {
    auto id = find_id(name);
    if (!id) fail("tokenizer: {}: {} {} is not in the vocabulary", where, what, json(name).dump());
    return *id;
  };

  if (p.model->type() == "WordPiece") {
    if (!from_json) {
      TemplatePiece cls{-1, {require_id(p.cls_token, "cls_token")}, 0};
      TemplatePiece sep{-1, {require_id(p.sep_token, "sep_token")}, 0};
      TemplatePiece sep1 = sep;
      sep1.type_id = 1;
      p.templates.single = {cls, {0, {}, 0}, sep};
      p.templates.pair = {cls, {0, {}, 0}, sep, {1, {}, 1}, sep1};
    }
    // WordPiece's [UNK] comes from the model's own vocabulary, not the added tokens.
    auto unk = p.model->vocab.find(p.unk_token);
    if (unk == p.model->vocab.end())
      fail("tokenizer: {}: unk_token {} is not in the vocabulary", where, json(p.unk_token).dump());
    t.unk_id_ = unk->second;
    t.cls_id_ = require_id(p.cls_token, "cls_token");
    t.sep_id_ = require_id(p.sep_token, "sep_token");
    t.pad_id_ = require_id(p.pad_token, "pad_token");
  } else {
    const auto& single = p.templates.single;
    if (!single.empty() && single.front().sequence < 0 && !single.front().ids.empty())
      t.cls_id_ = single.front().ids.front();
    if (!single.empty() && single.back().sequence < 0 && !single.back().ids.empty())
      t.sep_id_ = single.back().ids.back();
    // The pad token: the one the configuration names, else a usual name; -1 for none
    // (GPT-2's tokenizer has none; callers that pad must refuse it).
    t.pad_id_ = -1;
    std::vector<std::string> names;
    if (pad_named) names.push_back(p.pad_token);
    for (const char* n : {"<pad>", "[PAD]", "<|padding|>", "<|pad|>"}) names.push_back(n);
    for (const std::string& n : names)
      if (auto id = find_id(n)) {
        t.pad_id_ = *id;
        break;
      }
    if (pad_named && t.pad_id_ >= 0 && find_id(p.pad_token) != t.pad_id_)
      fail("tokenizer: {}: pad_token {} is not in the vocabulary", where, json(p.pad_token).dump());
    const std::string unk = unk_name.empty() ? std::string() : unk_name;
    if (auto id = find_id(unk.empty() ? "<unk>" : unk)) t.unk_id_ = *id;
  }
  t.pipeline_ = std::move(pipe);
  return t;
}

std::string_view Tokenizer::model_type() const { return pipeline_->model->type(); }

int Tokenizer::max_type_id() const {
  int m = 0;
  for (const auto* pieces : {&pipeline_->templates.single, &pipeline_->templates.pair})
    for (const TemplatePiece& p : *pieces) m = std::max(m, p.type_id);
  return m;
}

const std::string& Tokenizer::token(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size())
    fail("tokenizer: token id {} is outside the vocabulary of {}", id, tokens_.size());
  return tokens_[size_t(id)];
}

// ---------------------------------------------------------------- encoding

std::vector<int32_t> Tokenizer::encode_sequence(std::string_view text, std::vector<std::string>* pieces) const {
  const Pipeline& p = *pipeline_;
  std::vector<int32_t> ids;
  auto on_token = [&](const AddedToken& a) {
    ids.push_back(a.id);
    if (pieces) pieces->push_back(tokens_[size_t(a.id)]);
  };
  auto on_normalized = [&](std::u32string_view s, size_t raw_offset, size_t offset) {
    std::vector<Piece> words{Piece{std::u32string(s), raw_offset == 0 && offset == 0}};
    if (p.pre_tokenizer) p.pre_tokenizer->split(words);
    for (const Piece& w : words)
      if (!w.text.empty()) p.model->tokenize(w.text, ids, pieces);
  };
  split_added(
      decode_utf8(text), p.added, false,
      [&](std::u32string_view raw, size_t raw_offset) {
        const std::u32string n = p.normalizer ? p.normalizer->normalize(std::u32string(raw)) : std::u32string(raw);
        split_added(
            n, p.added, true, [&](std::u32string_view s, size_t offset) { on_normalized(s, raw_offset, offset); },
            on_token);
      },
      on_token);
  return ids;
}

std::vector<std::string> Tokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  encode_sequence(text, &pieces);
  return pieces;
}

Encoding Tokenizer::encode(std::string_view text, const std::string_view* pair, int max_length) const {
  if (max_length < 0) fail("tokenizer: max_length {} is negative", max_length);
  std::vector<int32_t> seq[2];
  seq[0] = encode_sequence(text, nullptr);
  if (pair) seq[1] = encode_sequence(*pair, nullptr);
  const std::vector<TemplatePiece>& tmpl = pair ? pipeline_->templates.pair : pipeline_->templates.single;
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

void Tokenizer::save(const std::string& dir) const {
  const Pipeline& p = *pipeline_;
  const bool bert = p.model->type() == "WordPiece";
  // AutoTokenizer needs a class when the directory has no config.json naming the model;
  // PreTrainedTokenizerFast runs tokenizer.json as it is.
  const char* tokenizer_class = bert ? "BertTokenizer" : "PreTrainedTokenizerFast";
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail("tokenizer: cannot create {}: {}", dir, ec.message());
  for (const auto& [name, content] : source_files_) {
    std::string out = content;
    if (name == "tokenizer_config.json") {
      json j = json::parse(content);
      if (!j.contains("tokenizer_class")) {
        j["tokenizer_class"] = tokenizer_class;
        out = j.dump(2) + "\n";
      }
    }
    write_file_atomic((root / name).string(), out);
  }
  if (bert && !source_files_.count("vocab.txt")) {
    std::string vocab;
    for (const std::string& tok : tokens_) vocab += tok + "\n";
    write_file_atomic((root / "vocab.txt").string(), vocab);
  }
  if (!source_files_.count("tokenizer_config.json")) {
    json j;
    if (bert) {
      j = {{"tokenizer_class", "BertTokenizer"},
           {"do_lower_case", p.lowercase},
           {"strip_accents", p.strip_accents ? json(*p.strip_accents) : json()},
           {"tokenize_chinese_chars", p.handle_chinese_chars},
           {"model_max_length", 512},
           {"cls_token", p.cls_token},
           {"sep_token", p.sep_token},
           {"pad_token", p.pad_token},
           {"unk_token", p.unk_token},
           {"mask_token", p.mask_token}};
    } else {
      j = {{"tokenizer_class", tokenizer_class}};
      if (pad_id_ >= 0) j["pad_token"] = tokens_[size_t(pad_id_)];
    }
    write_file_atomic((root / "tokenizer_config.json").string(), j.dump(2) + "\n");
  }
}

}  // namespace hone
