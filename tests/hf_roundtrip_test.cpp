// The round trip with Hugging Face: a directory that hone trained and saved loads in
// transformers (AutoTokenizer, AutoModelForSequenceClassification) and gives hone's
// logits and labels on the same text. Runs tools/hf_roundtrip.py; skipped where Python
// lacks torch and transformers.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

using Result = test::CommandResult;

// A small random model of each family, from transformers' defaults for its model_type.
ModelConfig small_config(const std::string& model_type) {
  nlohmann::json j = {{"model_type", model_type}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"hidden_size", 32}, {"intermediate_size", 64}};
  if (model_type == "distilbert") j = {{"model_type", model_type}, {"n_layers", 2}, {"n_heads", 4}, {"dim", 32},
                                       {"hidden_dim", 64}};
  if (model_type == "electra") j["embedding_size"] = 16;  // projected to hidden_size
  if (model_type == "modernbert") {  // the tokenizer fixture's ids; a window that cuts 24 tokens
    j["num_hidden_layers"] = 3;
    j.update({{"vocab_size", 1536}, {"pad_token_id", 4}, {"bos_token_id", 2}, {"cls_token_id", 2},
              {"eos_token_id", 3}, {"sep_token_id", 3}, {"local_attention", 8}});
  }
  // With BERT's tokenizer, the pairs' second texts have type 1, which the RoBERTa classes'
  // default of two token types (not their checkpoints' one) has a row for.
  return ModelConfig::from_json(j, model_type);
}

struct RoundTrip {
  std::string model_type, tokenizer;  // a fixture of the tokenizer tests
  int type_vocab_size = 2;
};

class HuggingFaceRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

// Sentence pairs with string labels; a tokenizer.json tokenizer, which the fixtures of
// the tokenizer tests provide: BERT's WordPiece for every family (the round trip tests the
// model), and the RoBERTa and XLM-RoBERTa families' own byte-level BPE and Unigram ones,
// which give no token types (their checkpoints' single type).
TEST_P(HuggingFaceRoundTrip, SavedModelGivesHoneLogitsInTransformers) {
  const RoundTrip& p = GetParam();
  const std::string tok = test::fixtures_dir() + "/tokenizer/" + p.tokenizer;
  ASSERT_TRUE(std::filesystem::exists(tok + "/tokenizer.json")) << tok;
  test::TempDir dir;
  ModelConfig c = small_config(p.model_type);
  c.type_vocab_size = p.type_vocab_size;
  test::save_random_model(dir.path + "/base", c, 3);
  const char* texts[][2] = {{"A man is playing a guitar.", "Someone plays music."},
                            {"The cat sleeps on the sofa.", "A dog barks loudly at night."},
                            {"Crème brûlée for dessert!", "They ordered a French dessert."},
                            {"Stock markets fell sharply today.", "Prices on the exchange dropped."},
                            {"It rained all weekend in São Paulo.", "The weather was sunny and dry."},
                            {"He fixed the bike's chain.", "The bicycle was repaired."}};
  std::ofstream f(dir.path + "/pairs.jsonl");
  for (int i = 0; i < 24; ++i) {
    const auto& t = texts[i % 6];
    f << nlohmann::json{{"premise", t[0]}, {"hypothesis", t[1]}, {"label", (i % 6) % 2 ? "contradiction" : "entailment"}}
             .dump()
      << "\n";
  }
  f.close();
  const std::string out = dir.path + "/out", data = dir.path + "/pairs.jsonl";
  Result r = test::run_hone("train --model_name_or_path " + dir.path + "/base --tokenizer_name " + tok +
                 " --train_file " + data + " --text_column premise --text_pair_column hypothesis"
                 " --max_seq_length 24 --per_device_train_batch_size 4 --max_steps 6 --learning_rate 1e-3"
                 " --save_strategy no --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ModelConfig::load(out + "/config.json").model_type, p.model_type);
  r = test::run_hone("predict --model_name_or_path " + out + " --test_file " + data +
          " --text_column premise --text_pair_column hypothesis --max_seq_length 24 --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  HONE_EXPECT_PYTHON_CHECK("python3 " HONE_SOURCE_DIR "/tools/hf_roundtrip.py " + out + " " + data + " " + out +
                           "/predictions.jsonl --text_column premise --text_pair_column hypothesis --max_length 24"
                           " --atol 1e-5");
}

INSTANTIATE_TEST_SUITE_P(Families, HuggingFaceRoundTrip,
                         ::testing::Values(RoundTrip{"bert", "minilm"}, RoundTrip{"roberta", "minilm"},
                                           RoundTrip{"roberta", "roberta", 1}, RoundTrip{"xlm-roberta", "minilm"},
                                           RoundTrip{"xlm-roberta", "xlmr", 1}, RoundTrip{"distilbert", "minilm"},
                                           RoundTrip{"electra", "minilm"}, RoundTrip{"modernbert", "modernbert"}),
                         [](const auto& info) {
                           std::string name = info.param.model_type + "_" + info.param.tokenizer;
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace hone
