#include "hone/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>

#include "hone/error.h"
#include "hone/model.h"
#include "hone/optimizer.h"
#include "test_util.h"

namespace hone {
namespace {

using nlohmann::json;
using test::TempDir;

// google-bert/bert-base-uncased's config.json as published on the Hub.
const char* kBertBaseConfig = R"({
  "architectures": [
    "BertForMaskedLM"
  ],
  "attention_probs_dropout_prob": 0.1,
  "gradient_checkpointing": false,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "transformers_version": "4.6.0.dev0",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
})";

// Runs `f`, which must throw hone::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

ModelConfig parse(const json& j) { return ModelConfig::from_json(j, "config.json"); }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Config, ParsesTransformersBertConfig) {
  ModelConfig c = parse(json::parse(kBertBaseConfig));
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 12);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_FLOAT_EQ(c.hidden_dropout_prob, 0.1f);
  EXPECT_FLOAT_EQ(c.attention_probs_dropout_prob, 0.1f);
  EXPECT_FLOAT_EQ(c.initializer_range, 0.02f);
  EXPECT_FLOAT_EQ(c.layer_norm_eps, 1e-12f);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.type_vocab_size, 2);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_FALSE(c.classifier_dropout.has_value());
  EXPECT_FLOAT_EQ(c.effective_classifier_dropout(), 0.1f);
  EXPECT_EQ(c.num_labels, 2);
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"LABEL_0", "LABEL_1"}));
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(c.activation(), Activation::Gelu);
  EXPECT_EQ(c.resolved_problem_type(), "single_label_classification");
  // Unused fields are kept; architectures is rewritten on save.
  EXPECT_EQ(c.model_type, "bert");
  EXPECT_EQ(c.extra, json::parse(R"({"gradient_checkpointing": false,
                                     "transformers_version": "4.6.0.dev0", "use_cache": true})"));
  c.validate("config.json");
}

TEST(Config, ParsesTransformers5Config) {
  // What transformers 5.17 save_pretrained writes for SequenceClassifier.
  ModelConfig c = parse(json::parse(R"({
    "add_cross_attention": false, "architectures": ["BertForSequenceClassification"],
    "attention_probs_dropout_prob": 0.1, "bos_token_id": null, "classifier_dropout": null,
    "dtype": "float32", "eos_token_id": null, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 64, "id2label": {"0": "NEG", "1": "POS", "2": "NEU"}, "initializer_range": 0.02,
    "intermediate_size": 96, "is_decoder": false, "label2id": null, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 2,
    "num_hidden_layers": 1, "pad_token_id": 0, "tie_word_embeddings": true,
    "transformers_version": "5.17.0", "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522})"));
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"NEG", "POS", "NEU"}));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_FALSE(c.extra.contains("dtype"));
  EXPECT_TRUE(c.extra.contains("tie_word_embeddings"));
  c.validate("config.json");
  EXPECT_EQ(c.to_json()["label2id"], json::parse(R"({"NEG": 0, "POS": 1, "NEU": 2})"));
}

TEST(Config, EveryFieldIsOptional) {
  ModelConfig c = parse(json::object());
  ModelConfig d;
  EXPECT_EQ(c.hidden_size, d.hidden_size);
  EXPECT_EQ(c.num_labels, 2);
  EXPECT_EQ(c.id2label.size(), 2u);
  c.validate("config.json");
}

TEST(Config, ToJsonWritesWhatTransformersWrites) {
  json j = parse(json::parse(kBertBaseConfig)).to_json();
  EXPECT_EQ(j["architectures"], json::array({"BertForSequenceClassification"}));
  EXPECT_EQ(j["model_type"], "bert");
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_TRUE(j["classifier_dropout"].is_null());
  EXPECT_EQ(j["id2label"], json::parse(R"({"0": "LABEL_0", "1": "LABEL_1"})"));
  EXPECT_EQ(j["label2id"], json::parse(R"({"LABEL_0": 0, "LABEL_1": 1})"));
  EXPECT_FALSE(j.contains("problem_type"));
  EXPECT_FALSE(j.contains("num_labels"));
  // Floats as Python prints them, not as their float32 rounding.
  EXPECT_EQ(j["hidden_dropout_prob"].dump(), "0.1");
  EXPECT_EQ(j["initializer_range"].dump(), "0.02");
  EXPECT_EQ(j["layer_norm_eps"].dump(), "1e-12");
  EXPECT_EQ(j["hidden_size"], 768);
  EXPECT_EQ(j["position_embedding_type"], "absolute");
  EXPECT_EQ(j["transformers_version"], "4.6.0.dev0");
  EXPECT_EQ(j["use_cache"], true);
  EXPECT_EQ(j["gradient_checkpointing"], false);
}

TEST(Config, SaveAndLoadRoundTrip) {
  TempDir dir;
  std::string path = dir.path + "/config.json";
  json src = json::parse(kBertBaseConfig);
  src["hidden_act"] = "gelu_new";
  src["classifier_dropout"] = 0.25;
  src["problem_type"] = "single_label_classification";
  src["id2label"] = {{"0", "NEG"}, {"1", "NEU"}, {"2", "POS"}};
  src["custom_field"] = {{"nested", json::array({1, 2})}};
  ModelConfig a = parse(src);
  a.save(path);
  std::string text = read_text(path);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.rfind("{\n  \"architectures\": [", 0), 0u);  // sorted keys, indent 2

  ModelConfig b = ModelConfig::load(path);
  EXPECT_EQ(b.to_json(), a.to_json());
  EXPECT_EQ(b.num_labels, 3);
  EXPECT_EQ(b.id2label, (std::vector<std::string>{"NEG", "NEU", "POS"}));
  EXPECT_EQ(b.hidden_act, "gelu_new");
  EXPECT_EQ(b.activation(), Activation::GeluTanh);
  EXPECT_EQ(b.classifier_dropout, 0.25f);
  EXPECT_EQ(b.problem_type, "single_label_classification");
  EXPECT_EQ(b.extra["custom_field"], src["custom_field"]);
  b.validate(path);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) files.push_back(e.path().filename());
  EXPECT_EQ(files, std::vector<std::string>{"config.json"});
}

TEST(Config, Id2LabelGivesNumLabels) {
  ModelConfig c = parse(json::parse(R"({"id2label": {"2": "NEU", "0": "NEG", "1": "POS"}})"));
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"NEG", "POS", "NEU"}));
  c.validate("config.json");

  ModelConfig d = parse(json::parse(
      R"({"id2label": {"0": "NEG", "1": "POS"}, "label2id": {"POS": 1, "NEG": 0}, "num_labels": 2})"));
  EXPECT_EQ(d.id2label, (std::vector<std::string>{"NEG", "POS"}));

  ModelConfig e = parse(json::parse(R"({"label2id": {"b": 1, "a": 0}})"));
  EXPECT_EQ(e.num_labels, 2);
  EXPECT_EQ(e.id2label, (std::vector<std::string>{"a", "b"}));
}

TEST(Config, NumLabelsWithoutId2LabelGivesDefaultNames) {
  ModelConfig c = parse(json::parse(R"({"num_labels": 3})"));
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"LABEL_0", "LABEL_1", "LABEL_2"}));
  EXPECT_EQ(c.resolved_problem_type(), "single_label_classification");
  ModelConfig r = parse(json::parse(R"({"num_labels": 1})"));
  EXPECT_EQ(r.id2label, std::vector<std::string>{"LABEL_0"});
  EXPECT_EQ(r.resolved_problem_type(), "regression");
  r.problem_type = "single_label_classification";
  EXPECT_EQ(r.resolved_problem_type(), "single_label_classification");
}

TEST(Config, RejectsMalformedLabelMaps) {
  for (const char* bad : {
           R"({"id2label": ["NEG", "POS"]})",
           R"({"id2label": {"0": "NEG", "x": "POS"}})",
           R"({"id2label": {"0": "NEG", "2": "POS"}})",
           R"({"id2label": {"0": "NEG", "00": "POS"}})",
           R"({"id2label": {"0": "NEG", "1": 5}})",
           R"({"id2label": {"0": "NEG", "1": "POS"}, "label2id": {"NEG": 1, "POS": 0}})",
           R"({"id2label": {"0": "NEG", "1": "POS"}, "label2id": {"NEG": 0}})",
           R"({"label2id": {"a": 0, "b": 0}})",
           R"({"label2id": {"a": "0"}})",
       }) {
    SCOPED_TRACE(bad);
    expect_error([&] { parse(json::parse(bad)); }, {"config.json", "label"});
  }
}

TEST(Config, TypeErrorsNameSourceAndField) {
  expect_error([] { parse(json::parse(R"({"hidden_size": "768"})")); },
               {"config.json: field 'hidden_size' must be an integer, got string"});
  expect_error([] { parse(json::parse(R"({"num_hidden_layers": 12.5})")); },
               {"config.json: field 'num_hidden_layers' must be an integer"});
  expect_error([] { parse(json::parse(R"({"vocab_size": 1e12})")); }, {"'vocab_size'"});
  expect_error([] { parse(json::parse(R"({"vocab_size": 10000000000})")); }, {"'vocab_size'", "out of range"});
  expect_error([] { parse(json::parse(R"({"hidden_dropout_prob": "0.1"})")); },
               {"config.json: field 'hidden_dropout_prob' must be a number, got string"});
  expect_error([] { parse(json::parse(R"({"hidden_act": 5})")); },
               {"config.json: field 'hidden_act' must be a string"});
  expect_error([] { parse(json::parse(R"({"classifier_dropout": "none"})")); }, {"'classifier_dropout'"});
  expect_error([] { parse(json::parse(R"({"problem_type": 3})")); }, {"'problem_type'"});
  expect_error([] { parse(json::parse(R"({"problem_type": "ranking"})")); }, {"'problem_type'", "ranking"});
  expect_error([] { parse(json::parse(R"({"pad_token_id": null})")); }, {"'pad_token_id'"});
  expect_error([] { parse(json::parse("[1, 2]")); }, {"config.json", "JSON object"});
}

TEST(Config, NullableFieldsAcceptNull) {
  ModelConfig c = parse(json::parse(R"({"classifier_dropout": null, "problem_type": null})"));
  EXPECT_FALSE(c.classifier_dropout.has_value());
  EXPECT_TRUE(c.problem_type.empty());
  ModelConfig d = parse(json::parse(R"({"classifier_dropout": 0, "problem_type": "regression", "num_labels": 1})"));
  EXPECT_EQ(d.classifier_dropout, 0.0f);
  EXPECT_EQ(d.effective_classifier_dropout(), 0.0f);
  EXPECT_EQ(d.resolved_problem_type(), "regression");
  d.validate("config.json");
}

TEST(Config, ValidationErrorsNameSourceAndField) {
  struct Case {
    const char* json;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {R"({"vocab_size": 0})", {"vocab_size must be >= 1, got 0"}},
      {R"({"hidden_size": -8})", {"hidden_size must be >= 1, got -8"}},
      {R"({"num_hidden_layers": -1})", {"num_hidden_layers must be in [1, 1364], got -1"}},
      {R"({"num_hidden_layers": 0})", {"num_hidden_layers must be in [1, 1364], got 0"}},
      {R"({"num_hidden_layers": 1365})", {"num_hidden_layers must be in [1, 1364], got 1365"}},
      {R"({"num_attention_heads": 0})", {"num_attention_heads must be >= 1, got 0"}},
      {R"({"num_attention_heads": -12})", {"num_attention_heads must be >= 1, got -12"}},
      {R"({"intermediate_size": 0})", {"intermediate_size must be >= 1, got 0"}},
      {R"({"max_position_embeddings": 0})", {"max_position_embeddings must be >= 1, got 0"}},
      {R"({"type_vocab_size": -2})", {"type_vocab_size must be >= 1, got -2"}},
      {R"({"hidden_size": 770})", {"hidden_size (770) must be divisible by num_attention_heads (12)"}},
      {R"({"pad_token_id": -1})", {"pad_token_id must be >= 0, got -1"}},
      {R"({"pad_token_id": 30522})", {"pad_token_id (30522) must be a token id below vocab_size (30522)"}},
      {R"({"hidden_dropout_prob": 1.0})", {"hidden_dropout_prob must be in [0, 1), got 1"}},
      {R"({"attention_probs_dropout_prob": -0.1})", {"attention_probs_dropout_prob must be in [0, 1), got -0.1"}},
      {R"({"classifier_dropout": 1.5})", {"classifier_dropout must be in [0, 1), got 1.5"}},
      {R"({"initializer_range": -0.02})", {"initializer_range must be >= 0, got -0.02"}},
      {R"({"layer_norm_eps": 0})", {"layer_norm_eps must be > 0, got 0"}},
      {R"({"layer_norm_eps": -1e-12})", {"layer_norm_eps must be > 0, got -1e-12"}},
      {R"({"num_labels": 0})", {"num_labels must be in [1, 1048576], got 0"}},
      {R"({"num_labels": 2000000000})", {"num_labels must be in [1, 1048576], got 2000000000"}},
      {R"({"num_labels": 3, "id2label": {"0": "a", "1": "b"}})", {"num_labels is 3", "id2label has 2"}},
      // Each size fits an int; their products would not fit the memory plan's int64 byte counts.
      {R"({"vocab_size": 2000000000, "hidden_size": 2000000000, "num_attention_heads": 1})",
       {"vocab_size 2000000000, hidden_size 2000000000", "parameters", "limit of 2^40"}},
      {R"({"hidden_size": 65536, "num_attention_heads": 16, "num_hidden_layers": 1000})",
       {"num_hidden_layers 1000", "parameters"}},
      {R"({"hidden_act": "swish"})", {"'swish'", "gelu, gelu_new, gelu_pytorch_tanh, relu"}},
      {R"({"position_embedding_type": "relative_key"})", {"'relative_key'", "not supported"}},
      {R"({"model_type": "deberta-v2"})",
       {R"(model_type "deberta-v2" is not one hone implements (hone has: "bert", "roberta", "xlm-roberta", )"
        R"("distilbert", "electra", "modernbert"))"}},
      {R"({"model_type": "modernbert", "classifier_pooling": "max"})", {"classifier_pooling 'max' is not supported"}},
      {R"({"model_type": "modernbert", "num_hidden_layers": 2, "layer_types": ["full_attention"]})",
       {"layer_types has 1 entries for 2 layers"}},
      {R"({"model_type": "modernbert", "rope_parameters": {"full_attention": {"rope_type": "yarn"}}})",
       {"rope_parameters.full_attention.rope_type \"yarn\" is not supported"}},
      {R"({"model_type": "modernbert", "hidden_size": 30, "num_attention_heads": 2})",
       {"rotary embeddings need an even head size, got 15"}},
      {R"({"model_type": "modernbert", "hidden_activation": "swish"})", {"hidden_activation 'swish' is not supported"}},
      {R"({"model_type": 3})", {"field 'model_type' must be a string, got number 3"}},
      {R"({"model_type": "distilbert", "sinusoidal_pos_embds": true})",
       {"sinusoidal_pos_embds true is not supported (hone runs sinusoidal_pos_embds false)"}},
      {R"({"model_type": "distilbert", "dim": 100, "n_heads": 3})", {"hidden_size (100)", "num_attention_heads (3)"}},
      {R"({"model_type": "distilbert", "n_layers": 0})", {"n_layers must be in [1, 1364], got 0"}},
      {R"({"model_type": "roberta", "max_position_embeddings": 2})", {"max_position_embeddings (2) leaves no position"}},
      {R"({"problem_type": "multi_label_classification"})", {"multi_label_classification", "not supported yet"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    try {
      ModelConfig::from_json(json::parse(c.json), "/models/x/config.json");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("/models/x/config.json: ", 0), 0u) << msg;
      for (const auto& p : c.parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
  }
}

TEST(Config, RangeLimitsAreInclusiveWhereTheyShouldBe) {
  ModelConfig c = parse(json::parse(R"({"num_hidden_layers": 1364, "hidden_size": 64, "num_attention_heads": 64,
      "pad_token_id": 30521, "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0.999,
      "classifier_dropout": 0, "initializer_range": 0, "layer_norm_eps": 1e-30, "num_labels": 1,
      "max_position_embeddings": 1, "type_vocab_size": 1, "intermediate_size": 1})"));
  EXPECT_EQ(c.num_hidden_layers, 1364);
  EXPECT_EQ(c.head_dim(), 1);
}

// validate() also guards configurations made in code, not only those read from files.
TEST(Config, ValidateChecksConfigsMadeInCode) {
  ModelConfig c;
  c.num_attention_heads = 0;
  expect_error([&] { c.validate("bert-custom"); }, {"bert-custom: num_attention_heads must be >= 1, got 0"});
  c = ModelConfig{};
  c.layer_norm_eps = std::numeric_limits<float>::infinity();
  expect_error([&] { c.validate("bert-custom"); }, {"bert-custom: layer_norm_eps must be > 0, got inf"});
  c = ModelConfig{};
  c.hidden_dropout_prob = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { c.validate("bert-custom"); }, {"hidden_dropout_prob must be in [0, 1), got nan"});
}

// Each family's config.json as transformers saves it reads into ModelConfig's fields and
// is written back under the family's own names; a model_type hone lacks is refused.
TEST(Config, FamiliesReadAndWriteTheirOwnFiles) {
  TempDir dir;
  const std::string path = dir.path + "/config.json";
  std::ofstream(path) << R"({"architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
      "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
      "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
      "model_type": "roberta", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
      "type_vocab_size": 1, "vocab_size": 50265})";
  ModelConfig roberta = ModelConfig::load(path);
  EXPECT_EQ(roberta.model_type, "roberta");
  EXPECT_EQ(roberta.family().architecture, "RobertaForSequenceClassification");
  EXPECT_EQ(roberta.pad_token_id, 1);
  EXPECT_EQ(roberta.max_sequence_length(), 512);  // positions start after the padding index
  json j = roberta.to_json();
  EXPECT_EQ(j["architectures"], json::array({"RobertaForSequenceClassification"}));
  EXPECT_EQ(j["model_type"], "roberta");
  EXPECT_EQ(j["bos_token_id"], 0);
  EXPECT_EQ(j["type_vocab_size"], 1);

  // DistilBERT names the fields its own way, and has no token types or LayerNorm eps.
  std::ofstream(path) << R"({"activation": "gelu", "architectures": ["DistilBertForMaskedLM"],
      "attention_dropout": 0.1, "dim": 768, "dropout": 0.1, "hidden_dim": 3072, "initializer_range": 0.02,
      "max_position_embeddings": 512, "model_type": "distilbert", "n_heads": 12, "n_layers": 6, "pad_token_id": 0,
      "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": false, "tie_weights_": true,
      "vocab_size": 30522})";
  ModelConfig distil = ModelConfig::load(path);
  EXPECT_EQ(distil.hidden_size, 768);
  EXPECT_EQ(distil.num_hidden_layers, 6);
  EXPECT_EQ(distil.intermediate_size, 3072);
  EXPECT_FLOAT_EQ(distil.effective_classifier_dropout(), 0.2f);
  j = distil.to_json();
  for (const char* field : {"dim", "n_layers", "n_heads", "hidden_dim", "activation", "dropout", "attention_dropout",
                            "seq_classif_dropout", "qa_dropout", "sinusoidal_pos_embds", "tie_weights_"})
    EXPECT_TRUE(j.contains(field)) << field;
  for (const char* field : {"hidden_size", "num_hidden_layers", "intermediate_size", "type_vocab_size",
                            "layer_norm_eps", "classifier_dropout", "hidden_act"})
    EXPECT_FALSE(j.contains(field)) << field;
  EXPECT_EQ(ModelConfig::from_json(j, "saved").to_json(), j);
  // Missing fields take DistilBertConfig's defaults, not BertConfig's.
  EXPECT_EQ(ModelConfig::from_json(json::parse(R"({"model_type": "distilbert"})"), "x").num_hidden_layers, 6);

  // ELECTRA's embeddings have a width of their own (transformers' default: 128 of 256).
  ModelConfig electra = ModelConfig::from_json(json::parse(R"({"model_type": "electra"})"), "x");
  EXPECT_EQ(electra.embedding_width(), 128);
  EXPECT_EQ(electra.hidden_size, 256);
  EXPECT_TRUE(electra.projects_embeddings());
  EXPECT_EQ(electra.to_json()["embedding_size"], 128);
  EXPECT_FALSE(roberta.to_json().contains("embedding_size"));

  std::ofstream(path) << R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})";
  expect_error([&] { ModelConfig::load(path); }, {path + R"(: model_type "gpt2")", R"(hone has: "bert", )"});
  // A BERT encoder saved with any head, or with no model_type at all, is a BERT.
  std::ofstream(path) << R"({"architectures": ["BertForPreTraining"], "model_type": "bert"})";
  EXPECT_EQ(ModelConfig::load(path).hidden_size, 768);
  std::ofstream(path) << R"({"architectures": ["BertModel"]})";
  EXPECT_EQ(ModelConfig::load(path).hidden_size, 768);
}

// ModernBERT's Hub files give the older global_attn_every_n_layers and rope thetas;
// transformers 5 reads them into layer_types and rope_parameters, which hone writes.
TEST(Config, ModernBertReadsHubAndTransformersFiveFiles) {
  const ModelConfig hub = parse(json::parse(R"({"model_type": "modernbert", "num_hidden_layers": 5,
      "global_attn_every_n_layers": 2, "global_rope_theta": 80000.0, "local_rope_theta": 500.0,
      "local_attention": 8, "norm_bias": false, "classifier_pooling": "mean", "hidden_activation": "gelu",
      "initializer_cutoff_factor": 2.0})"));
  EXPECT_EQ(hub.layer_types, (std::vector<std::string>{"full_attention", "sliding_attention", "full_attention",
                                                      "sliding_attention", "full_attention"}));
  EXPECT_EQ(hub.attention_window(0), -1);
  EXPECT_EQ(hub.attention_window(1), 4);
  EXPECT_FLOAT_EQ(hub.rope_theta(0), 80000.0f);
  EXPECT_FLOAT_EQ(hub.rope_theta(3), 500.0f);
  EXPECT_FALSE(hub.norm_bias);
  EXPECT_EQ(hub.family().architecture, "ModernBertForSequenceClassification");
  EXPECT_EQ(hub.intermediate_size, 1152);  // ModernBertConfig's defaults, not BertConfig's
  EXPECT_FLOAT_EQ(hub.layer_norm_eps, 1e-5f);
  const json j = hub.to_json();
  EXPECT_EQ(j["layer_types"].size(), 5u);
  EXPECT_EQ(j["rope_parameters"]["sliding_attention"]["rope_theta"], 500.0);
  EXPECT_EQ(j["rope_parameters"]["full_attention"]["rope_type"], "default");
  for (const char* field : {"hidden_activation", "norm_eps", "mlp_dropout", "attention_dropout", "embedding_dropout",
                            "classifier_pooling", "local_attention", "norm_bias", "initializer_cutoff_factor"})
    EXPECT_TRUE(j.contains(field)) << field;
  for (const char* field : {"hidden_act", "layer_norm_eps", "type_vocab_size", "global_rope_theta",
                            "global_attn_every_n_layers", "position_embedding_type"})
    EXPECT_FALSE(j.contains(field)) << field;
  EXPECT_EQ(ModelConfig::from_json(j, "saved").to_json(), j);
  // rope_parameters wins over the older keys, as in transformers.
  const ModelConfig both = parse(json::parse(R"({"model_type": "modernbert", "global_rope_theta": 1.0,
      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 7.0}}})"));
  EXPECT_FLOAT_EQ(both.global_rope_theta, 7.0f);
  EXPECT_FLOAT_EQ(both.local_rope_theta, 10000.0f);
  // A BERT file's ModernBERT field is carried, not read.
  const ModelConfig bert = parse(json::parse(R"({"norm_bias": false})"));
  EXPECT_TRUE(bert.norm_bias);
  EXPECT_EQ(bert.to_json()["norm_bias"], false);
  const ModelConfig large = *builtin_config("answerdotai/ModernBERT-large");
  EXPECT_EQ(large.num_hidden_layers, 28);
  EXPECT_EQ(large.intermediate_size, 2624);
  EXPECT_EQ(large.classifier_pooling, "mean");
  EXPECT_EQ(large.attention_window(2), 64);
  EXPECT_EQ(large.attention_window(3), -1);
}

// The built-in configurations are those of the Hub checkpoints.
TEST(Config, BuiltinFamilies) {
  const ModelConfig roberta = *builtin_config("FacebookAI/roberta-large");
  EXPECT_EQ(roberta.model_type, "roberta");
  EXPECT_EQ(roberta.hidden_size, 1024);
  EXPECT_EQ(roberta.max_position_embeddings, 514);
  EXPECT_EQ(roberta.vocab_size, 50265);
  EXPECT_EQ(builtin_config("xlm-roberta-base")->vocab_size, 250002);
  EXPECT_EQ(builtin_config("distilbert-base-uncased")->num_hidden_layers, 6);
  EXPECT_EQ(builtin_config("google/electra-small-discriminator")->embedding_width(), 128);
  EXPECT_FALSE(builtin_config("electra-base-discriminator")->projects_embeddings());
}

TEST(Config, RangeErrorsFromAFileNameThePath) {
  TempDir dir;
  const std::string path = dir.path + "/config.json";
  std::ofstream(path) << R"({"model_type": "bert", "num_attention_heads": 0})";
  expect_error([&] { ModelConfig::load(path); }, {path + ": num_attention_heads must be >= 1, got 0"});
  std::ofstream(path) << R"({"model_type": "bert", "num_hidden_layers": -1})";
  expect_error([&] { ModelConfig::load(path); }, {path + ": num_hidden_layers must be in [1, 1364], got -1"});
}

TEST(Config, ActivationNames) {
  ModelConfig c;
  for (auto [name, act] : {std::pair{"gelu", Activation::Gelu}, std::pair{"gelu_new", Activation::GeluTanh},
                           std::pair{"gelu_pytorch_tanh", Activation::GeluTanh}, std::pair{"relu", Activation::Relu}}) {
    c.hidden_act = name;
    EXPECT_EQ(c.activation(), act) << name;
    c.validate("config.json");
  }
}

TEST(Config, LoadErrorsNameThePath) {
  TempDir dir;
  std::string missing = dir.path + "/absent/config.json";
  expect_error([&] { ModelConfig::load(missing); }, {"cannot read config.json at " + missing});
  std::string bad = dir.path + "/config.json";
  std::ofstream(bad) << "{\"hidden_size\": 768,";
  expect_error([&] { ModelConfig::load(bad); }, {bad, "invalid JSON"});
  std::ofstream(bad) << R"({"hidden_size": "big"})";
  expect_error([&] { ModelConfig::load(bad); }, {bad + ": field 'hidden_size' must be an integer"});
  expect_error([&] { ModelConfig::load(dir.path); }, {"cannot read config.json at " + dir.path});
}

// A number no double holds (1e400, which Python's json reads as inf) made nlohmann throw
// out_of_range, not parse_error: it escaped, and hone died of std::terminate.
TEST(Config, NumberOverflowIsAnErrorNamingTheFile) {
  TempDir dir;
  const std::string path = dir.path + "/config.json";
  for (const char* text : {R"({"hidden_size": 1e400})", R"({"id2label": 1e400, "hidden_size": 32})",
                           R"({"layer_norm_eps": -1e400})"}) {
    std::ofstream(path) << text;
    expect_error([&] { ModelConfig::load(path); }, {path + ": invalid JSON", "number overflow"});
  }
}

// A null field's type reads "null", not "null null".
TEST(Config, NullFieldsNameTheirType) {
  expect_error([] { parse(json::parse(R"({"hidden_size": null})")); },
               {"field 'hidden_size' must be an integer, got null"});
  try {
    parse(json::parse(R"({"hidden_size": null})"));
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("null null"), std::string::npos) << e.what();
  }
}

TEST(Config, BuiltinConfigs) {
  struct Sizes {
    const char* name;
    int layers, hidden, heads, intermediate;
  };
  const Sizes sizes[] = {
      {"bert-tiny", 2, 128, 2, 512},           {"bert-mini", 4, 256, 4, 1024},
      {"bert-small", 4, 512, 8, 2048},         {"bert-medium", 8, 512, 8, 2048},
      {"bert-base-uncased", 12, 768, 12, 3072}, {"bert-large-uncased", 24, 1024, 16, 4096},
  };
  std::vector<std::string> names;
  for (const Sizes& s : sizes) {
    SCOPED_TRACE(s.name);
    names.push_back(s.name);
    auto c = builtin_config(s.name);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->num_hidden_layers, s.layers);
    EXPECT_EQ(c->hidden_size, s.hidden);
    EXPECT_EQ(c->num_attention_heads, s.heads);
    EXPECT_EQ(c->intermediate_size, s.intermediate);
    EXPECT_EQ(c->vocab_size, 30522);
    EXPECT_EQ(c->max_position_embeddings, 512);
    EXPECT_EQ(c->type_vocab_size, 2);
    EXPECT_EQ(c->hidden_act, "gelu");
    EXPECT_EQ(c->num_labels, 2);
    EXPECT_EQ(c->id2label.size(), 2u);
    c->validate(s.name);
  }
  const std::vector<std::string> all = builtin_config_names();  // the BERTs first, then the other families
  EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + std::ptrdiff_t(names.size())), names);
  for (const std::string& name : all) builtin_config(name)->validate(name);
  EXPECT_EQ(builtin_config("google-bert/bert-base-uncased")->hidden_size, 768);
  EXPECT_EQ(builtin_config("google-bert/bert-large-uncased")->hidden_size, 1024);
  EXPECT_EQ(builtin_config("prajjwal1/bert-tiny")->hidden_size, 128);
  EXPECT_EQ(builtin_config("prajjwal1/bert-medium")->num_hidden_layers, 8);
  EXPECT_EQ(builtin_config("google/bert_uncased_L-4_H-256_A-4")->hidden_size, 256);
  EXPECT_FALSE(builtin_config("bert-huge").has_value());
  EXPECT_FALSE(builtin_config("").has_value());
}

TEST(Config, BertLargeHasTheKnownParameterCount) {
  ModelConfig c = *builtin_config("bert-large-uncased");
  const int64_t V = c.vocab_size, P = c.max_position_embeddings, T = c.type_vocab_size;
  const int64_t H = c.hidden_size, I = c.intermediate_size, L = c.num_hidden_layers, N = c.num_labels;
  const int64_t embeddings = V * H + P * H + T * H + 2 * H;
  const int64_t layer = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H;
  const int64_t pooler = H * H + H;
  const int64_t classifier = N * H + N;
  EXPECT_EQ(embeddings + L * layer + pooler + classifier, 335143938);
}

// Every family's embedding tables open the flat buffers, so that the half copy mixed
// precision keeps can start after them, and no optimizer range crosses their end.
TEST(Config, EmbeddingTablesOpenTheLayoutOfEveryFamily) {
  for (const char* name : {"bert-large-uncased", "roberta-large", "xlm-roberta-large", "distilbert-base-uncased",
                           "electra-small-discriminator", "modernbert-large"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = *builtin_config(name);
    const ParamLayout layout(c);
    int64_t tables = 0;
    for (const ParamEntry& e : layout.entries())
      if (e.kind == ParamKind::Embedding) {
        tables += e.shape.numel();
        EXPECT_LE(e.offset + e.shape.numel(), layout.tables_end()) << e.name;
      }
    EXPECT_EQ(layout.tables_end(), tables);
    EXPECT_GE(tables, c.vocab_size * c.embedding_width());
    int64_t at = 0;
    for (const ParamRange& r : decay_ranges(layout)) {
      EXPECT_EQ(r.begin, at);
      EXPECT_TRUE(r.end <= layout.tables_end() || r.begin >= layout.tables_end()) << r.begin << ".." << r.end;
      at = r.end;
    }
    EXPECT_EQ(at, layout.count());
  }
}

}  // namespace
}  // namespace hone
