// Reading JSON Lines, CSV and TSV files into a TextTable, in full or not at all.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <utf8proc.h>

#include "hone/data.h"
#include "hone/error.h"

namespace hone {
namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file", path);
  if (fs::is_directory(path, ec)) fail("{}: is a directory, not a data file", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) fail("{}: read error", path);
  return std::move(s).str();
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out.empty() ? "none" : out;
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

// The offset of the first NUL byte or invalid UTF-8 sequence in s (as the tokenizer
// decodes it: no overlong forms, surrogates or code points past U+10FFFF), or npos.
size_t bad_byte(std::string_view s) {
  const auto* b = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  for (size_t at = 0; at < s.size(); ++at) {
    if (b[at] == 0) return at;
    if (b[at] < 0x80) continue;
    utf8proc_int32_t c;
    const utf8proc_ssize_t n = utf8proc_iterate(b + at, utf8proc_ssize_t(s.size() - at), &c);
    if (n < 0) return at;
    at += size_t(n) - 1;
  }
  return std::string_view::npos;
}

// What bad_byte found, for a message.
std::string bad_byte_text(char c) {
  if (c == 0) return "a NUL byte, which text files do not hold (is this a binary or a UTF-16 file?)";
  return fmt::format("invalid UTF-8 (0x{:02x}); hone reads UTF-8 text (re-save the file as UTF-8)",
                     static_cast<unsigned char>(c));
}

// ---------------------------------------------------------------- JSON Lines

const std::string& text_field(const json& row, const std::string& column, const std::string& path, int64_t line) {
  auto it = row.find(column);
  if (it == row.end()) {
    std::vector<std::string> keys;
    for (auto& [k, v] : row.items()) keys.push_back(k);
    fail("{}:{}: no \"{}\" field (the line has {})", path, line, column, quoted_list(keys));
  }
  if (!it->is_string()) fail("{}:{}: \"{}\" is {}, not a string", path, line, column, it->type_name());
  return it->get_ref<const std::string&>();
}

std::string label_field(const json& row, const std::string& column, const std::string& path, int64_t line) {
  auto it = row.find(column);
  if (it == row.end()) {
    std::vector<std::string> keys;
    for (auto& [k, v] : row.items()) keys.push_back(k);
    fail("{}:{}: no \"{}\" field (the line has {})", path, line, column, quoted_list(keys));
  }
  switch (it->type()) {
    case json::value_t::string:
      if (it->get_ref<const std::string&>().empty())
        fail("{}:{}: the label (field \"{}\") is empty", path, line, column);
      return it->get<std::string>();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:  // the shortest form that reads back the same double
    case json::value_t::boolean:
      return it->dump();
    case json::value_t::null:
      fail("{}:{}: the label (field \"{}\") is null", path, line, column);
    default:
      fail("{}:{}: the label (field \"{}\") is {}, not a string, number or boolean", path, line, column,
           it->type_name());
  }
}

void read_jsonl(std::string_view data, const TextColumns& c, bool require_labels, TextTable& t) {
  const std::string& path = t.path;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string_view::npos) end = data.size();
    std::string_view l = data.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (blank(l)) continue;
    json row;
    try {
      row = json::parse(l);
    } catch (const json::parse_error& e) {
      // The parser rejects these too, but says less (and may echo the raw bytes).
      if (const size_t at = bad_byte(l); at != std::string_view::npos)
        fail("{}:{}: byte {} of the line: {}", path, line, at + 1, bad_byte_text(l[at]));
      // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> "column 5: ..."
      std::string what = e.what();
      const std::string_view marker = "parse error at line 1, ";
      if (auto at = what.find(marker); at != std::string::npos) what = what.substr(at + marker.size());
      else if (auto b = what.find("] "); b != std::string::npos) what = what.substr(b + 2);
      fail("{}:{}: not valid JSON: {}", path, line, what);
    } catch (const json::out_of_range& e) {  // a number no double holds, such as 1e400
      std::string what = e.what();
      if (auto b = what.find("] "); b != std::string::npos) what = what.substr(b + 2);
      fail("{}:{}: not valid JSON here: {} (a number too large for a double?)", path, line, what);
    }
    if (!row.is_object())
      fail("{}:{}: expected a JSON object (JSON Lines: one object per line), got {}", path, line, row.type_name());
    t.text.push_back(text_field(row, c.text, path, line));
    if (!c.text_pair.empty()) t.text_pair.push_back(text_field(row, c.text_pair, path, line));
    if (require_labels) t.labels.push_back(label_field(row, c.label, path, line));
    t.line.push_back(line);
  }
  if (t.text.empty()) fail("{}: no rows (the file is empty)", path);
}

// ---------------------------------------------------------------- CSV and TSV

// RFC 4180 records, as pandas.read_csv reads them by default: a field that starts with a
// double quote runs to the matching quote ("" is a quote inside it) and may hold
// separators and newlines; a quote elsewhere is an ordinary character; blank lines are
// skipped; CRLF or LF ends a record.
class DelimitedReader {
 public:
  DelimitedReader(std::string_view data, char sep, const std::string& path) : d_(data), sep_(sep), path_(path) {}

  // The next record and the line it starts on; false at the end of the file.
  // field_line(i) is then the line field i starts on (a quoted field may span lines).
  bool record(std::vector<std::string>& fields, int64_t& start_line) {
    while (pos_ < d_.size() && eol_length() > 0) {  // blank lines
      pos_ += eol_length();
      ++line_;
    }
    if (pos_ >= d_.size()) return false;
    start_line = line_;
    fields.clear();
    starts_.clear();
    for (;;) {
      fields.emplace_back();
      starts_.push_back(line_);
      std::string& f = fields.back();
      if (pos_ < d_.size() && d_[pos_] == '"') {
        const int64_t open_line = line_;
        ++pos_;
        for (;;) {
          if (pos_ >= d_.size()) fail("{}:{}: a quoted field is never closed", path_, open_line);
          const char c = d_[pos_];
          if (c == '"') {
            if (pos_ + 1 < d_.size() && d_[pos_ + 1] == '"') {
              f += '"';
              pos_ += 2;
              continue;
            }
            ++pos_;
            break;
          }
          if (c == '\n') ++line_;
          f += c;
          ++pos_;
        }
        if (pos_ < d_.size() && d_[pos_] != sep_ && eol_length() == 0)
          fail("{}:{}: unexpected character '{}' after the closing quote of a field", path_, line_,
               printable(d_[pos_]));
      } else {
        const size_t start = pos_;
        while (pos_ < d_.size() && d_[pos_] != sep_ && eol_length() == 0) ++pos_;
        f.assign(d_.substr(start, pos_ - start));
      }
      if (pos_ < d_.size() && d_[pos_] == sep_) {
        ++pos_;
        continue;
      }
      if (pos_ < d_.size()) {
        pos_ += eol_length();
        ++line_;
      }
      return true;
    }
  }
  int64_t field_line(size_t i) const { return starts_[i]; }

 private:
  // The length of the line ending at pos_: 1 for LF, 2 for CRLF, 1 for a CR that ends
  // the file, 0 otherwise.
  size_t eol_length() const {
    if (pos_ >= d_.size()) return 0;
    if (d_[pos_] == '\n') return 1;
    if (d_[pos_] == '\r') {
      if (pos_ + 1 == d_.size()) return 1;
      if (d_[pos_ + 1] == '\n') return 2;
    }
    return 0;
  }
  static std::string printable(char c) {
    if (c == '\t') return "\\t";
    if (std::isprint(static_cast<unsigned char>(c))) return std::string(1, c);
    return fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }

  std::string_view d_;
  char sep_;
  const std::string& path_;
  size_t pos_ = 0;
  int64_t line_ = 1;
  std::vector<int64_t> starts_;
};

// Text must be UTF-8 without NUL bytes, as pandas (UnicodeDecodeError) and Python's csv
// module ("line contains NUL") require, and as the tokenizer reads it: a field that is
// not is an error naming the line of the bad byte, the column, and where in the field.
// (JSON Lines needs no such check: the JSON parser rejects both.)
void check_text(const std::string& path, const std::vector<std::string>& fields, size_t i, int64_t field_line,
                const std::string& column_name) {
  const std::string& f = fields[i];
  const size_t at = bad_byte(f);
  if (at == std::string::npos) return;
  const int64_t line = field_line + std::count(f.begin(), f.begin() + ptrdiff_t(at), '\n');
  const std::string column = column_name.empty() ? fmt::format("column {} of the header", i + 1)
                                                 : fmt::format("column {} (\"{}\")", i + 1, column_name);
  fail("{}:{}: {}, byte {} of the field: {}", path, line, column, at + 1, bad_byte_text(f[at]));
}

void read_delimited(std::string_view data, char sep, const TextColumns& c, bool require_labels, TextTable& t) {
  const std::string& path = t.path;
  DelimitedReader reader(data, sep, path);
  std::vector<std::string> header, fields;
  int64_t header_line = 0, line = 0;
  if (!reader.record(header, header_line)) fail("{}: no rows (the file is empty)", path);
  for (size_t i = 0; i < header.size(); ++i) check_text(path, header, i, reader.field_line(i), "");
  auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end())
      fail("{}:{}: no column \"{}\" in the header (columns: {})", path, header_line, name, quoted_list(header));
    if (std::find(it + 1, header.end(), name) != header.end())
      fail("{}:{}: the header names column \"{}\" twice", path, header_line, name);
    return size_t(it - header.begin());
  };
  const size_t text = column(c.text);
  const size_t pair = c.text_pair.empty() ? 0 : column(c.text_pair);
  const size_t label = require_labels ? column(c.label) : 0;
  while (reader.record(fields, line)) {
    if (fields.size() != header.size())
      fail("{}:{}: {} field{}, but the header has {}{}", path, line, fields.size(), fields.size() == 1 ? "" : "s",
           header.size(),
           fields.size() < header.size() ? ""
           : sep == '\t'                ? " (a tab in a field that is not quoted?)"
                                        : " (a comma in a field that is not quoted?)");
    check_text(path, fields, text, reader.field_line(text), c.text);
    if (!c.text_pair.empty()) check_text(path, fields, pair, reader.field_line(pair), c.text_pair);
    if (require_labels) check_text(path, fields, label, reader.field_line(label), c.label);
    t.text.push_back(std::move(fields[text]));
    if (!c.text_pair.empty()) t.text_pair.push_back(std::move(fields[pair]));
    if (require_labels) {
      if (fields[label].empty()) fail("{}:{}: the label (column \"{}\") is empty", path, line, c.label);
      t.labels.push_back(std::move(fields[label]));
    }
    t.line.push_back(line);
  }
  if (t.text.empty()) fail("{}: no rows after the header", path);
}

}  // namespace

TextTable read_text_table(const std::string& path, const TextColumns& columns, bool require_labels) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  enum class Format { Jsonl, Csv, Tsv } format;
  if (ext == ".jsonl" || ext == ".json") format = Format::Jsonl;
  else if (ext == ".csv") format = Format::Csv;
  else if (ext == ".tsv") format = Format::Tsv;
  else
    fail("{}: unknown file type{}; the supported extensions are .jsonl and .json (JSON Lines), .csv and .tsv", path,
         ext.empty() ? "" : " \"" + ext + "\"");
  if (columns.text.empty()) fail("{}: no text column named", path);
  if (require_labels && columns.label.empty()) fail("{}: no label column named", path);

  TextTable t;
  t.path = path;
  const std::string data = read_file(path);
  std::string_view body = data;
  if (body.substr(0, 3) == "\xEF\xBB\xBF") body.remove_prefix(3);  // UTF-8 byte order mark
  if (body.substr(0, 2) == "\xFF\xFE" || body.substr(0, 2) == "\xFE\xFF")
    fail("{}: a UTF-16 file (it starts with a UTF-16 byte order mark); hone reads UTF-8 text (re-save the file as "
         "UTF-8)",
         path);
  t.label_column = require_labels ? columns.label : "";
  switch (format) {
    case Format::Jsonl: read_jsonl(body, columns, require_labels, t); break;
    case Format::Csv: read_delimited(body, ',', columns, require_labels, t); break;
    case Format::Tsv: read_delimited(body, '\t', columns, require_labels, t); break;
  }
  return t;
}

}  // namespace hone
