#pragma once
// What the tokenizer tests share: the fixtures' files and a corpus row's encoding.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "hone/tokenizer.h"
#include "test_util.h"

namespace hone::test {

inline std::string tokenizer_fixtures() { return fixtures_dir() + "/tokenizer"; }
inline std::string variant(const std::string& name) { return tokenizer_fixtures() + "/" + name; }

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f) << path;
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A corpus row {"text": ..., "text_pair": ... or absent or null} through encode.
inline Encoding encode_row(const Tokenizer& t, const nlohmann::json& row, int max_length) {
  const std::string text = row.at("text").get<std::string>();
  if (!row.contains("text_pair") || row["text_pair"].is_null()) return t.encode(text, nullptr, max_length);
  const std::string pair = row["text_pair"].get<std::string>();
  const std::string_view pair_view(pair);
  return t.encode(text, &pair_view, max_length);
}

}  // namespace hone::test
