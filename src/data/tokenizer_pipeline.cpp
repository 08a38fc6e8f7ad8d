// The shared pieces of the pipeline, with the semantics of the Rust `tokenizers` crate:
// normalizers (normalizers/*.rs, spm_precompiled), pre-tokenizers (pre_tokenizers/*.rs) and
// post-processors (processors/*.rs). Ids depend only on the text each piece produces, so
// offsets are not tracked, except whether a piece starts the sequence.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "data/tokenizer_parts.h"
#include "hone/error.h"

namespace hone::tok {
namespace {

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

// ---------------------------------------------------------------- normalizers

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool handle_chinese_chars, std::optional<bool> strip_accents, bool lowercase)
      : clean_text_(clean_text), handle_chinese_chars_(handle_chinese_chars),
        strip_accents_(strip_accents.value_or(lowercase)), lowercase_(lowercase) {}

  // clean_text, handle_chinese_chars, strip_accents, lowercase, in that order.
  std::u32string normalize(std::u32string s) const override {
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
    if (strip_accents_) {
      out = nfd(out);
      std::erase_if(out, is_nonspacing_mark);
    }
    if (lowercase_) {
      std::u32string lower;
      lower.reserve(out.size());
      for (char32_t c : out) append_lowercase(lower, c);
      out = std::move(lower);
    }
    return out;
  }

 private:
  bool clean_text_, handle_chinese_chars_, strip_accents_, lowercase_;
};

// NFC, NFD, NFKC, NFKD through utf8proc (Unicode 15; the crate's tables are 9.0, so only
// characters assigned since can differ).
class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  std::u32string normalize(std::u32string s) const override {
    if (s.empty()) return s;
    const std::string in = encode_utf8(s);
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                                            utf8proc_ssize_t(in.size()), &out, utf8proc_option_t(options_));
    HONE_CHECK(n >= 0, "utf8proc_map: {}", utf8proc_errmsg(n));
    std::u32string result = decode_utf8(std::string_view(reinterpret_cast<const char*>(out), size_t(n)));
    std::free(out);
    return result;
  }

 private:
  int options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::u32string normalize(std::u32string s) const override {
    std::u32string out;
    out.reserve(s.size());
    for (char32_t c : s) append_lowercase(out, c);
    return out;
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::u32string normalize(std::u32string s) const override {
    size_t b = 0, e = s.size();
    if (left_)
      while (b < e && is_whitespace(s[b])) ++b;
    if (right_)
      while (e > b && is_whitespace(s[e - 1])) --e;
    return s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

// StripAccents drops every combining mark (M*).
class StripAccentsNormalizer final : public Normalizer {
 public:
  std::u32string normalize(std::u32string s) const override {
    std::erase_if(s, [](char32_t c) {
      auto k = category(c);
      return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
    });
    return s;
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::u32string prefix) : prefix_(std::move(prefix)) {}
  std::u32string normalize(std::u32string s) const override { return s.empty() ? s : prefix_ + s; }

 private:
  std::u32string prefix_;
};

// Replace's pattern: a literal string, or a regex of the few shapes published tokenizers
// use (" {2,}", "\s+"): one character or class repeated. Anything else is refused at load.
struct ReplacePattern {
  std::u32string literal;       // when not a repeat
  bool repeat = false;
  bool any_whitespace = false;  // \s
  char32_t c = 0;
  size_t min = 1, max = SIZE_MAX;

  bool matches(char32_t x) const { return any_whitespace ? is_whitespace(x) : x == c; }
  // The match at i: its length, 0 for none.
  size_t match_at(std::u32string_view s, size_t i) const {
    if (!repeat) return s.substr(i).starts_with(literal) ? literal.size() : 0;
    size_t n = 0;
    while (i + n < s.size() && n < max && matches(s[i + n])) ++n;
    return n >= min ? n : 0;
  }
};

std::optional<ReplacePattern> parse_regex(std::u32string_view r) {
  ReplacePattern p;
  static const std::u32string_view meta = U".^$|()[]{}*+?\\";
  size_t i = 0;
  if (r.starts_with(U"\\s")) {
    p.any_whitespace = true;
    i = 2;
  } else if (r.size() >= 2 && r[0] == '\\' && meta.find(r[1]) != std::u32string_view::npos) {
    p.c = r[1];
    i = 2;
  } else if (!r.empty() && meta.find(r[0]) == std::u32string_view::npos) {
    p.c = r[0];
    i = 1;
  } else {
    return std::nullopt;
  }
  std::u32string_view q = r.substr(i);
  if (q.empty()) {
    if (p.any_whitespace) {
      p.repeat = true;
      p.min = p.max = 1;
      return p;
    }
    // A plain literal (no metacharacters at all).
    for (char32_t x : r)
      if (meta.find(x) != std::u32string_view::npos) return std::nullopt;
    p.literal = r;
    return p;
  }
  p.repeat = true;
  if (q == U"+") return p;
  if (q.size() < 3 || q.front() != '{' || q.back() != '}') return std::nullopt;
  const std::string inner = encode_utf8(q.substr(1, q.size() - 2));
  const size_t comma = inner.find(',');
  auto number = [](const std::string& t, size_t& out) {
    if (t.empty() || t.size() > 6 || !std::all_of(t.begin(), t.end(), ::isdigit)) return false;
    out = std::stoul(t);
    return true;
  };
  if (comma == std::string::npos) {
    if (!number(inner, p.min)) return std::nullopt;
    p.max = p.min;
  } else {
    if (!number(inner.substr(0, comma), p.min)) return std::nullopt;
    const std::string hi = inner.substr(comma + 1);
    if (!hi.empty() && (!number(hi, p.max) || p.max < p.min)) return std::nullopt;
  }
  if (p.min == 0) return std::nullopt;  // empty matches: not worth emulating
  return p;
}

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(ReplacePattern pattern, std::u32string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  // Leftmost matches, left to right, without overlap.
  std::u32string normalize(std::u32string s) const override {
    std::u32string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      const size_t n = pattern_.match_at(s, i);
      if (n == 0) {
        out += s[i++];
      } else {
        out += content_;
        i += n;
      }
    }
    return out;
  }

 private:
  ReplacePattern pattern_;
  std::u32string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::u32string normalize(std::u32string s) const override {
    for (const auto& p : parts_) s = p->normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// sentencepiece's precompiled_charsmap (as the crate spm_precompiled reads it): a
// little-endian u32 byte count, that many bytes of a darts-clone double array (u32 units)
// mapping UTF-8 byte strings to offsets into the rest, a blob of NUL-terminated
// replacement strings.
class PrecompiledNormalizer final : public Normalizer {
 public:
  PrecompiledNormalizer(const std::string& charsmap, const std::string& file) : file_(file) {
    if (charsmap.size() < 4) bad("it is shorter than its 4-byte header");
    uint32_t trie_bytes;
    std::memcpy(&trie_bytes, charsmap.data(), 4);
    if (size_t(trie_bytes) > charsmap.size() - 4) bad("its trie runs past its end");
    units_.resize(trie_bytes / 4);
    std::memcpy(units_.data(), charsmap.data() + 4, units_.size() * 4);
    if (units_.empty()) bad("its trie is empty");
    normalized_ = charsmap.substr(4 + size_t(trie_bytes));
    try {
      decode_utf8(normalized_);
    } catch (const Error&) {
      bad("its replacement strings are not valid UTF-8");
    }
  }

  std::u32string normalize(std::u32string s) const override {
    // As tokenizers' Precompiled: each extended grapheme cluster shorter than 6 bytes is
    // looked up whole; otherwise (or when absent) each of its characters is.
    std::u32string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t j = i + 1;
      utf8proc_int32_t state = 0;
      while (j < s.size() && !utf8proc_grapheme_break_stateful(utf8proc_int32_t(s[j - 1]), utf8proc_int32_t(s[j]), &state))
        ++j;
      const std::u32string_view grapheme = std::u32string_view(s).substr(i, j - i);
      const std::string bytes = encode_utf8(grapheme);
      const char* norm = bytes.size() < 6 ? transform(bytes) : nullptr;
      if (norm) {
        out += decode_utf8(norm);
      } else {
        for (char32_t c : grapheme) {
          std::string one;
          append_utf8(one, c);
          if (const char* n = transform(one)) out += decode_utf8(n);
          else out += c;
        }
      }
      i = j;
    }
    return out;
  }

 private:
  [[noreturn]] void bad(std::string_view why) const {
    fail("tokenizer: {}: normalizer Precompiled: precompiled_charsmap cannot be read: {}", file_, why);
  }
  uint32_t unit(size_t pos) const {
    if (pos >= units_.size()) bad("its trie points outside itself");
    return units_[pos];
  }
  static uint32_t offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

  // The replacement of the shortest key that prefixes `key` (the crate takes the first of
  // its common-prefix results), or null.
  const char* transform(const std::string& key) const {
    size_t pos = 0;
    uint32_t u = unit(pos);
    pos ^= offset(u);
    for (unsigned char c : key) {
      if (c == 0) break;
      pos ^= c;
      u = unit(pos);
      if ((u & ((1u << 31) | 0xFF)) != c) return nullptr;
      pos ^= offset(u);
      if ((u >> 8) & 1) {
        const size_t at = unit(pos) & ((1u << 31) - 1);
        if (at > normalized_.size()) bad("a replacement starts past the end of its strings");
        // Strings end at a NUL (c_str() ends the last one).
        return normalized_.c_str() + at;
      }
    }
    return nullptr;
  }

  std::string file_;
  std::vector<uint32_t> units_;
  std::string normalized_;
};

std::string decode_base64(const std::string& in, const std::string& file, const std::string& field) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = value(in[i]);
    if (v < 0) fail("tokenizer: {}: {} is not base64 (character {} at {})", file, field, json(std::string(1, in[i])).dump(), i);
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i)
    if (in[i] != '=') fail("tokenizer: {}: {} is not base64 (data after its padding)", file, field);
  return out;
}

constexpr std::string_view kNormalizers =
    "BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Precompiled, Sequence";

// ---------------------------------------------------------------- pre-tokenizers

// Splits each piece into the runs between the positions where `cut(text, i)` says a new
// piece starts; `drop(c)` characters vanish. The first run keeps the piece's at_start when
// it begins at the piece's start.
template <typename Cut, typename Drop>
void split_pieces(std::vector<Piece>& pieces, Cut cut, Drop drop) {
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    Piece cur;
    cur.at_start = p.at_start;
    bool first = true;
    for (size_t i = 0; i < p.text.size(); ++i) {
      const char32_t c = p.text[i];
      const bool d = drop(c);
      if (d || (i > 0 && cut(p.text, i))) {
        if (!cur.text.empty()) out.push_back(std::move(cur));
        cur = Piece{};
        first = false;
      }
      if (!d) {
        if (cur.text.empty()) cur.at_start = first && i == 0 && p.at_start;
        cur.text += c;
      }
    }
    if (!cur.text.empty()) out.push_back(std::move(cur));
  }
  pieces = std::move(out);
}

// BertPreTokenizer: whitespace separates words and is dropped; punctuation is a word.
class BertPreTokenizer final : public PreTokenizer {
 public:
  void split(std::vector<Piece>& pieces) const override {
    split_pieces(
        pieces,
        [](const std::u32string& s, size_t i) { return is_punctuation(s[i]) || is_punctuation(s[i - 1]); },
        [](char32_t c) { return is_whitespace(c); });
  }
};

class WhitespaceSplitPreTokenizer final : public PreTokenizer {
 public:
  void split(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [](const std::u32string&, size_t) { return false; }, is_whitespace);
  }
};

bool is_letter(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_number(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

// The length of GPT-2's pattern's match at i:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Oniguruma takes the first alternative that matches, each greedy, with backtracking only
// where the pattern allows it (the optional space, the lookahead).
size_t gpt2_match(std::u32string_view s, size_t i) {
  for (std::u32string_view c : {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"})
    if (s.substr(i).starts_with(c)) return c.size();
  auto other = [](char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); };
  for (bool (*cls)(char32_t) : {is_letter, is_number, static_cast<bool (*)(char32_t)>(other)}) {
    size_t j = i;
    if (s[j] == ' ' && j + 1 < s.size() && cls(s[j + 1])) ++j;
    if (!cls(s[j])) continue;
    while (j < s.size() && cls(s[j])) ++j;
    return j - i;
  }
  size_t j = i;
  while (j < s.size() && is_whitespace(s[j])) ++j;
  const size_t run = j - i;  // >= 1: every other character matched above
  if (j == s.size() || run == 1) return run;  // \s+(?!\S) at the end, or \s+ before a non-space
  return run - 1;                              // leaves one space to lead the next word
}

// The byte -> character table of GPT-2's ByteLevel: printable bytes stand for themselves,
// the others for 256 + n in byte order.
const std::array<char32_t, 256>& byte_chars() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    auto emit = [&](std::u32string_view word, bool at_start) {
      if (word.empty()) return;
      Piece p{U"", at_start};
      std::string bytes = encode_utf8(word);
      for (unsigned char b : bytes) p.text += byte_chars()[b];
      out.push_back(std::move(p));
    };
    for (Piece& p : pieces) {
      std::u32string s = std::move(p.text);
      if (add_prefix_space_ && !s.empty() && s[0] != ' ') s.insert(s.begin(), U' ');
      if (!use_regex_) {
        emit(s, p.at_start);
        continue;
      }
      for (size_t i = 0; i < s.size();) {
        const size_t n = gpt2_match(s, i);
        emit(std::u32string_view(s).substr(i, n), p.at_start && i == 0);
        i += n;
      }
    }
    pieces = std::move(out);
  }

 private:
  bool add_prefix_space_, use_regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  MetaspacePreTokenizer(char32_t replacement, Prepend prepend, bool split)
      : replacement_(replacement), prepend_(prepend), split_(split) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      std::u32string s = std::move(p.text);
      std::replace(s.begin(), s.end(), U' ', replacement_);
      const bool prepend = prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_start);
      if (prepend && !s.empty() && s[0] != replacement_) s.insert(s.begin(), replacement_);
      if (!split_) {
        out.push_back(Piece{std::move(s), p.at_start});
        continue;
      }
      // Each replacement character starts a piece (MergedWithNext).
      size_t start = 0;
      for (size_t i = 1; i <= s.size(); ++i)
        if (i == s.size() || s[i] == replacement_) {
          out.push_back(Piece{s.substr(start, i - start), p.at_start && start == 0});
          start = i;
        }
    }
    pieces = std::move(out);
  }

 private:
  char32_t replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) {
      p->split(pieces);
      std::erase_if(pieces, [](const Piece& x) { return x.text.empty(); });
    }
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

constexpr std::string_view kPreTokenizers = "BertPreTokenizer, ByteLevel, Metaspace, WhitespaceSplit, Sequence";

}  // namespace

// ---------------------------------------------------------------- loading

std::unique_ptr<Normalizer> make_bert_normalizer(bool clean_text, bool handle_chinese_chars,
                                                 std::optional<bool> strip_accents, bool lowercase) {
  return std::make_unique<BertNormalizer>(clean_text, handle_chinese_chars, strip_accents, lowercase);
}

std::unique_ptr<PreTokenizer> make_bert_pre_tokenizer() { return std::make_unique<BertPreTokenizer>(); }

namespace {

// The components a Sequence lists under `key`, each loaded by `load`, null ones left out.
template <typename T, typename Load>
std::vector<std::unique_ptr<T>> load_sequence(const json& c, const Source& src, const std::string& where,
                                              const char* key, Load load) {
  const json& items = get_array(c, src.file, where, key);
  std::vector<std::unique_ptr<T>> parts;
  for (size_t i = 0; i < items.size(); ++i)
    if (auto p = load(items[i], src, fmt::format("{}.{}[{}]", where, key, i))) parts.push_back(std::move(p));
  return parts;
}

}  // namespace

std::unique_ptr<Normalizer> load_normalizer(const json& n, const Source& src, const std::string& where) {
  const std::string& file = src.file;
  if (n.is_null()) return nullptr;
  const std::string type = component_type(n, file, where);
  if (type == "BertNormalizer")
    return make_bert_normalizer(get_bool(n, file, where, "clean_text", true),
                                get_bool(n, file, where, "handle_chinese_chars", true),
                                get_nullable_bool(n, file, where, "strip_accents"),
                                get_bool(n, file, where, "lowercase", true));
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD")
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(get_bool(n, file, where, "strip_left", true),
                                             get_bool(n, file, where, "strip_right", true));
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(decode_utf8(require_string(n, file, where, "prepend")));
  if (type == "Replace") {
    const json& pattern = object_member(n, file, where, "pattern");
    const std::u32string content = decode_utf8(require_string(n, file, where, "content"));
    const std::string pwhere = where + ".pattern";
    if (pattern.contains("String")) {
      ReplacePattern p;
      p.literal = decode_utf8(require_string(pattern, file, pwhere, "String"));
      if (p.literal.empty()) fail("tokenizer: {}: {}.String is empty", file, pwhere);
      return std::make_unique<ReplaceNormalizer>(std::move(p), content);
    }
    if (pattern.contains("Regex")) {
      const std::string r = require_string(pattern, file, pwhere, "Regex");
      auto p = parse_regex(decode_utf8(r));
      if (!p)
        fail("tokenizer: {}: {}.Regex {} is not supported: hone reads a literal, or one character (or \\s) "
             "followed by +, {{n}}, {{n,}} or {{n,m}}",
             file, pwhere, json(r).dump());
      return std::make_unique<ReplaceNormalizer>(std::move(*p), content);
    }
    wrong_type(file, pwhere, "an object with \"String\" or \"Regex\"", pattern);
  }
  if (type == "Precompiled") {
    const std::string b64 = require_string(n, file, where, "precompiled_charsmap");
    return std::make_unique<PrecompiledNormalizer>(decode_base64(b64, file, where + ".precompiled_charsmap"), file);
  }
  if (type == "Sequence") {
    return std::make_unique<SequenceNormalizer>(
        load_sequence<Normalizer>(n, src, where, "normalizers", load_normalizer));
  }
  unsupported(file, "normalizer", type, kNormalizers);
}

std::unique_ptr<PreTokenizer> load_pre_tokenizer(const json& p, const Source& src, const std::string& where) {
  const std::string& file = src.file;
  if (p.is_null()) return nullptr;
  const std::string type = component_type(p, file, where);
  if (type == "BertPreTokenizer") return make_bert_pre_tokenizer();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(p, file, where, "add_prefix_space", true),
                                                   get_bool(p, file, where, "use_regex", true));
  if (type == "Metaspace") {
    const std::u32string rep = decode_utf8(require_string(p, file, where, "replacement"));
    if (rep.size() != 1)
      fail("tokenizer: {}: {}.replacement must be one character, got {}", file, where, json(encode_utf8(rep)).dump());
    using Prepend = MetaspacePreTokenizer::Prepend;
    Prepend prepend = Prepend::Always;
    const std::string scheme = get_string(p, file, where, "prepend_scheme", "always");
    if (scheme == "first") prepend = Prepend::First;
    else if (scheme == "never") prepend = Prepend::Never;
    else if (scheme != "always")
      fail("tokenizer: {}: {}.prepend_scheme {} is not one of \"always\", \"first\", \"never\"", file, where,
           json(scheme).dump());
    // The older add_prefix_space: false means never, and must not contradict the scheme.
    const json& aps = member(p, file, where, "add_prefix_space");
    if (!aps.is_null() && !aps.is_boolean()) wrong_type(file, where + ".add_prefix_space", "true or false", aps);
    if (aps.is_boolean() && !aps.get<bool>()) {
      if (prepend != Prepend::Never)
        fail("tokenizer: {}: {}: add_prefix_space false does not match prepend_scheme {}", file, where,
             json(scheme).dump());
    }
    return std::make_unique<MetaspacePreTokenizer>(rep[0], prepend, get_bool(p, file, where, "split", true));
  }
  if (type == "Sequence") {
    return std::make_unique<SequencePreTokenizer>(
        load_sequence<PreTokenizer>(p, src, where, "pretokenizers", load_pre_tokenizer));
  }
  unsupported(file, "pre_tokenizer", type, kPreTokenizers);
}

// ---------------------------------------------------------------- post-processors

namespace {

Templates load_one_post_processor(const json& post, const Source& src, size_t model_tokens, const std::string& where) {
  const std::string& file = src.file;
  auto seq = [](int s, int type_id) { return TemplatePiece{s, {}, type_id}; };
  // The post-processor's ids are added to every encoding: each must be a token.
  auto special_id = [&](const json& v, const std::string& what) {
    return read_id(v, file, "post_processor " + what, model_tokens);
  };
  auto type_id = [&](const json& piece, const std::string& w) {
    return piece.contains("type_id") ? int(read_count(piece["type_id"], file, w + ".type_id", 1 << 16)) : 0;
  };
  Templates t;
  if (post.is_null()) {
    // Nothing added; the pair's tokens carry type id 1.
    t.single = {seq(0, 0)};
    t.pair = {seq(0, 0), seq(1, 1)};
    return t;
  }
  const std::string type = component_type(post, file, where);
  if (type == "ByteLevel") return load_one_post_processor(json(), src, model_tokens, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto pair_id = [&](const char* key) {
      const json& v = member(post, file, where, key);
      if (!v.is_array() || v.size() != 2) wrong_type(file, field_name(where, key), "a [token, id] pair", v);
      return special_id(v[1], key);
    };
    TemplatePiece cls{-1, {pair_id("cls")}, 0};
    TemplatePiece sep{-1, {pair_id("sep")}, 0};
    if (type == "BertProcessing") {
      TemplatePiece sep1 = sep;
      sep1.type_id = 1;
      t.single = {cls, seq(0, 0), sep};
      t.pair = {cls, seq(0, 0), sep, seq(1, 1), sep1};
    } else {
      // RoBERTa's pair is <s> A </s></s> B </s>, and every type id is 0.
      t.single = {cls, seq(0, 0), sep};
      t.pair = {cls, seq(0, 0), sep, sep, seq(1, 0), sep};
    }
    return t;
  }
  if (type == "TemplateProcessing") {
    const json& specials = object_member(post, file, where, "special_tokens");
    auto parse = [&](const char* key) {
      std::vector<TemplatePiece> out;
      const json& items = get_array(post, file, where, key);
      for (size_t i = 0; i < items.size(); ++i) {
        const std::string w = fmt::format("{}.{}[{}]", where, key, i);
        const json& item = items[i];
        if (!item.is_object() || (!item.contains("Sequence") && !item.contains("SpecialToken")))
          wrong_type(file, w, "an object with \"Sequence\" or \"SpecialToken\"", item);
        if (item.contains("Sequence")) {
          const json& s = object_member(item, file, w, "Sequence");
          const std::string which = require_string(s, file, w + ".Sequence", "id");
          if (which != "A" && which != "B")
            fail("tokenizer: {}: {}.Sequence.id is {}: a template sequence is \"A\" or \"B\"", file, w,
                 json(which).dump());
          out.push_back(seq(which == "A" ? 0 : 1, type_id(s, w + ".Sequence")));
        } else {
          const json& s = object_member(item, file, w, "SpecialToken");
          const std::string name = require_string(s, file, w + ".SpecialToken", "id");
          if (!specials.contains(name))
            fail("tokenizer: {}: template token {} is not in {}.special_tokens", file, json(name).dump(), where);
          TemplatePiece p{-1, {}, type_id(s, w + ".SpecialToken")};
          const std::string special = fmt::format("special_tokens[{}]", json(name).dump());
          const json& ids = get_array(specials[name], file, where + "." + special, "ids");
          for (const json& id : ids) p.ids.push_back(special_id(id, "special token " + json(name).dump()));
          out.push_back(std::move(p));
        }
      }
      return out;
    };
    t.single = parse("single");
    t.pair = parse("pair");
    return t;
  }
  if (type == "Sequence") {
    // ByteLevel (offsets only) around at most one processor that adds tokens.
    const json& items = get_array(post, file, where, "processors");
    std::optional<Templates> adding;
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string w = fmt::format("{}.processors[{}]", where, i);
      if (component_type(items[i], file, w) == "ByteLevel") continue;
      if (adding)
        fail("tokenizer: {}: {}: hone reads a Sequence with one post-processor besides ByteLevel", file, where);
      adding = load_one_post_processor(items[i], src, model_tokens, w);
    }
    return adding ? *adding : load_one_post_processor(json(), src, model_tokens, where);
  }
  unsupported(file, "post_processor", type, "BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, Sequence");
}

}  // namespace

Templates load_post_processor(const json& j, const Source& src, size_t model_tokens) {
  return load_one_post_processor(j, src, model_tokens, "post_processor");
}

}  // namespace hone::tok
