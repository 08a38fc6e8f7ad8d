// The tokenizers of the other encoder families (byte-level BPE as RoBERTa / ModernBERT /
// GPT-2 ship it, Unigram as XLM-RoBERTa does) against ids from the `tokenizers` package:
// stored fixtures (tools/make_tokenizer_fixtures_families.py), specific behaviours, and the
// errors of what hone does not read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hone/error.h"
#include "hone/tokenizer.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace hone {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::encode_row;
using test::tokenizer_fixtures;
using test::read_jsonl;
using test::read_text;
using test::variant;
using test::write_text;

const std::vector<std::string> kFamilies = {"bpe_options", "modernbert", "roberta", "unigram_options", "xlmr"};

// The shared corpus, then the families' own texts.
std::vector<json> family_corpus() {
  std::vector<json> rows = read_jsonl(tokenizer_fixtures() + "/corpus.jsonl");
  for (json& r : read_jsonl(tokenizer_fixtures() + "/corpus_families.jsonl")) rows.push_back(std::move(r));
  return rows;
}

// Every corpus line of every family variant, at every stored max_length, id for id.
TEST(TokenizerFamilies, MatchTokenizersForEveryVariant) {
  const std::vector<json> corpus = family_corpus();
  ASSERT_GT(corpus.size(), 140u);
  for (const std::string& name : kFamilies) {
    SCOPED_TRACE(name);
    const Tokenizer t = Tokenizer::load(variant(name));
    const std::vector<json> expected = read_jsonl(variant(name) + "/expected.jsonl");
    ASSERT_EQ(expected.size(), corpus.size());
    int checked = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
      for (const auto& [m, ids] : expected[i]["ids"].items()) {
        const Encoding e = encode_row(t, corpus[i], std::stoi(m));
        const auto want_ids = ids.get<std::vector<int32_t>>();
        const auto want_types = expected[i]["type_ids"][m].get<std::vector<int32_t>>();
        ASSERT_TRUE(e.ids == want_ids && e.type_ids == want_types)
            << "first mismatch: line " << i + 1 << " max_length " << m << ": " << corpus[i].dump()
            << "\n  got ids      " << json(e.ids).dump() << "\n  expected ids " << json(want_ids).dump()
            << "\n  got type_ids      " << json(e.type_ids).dump() << "\n  expected type_ids "
            << json(want_types).dump();
        ++checked;
      }
    }
    EXPECT_EQ(checked, int(corpus.size()) * 4);
  }
}

TEST(TokenizerFamilies, ModelTypesAndSpecialIds) {
  const Tokenizer roberta = Tokenizer::load(variant("roberta"));
  EXPECT_EQ(roberta.model_type(), "BPE");
  EXPECT_EQ(roberta.cls_id(), 0);
  EXPECT_EQ(roberta.pad_id(), 1);
  EXPECT_EQ(roberta.sep_id(), 2);
  EXPECT_EQ(roberta.max_type_id(), 0);  // RoBERTa's pair is all type 0
  EXPECT_EQ(roberta.token(4), "<mask>");
  const Tokenizer xlmr = Tokenizer::load(variant("xlmr"));
  EXPECT_EQ(xlmr.model_type(), "Unigram");
  EXPECT_EQ(xlmr.pad_id(), 1);
  EXPECT_EQ(xlmr.unk_id(), 3);
  const std::vector<int32_t> mask = xlmr.encode(" <mask>", nullptr, 0).ids;  // lstrip: the space goes too
  ASSERT_EQ(mask.size(), 3u);
  EXPECT_EQ(xlmr.token(mask[1]), "<mask>");
  EXPECT_EQ(Tokenizer::load(variant("unigram_options")).max_type_id(), 1);
  EXPECT_EQ(Tokenizer::load(variant("bpe_options")).pad_id(), -1);  // GPT-2 style: none
}

TEST(TokenizerFamilies, ByteLevelAndMetaspacePieces) {
  const Tokenizer roberta = Tokenizer::load(variant("roberta"));
  // The space before a word is part of it (Ġ); <mask> takes the spaces before it (lstrip).
  const std::vector<std::string> pieces = roberta.tokenize("a  <mask> b");
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0], "a");
  EXPECT_EQ(pieces[1], "<mask>");
  EXPECT_EQ(pieces[2], "\u0120b");
  const Tokenizer xlmr = Tokenizer::load(variant("xlmr"));
  const std::vector<std::string> words = xlmr.tokenize("ＡＢ  x");  // NFKC'd, spaces squeezed
  ASSERT_FALSE(words.empty());
  EXPECT_EQ(words[0].substr(0, 3), "\u2581");
  EXPECT_EQ(words.back(), "\u2581x");
}

TEST(TokenizerFamilies, SaveThenLoadGivesTheSameEncodings) {
  const std::vector<json> corpus = family_corpus();
  for (const std::string& name : kFamilies) {
    SCOPED_TRACE(name);
    test::TempDir tmp;
    const Tokenizer t = Tokenizer::load(variant(name));
    t.save(tmp.path + "/saved");
    EXPECT_EQ(read_text(tmp.path + "/saved/tokenizer.json"), read_text(variant(name) + "/tokenizer.json"));
    EXPECT_FALSE(fs::exists(tmp.path + "/saved/vocab.txt"));
    const json cfg = json::parse(read_text(tmp.path + "/saved/tokenizer_config.json"));
    EXPECT_EQ(cfg.at("tokenizer_class"), "PreTrainedTokenizerFast");
    const Tokenizer u = Tokenizer::load(tmp.path + "/saved");
    EXPECT_EQ(u.vocab_size(), t.vocab_size());
    EXPECT_EQ(u.pad_id(), t.pad_id());
    for (const json& row : corpus) {
      const Encoding a = encode_row(t, row, 7), b = encode_row(u, row, 7);
      ASSERT_TRUE(a.ids == b.ids && a.type_ids == b.type_ids) << row.dump();
    }
  }
}

// The variant's tokenizer.json with `change` applied, in a temporary directory; loading
// must fail with every one of `parts` and the file's path in the message.
void expect_error(const std::string& name, const std::function<void(json&)>& change,
                  const std::vector<std::string>& parts) {
  test::TempDir tmp;
  json j = json::parse(read_text(variant(name) + "/tokenizer.json"));
  change(j);
  write_text(tmp.path + "/tokenizer.json", j.dump());
  try {
    Tokenizer::load(tmp.path);
    ADD_FAILURE() << "loading did not fail: " << parts[0];
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(tmp.path + "/tokenizer.json"), std::string::npos) << what;
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what;
  }
}

TEST(TokenizerFamilies, UnsupportedComponentsAreNamed) {
  expect_error("roberta", [](json& j) { j["model"]["type"] = "WordLevel"; },
               {"model type \"WordLevel\" is not supported", "hone has WordPiece, BPE, Unigram"});
  expect_error("roberta", [](json& j) { j["model"].erase("type"); }, {"model type \"(none)\""});
  expect_error("xlmr", [](json& j) { j["normalizer"]["normalizers"][1] = {{"type", "NmtNormalizer"}}; },
               {"normalizer \"NmtNormalizer\" is not supported", "Precompiled"});
  expect_error("roberta", [](json& j) { j["pre_tokenizer"] = {{"type", "Digits"}}; },
               {"pre_tokenizer \"Digits\" is not supported", "ByteLevel, Metaspace"});
  expect_error("roberta", [](json& j) { j["post_processor"] = {{"type", "Fancy"}}; },
               {"post_processor \"Fancy\" is not supported", "RobertaProcessing"});
  expect_error("roberta", [](json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout is 0.1", "without dropout"});
  expect_error("xlmr", [](json& j) { j["model"]["byte_fallback"] = true; }, {"byte_fallback"});
  expect_error("xlmr", [](json& j) { j["normalizer"]["normalizers"][1]["pattern"]["Regex"] = "a|b"; },
               {"Regex \"a|b\" is not supported"});
  expect_error("xlmr", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AAA*"; },
               {"precompiled_charsmap is not base64"});
  expect_error("xlmr", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AAE="; },
               {"Precompiled", "shorter than its 4-byte header"});
  expect_error("xlmr", [](json& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; }, {"prepend_scheme"});
  expect_error("xlmr", [](json& j) { j["model"]["vocab"][5] = {"x"}; }, {"model.vocab[5] must be a [piece, score] pair"});
  expect_error("xlmr", [](json& j) { j["model"]["unk_id"] = 100000; }, {"model.unk_id has id 100000"});
}

TEST(TokenizerFamilies, MalformedMergesAreNamed) {
  expect_error("roberta", [](json& j) { j["model"]["merges"][3] = "nospace"; },
               {"model.merges[3] is \"nospace\"", "two tokens separated by one space"});
  expect_error("roberta", [](json& j) { j["model"]["merges"][3] = "a b c"; }, {"model.merges[3]"});
  expect_error("roberta", [](json& j) { j["model"]["merges"][0] = "zzzq qqqz"; },
               {"model.merges[0]: token \"zzzq\" is not in model.vocab"});
  expect_error("bpe_options", [](json& j) { j["model"]["merges"][2] = {"a", "b", "c"}; },
               {"model.merges[2] must be \"a b\" or [\"a\", \"b\"]"});
  expect_error("bpe_options", [](json& j) { j["model"]["merges"] = "a b"; }, {"model.merges must be an array"});
  expect_error("bpe_options", [](json& j) { j["model"].erase("merges"); }, {"model.merges must be an array"});
}

}  // namespace
}  // namespace hone
