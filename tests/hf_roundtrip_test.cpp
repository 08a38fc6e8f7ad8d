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

// Sentence pairs with string labels; a tokenizer.json tokenizer, which the fixtures of
// the tokenizer tests provide.
TEST(HuggingFaceRoundTrip, SavedModelGivesHoneLogitsInTransformers) {
  const std::string tok = test::fixtures_dir() + "/tokenizer/minilm";
  ASSERT_TRUE(std::filesystem::exists(tok + "/tokenizer.json")) << tok;
  test::TempDir dir;
  ModelConfig c = *builtin_config("bert-tiny");
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
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
  r = test::run_hone("predict --model_name_or_path " + out + " --test_file " + data +
          " --text_column premise --text_pair_column hypothesis --max_seq_length 24 --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  HONE_EXPECT_PYTHON_CHECK("python3 " HONE_SOURCE_DIR "/tools/hf_roundtrip.py " + out + " " + data + " " + out +
                           "/predictions.jsonl --text_column premise --text_pair_column hypothesis --max_length 24"
                           " --atol 1e-5");
}

}  // namespace
}  // namespace hone
