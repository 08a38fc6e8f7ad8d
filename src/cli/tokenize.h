#pragma once
// `hone tokenize`: the tokenizer on JSON lines, for parity checks against `tokenizers`.
#include <string>

namespace hone::cli {

// Reads JSON lines {"text": ..., "text_pair": ...} (text_pair optional) from stdin and
// prints one JSON line {"ids": [...], "type_ids": [...]} per input line.
int tokenize_command(const std::string& tokenizer_dir, int max_length);

}  // namespace hone::cli
