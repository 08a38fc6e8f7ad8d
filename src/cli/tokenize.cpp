// `hone tokenize`: JSON lines in, ids out, so a script can compare hone with `tokenizers`.
#include "cli/tokenize.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "hone/error.h"
#include "hone/tokenizer.h"

namespace hone::cli {

int tokenize_command(const std::string& tokenizer_dir, int max_length) {
  using nlohmann::json;
  if (max_length < 0) fail("--max_length {} is negative", max_length);
  const Tokenizer tok = Tokenizer::load(tokenizer_dir);
  std::ios::sync_with_stdio(false);
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail("stdin line {}: not valid JSON: {}", n, e.what());
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail("stdin line {}: expected {{\"text\": string, \"text_pair\": string (optional)}}", n);
    std::optional<std::string> pair;
    if (j.contains("text_pair") && !j["text_pair"].is_null()) {
      if (!j["text_pair"].is_string()) fail("stdin line {}: text_pair is not a string", n);
      pair = j["text_pair"].get<std::string>();
    }
    const std::string text = j["text"].get<std::string>();
    const std::string_view pair_view = pair ? std::string_view(*pair) : std::string_view();
    Encoding e;
    try {
      e = tok.encode(text, pair ? &pair_view : nullptr, max_length);
    } catch (const Error& err) {
      fail("stdin line {}: {}", n, err.what());
    }
    fmt::print("{{\"ids\": [{}], \"type_ids\": [{}]}}\n", fmt::join(e.ids, ", "), fmt::join(e.type_ids, ", "));
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace hone::cli
