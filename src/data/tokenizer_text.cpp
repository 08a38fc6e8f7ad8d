// Helpers the tokenizer's pieces share: UTF-8, the Unicode classes of `tokenizers` (Rust's
// char methods, the crate unicode_categories), canonical decomposition, and reads of
// tokenizer.json fields that name the file and the field when a value is wrong.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "data/tokenizer_parts.h"
#include "hone/error.h"

namespace hone::tok {

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

bool is_whitespace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x85) return true;
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

void append_lowercase(std::u32string& out, char32_t c) {
  // Rust's char::to_lowercase is the full mapping; the only code point whose full
  // lowercase differs from the simple one utf8proc gives is U+0130 (İ -> i + U+0307).
  if (c == 0x130) out += U"i\u0307";
  else out += char32_t(utf8proc_tolower(utf8proc_int32_t(c)));
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

std::string component_type(const json& obj, const std::string& file, const std::string& where) {
  if (!obj.is_object()) wrong_type(file, where, "an object with a \"type\"", obj);
  return require_string(obj, file, where, "type");
}

void unsupported(const std::string& file, const std::string& component, const std::string& type,
                 std::string_view supported) {
  fail("tokenizer: {}: {} {} is not supported (hone has {})", file, component, json(type).dump(), supported);
}

void Model::add_token(const std::string& token, int32_t id) {
  if (size_t(id) >= tokens.size()) tokens.resize(size_t(id) + 1);
  tokens[size_t(id)] = token;
  vocab[token] = id;
}

}  // namespace hone::tok

namespace hone::tok {

// serde_json's f64 parse without its float_roundtrip feature (what `tokenizers` reads
// tokenizer.json with): the decimal digits as a u64 (digits past its range dropped), then
// one multiplication or division by a power of ten. It can be one ulp off the correctly
// rounded value, and Unigram's best path can turn on that ulp.
double serde_f64(std::string_view s) {
  static const double pow10[] = {
#define HONE_P(x) 1e##x,
#define HONE_P10(x) HONE_P(x##0) HONE_P(x##1) HONE_P(x##2) HONE_P(x##3) HONE_P(x##4) HONE_P(x##5) HONE_P(x##6) \
    HONE_P(x##7) HONE_P(x##8) HONE_P(x##9)
      1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, HONE_P10(1) HONE_P10(2) HONE_P10(3) HONE_P10(4) HONE_P10(5)
      HONE_P10(6) HONE_P10(7) HONE_P10(8) HONE_P10(9) HONE_P10(10) HONE_P10(11) HONE_P10(12) HONE_P10(13)
      HONE_P10(14) HONE_P10(15) HONE_P10(16) HONE_P10(17) HONE_P10(18) HONE_P10(19) HONE_P10(20) HONE_P10(21)
      HONE_P10(22) HONE_P10(23) HONE_P10(24) HONE_P10(25) HONE_P10(26) HONE_P10(27) HONE_P10(28) HONE_P10(29)
      1e300, 1e301, 1e302, 1e303, 1e304, 1e305, 1e306, 1e307, 1e308};
#undef HONE_P10
#undef HONE_P
  size_t i = 0;
  const bool positive = !(i < s.size() && s[i] == '-');
  if (!positive) ++i;
  uint64_t sig = 0;
  int64_t exponent = 0;
  bool overflowed = false;
  auto digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
  auto push = [&](unsigned d) {  // false when the u64 would overflow
    if (sig > UINT64_MAX / 10 || (sig == UINT64_MAX / 10 && d > UINT64_MAX % 10)) return false;
    sig = sig * 10 + d;
    return true;
  };
  for (; digit(i); ++i)
    if (overflowed || !push(unsigned(s[i] - '0'))) {
      overflowed = true;
      ++exponent;  // an integer digit past the u64 still counts
    }
  if (i < s.size() && s[i] == '.')
    for (++i; digit(i); ++i)
      if (!overflowed) {
        if (push(unsigned(s[i] - '0'))) --exponent;
        else overflowed = true;
      }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    int64_t e = 0;
    for (; digit(i); ++i) e = std::min<int64_t>(e * 10 + (s[i] - '0'), int64_t(1) << 40);
    exponent += neg ? -e : e;
  }
  double f = double(sig);
  for (;;) {
    const uint64_t k = uint64_t(exponent < 0 ? -exponent : exponent);
    if (k < std::size(pow10)) {
      if (exponent >= 0) f *= pow10[k];
      else f /= pow10[k];
      break;
    }
    if (f == 0.0) break;
    if (exponent >= 0) return positive ? HUGE_VAL : -HUGE_VAL;  // serde refuses; JSON has no inf
    f /= 1e308;
    exponent += 308;
  }
  return positive ? f : -f;
}

}  // namespace hone::tok
