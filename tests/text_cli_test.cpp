// Fine-tuning on text files as a user runs it: train with evaluation, checkpoints and
// TensorBoard, then predict; and clear errors for bad data.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "hone/checkpoint.h"
#include "hone/distributed.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {
namespace fs = std::filesystem;

using Result = test::CommandResult;
const auto run = test::run_command;
const auto hone = test::run_hone;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::vector<std::string> kWords = {"the", "film", "was", "plot", "acting", "really", "quite", "good",
                                         "great", "bad", "awful", "fine", "."};

// A vocab.txt tokenizer directory and a small model whose vocabulary matches it.
struct TextSetup {
  test::TempDir dir;
  std::string tok, model;
  TextSetup() {
    tok = dir.path + "/tok";
    model = dir.path + "/model";
    fs::create_directories(tok);
    std::ofstream v(tok + "/vocab.txt");
    for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) v << s << "\n";
    for (const auto& w : kWords) v << w << "\n";
    v.close();
    ModelConfig c = *builtin_config("bert-tiny");
    c.vocab_size = 5 + int(kWords.size());
    c.hidden_size = 16;
    c.intermediate_size = 32;
    c.max_position_embeddings = 32;
    test::save_random_model(model, c, 1);
  }
  // Sentiment by the adjective: learnable from one token.
  std::string write(const std::string& name, int n, int offset) const {
    const std::string path = dir.path + "/" + name;
    std::ofstream f(path);
    for (int i = 0; i < n; ++i) {
      const int k = (i + offset) % 4;
      const char* adj[] = {"good", "great", "bad", "awful"};
      nlohmann::json j = {{"text", fmt::format("the {} was {} {} .", i % 2 ? "film" : "plot",
                                               i % 3 ? "really" : "quite", adj[k])},
                          {"label", k < 2 ? "positive" : "negative"}};
      f << j.dump() << "\n";
    }
    return path;
  }
};

TEST(TextTraining, TrainEvaluateCheckpointTensorBoardPredict) {
  TextSetup s;
  const std::string train = s.write("train.jsonl", 64, 0), dev = s.write("dev.jsonl", 16, 1),
                    out = s.dir.path + "/out";
  Result r = hone("train --model_name_or_path " + s.model + " --tokenizer_name " + s.tok + " --train_file " + train +
                  " --validation_file " + dev +
                  " --text_column text --max_seq_length 16 --per_device_train_batch_size 8 --learning_rate 3e-3"
                  " --num_train_epochs 3 --eval_strategy epoch --save_strategy epoch --save_total_limit 1"
                  " --load_best_model_at_end --metric_for_best_model accuracy --do_eval --logging_steps 4"
                  " --report_to tensorboard --dataloader_num_workers 2 --group_by_length --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "'eval_accuracy': ")) << r.out;
  EXPECT_TRUE(has(r.out, "loaded the best model from")) << r.out;

  // The final directory: the model with its label names, the tokenizer, the results.
  const ModelConfig c = ModelConfig::load(out + "/config.json");
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"negative", "positive"}));
  for (const char* f : {"model.safetensors", "vocab.txt", "tokenizer_config.json", "eval_results.json",
                        "train_results.json", "trainer_state.json", "training_args.json", "trainer_log.jsonl"})
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  std::ifstream ev(out + "/eval_results.json");
  const nlohmann::json e = nlohmann::json::parse(ev);
  for (const char* k : {"eval_loss", "eval_accuracy", "eval_f1", "eval_matthews_correlation"})
    EXPECT_TRUE(e.contains(k)) << k;
  // 3 epochs of 8 updates; one checkpoint per epoch, at most one kept besides the best.
  const auto cks = list_checkpoints(out);
  ASSERT_FALSE(cks.empty());
  EXPECT_LE(cks.size(), 2u);
  EXPECT_EQ(cks.back().first, 24);
  EXPECT_TRUE(fs::exists(cks.back().second + "/vocab.txt"));
  std::ifstream stf(out + "/trainer_state.json");
  const nlohmann::json st = nlohmann::json::parse(stf);
  ASSERT_FALSE(st["best_model_checkpoint"].is_null());
  int evals = 0;
  for (const auto& h : st["log_history"]) evals += h.contains("eval_accuracy");
  EXPECT_EQ(evals, 3);
  std::ifstream argf(out + "/training_args.json");
  const nlohmann::json args = nlohmann::json::parse(argf);
  EXPECT_EQ(args["do_eval"], true);
  EXPECT_EQ(args["dataloader_pin_memory"], true);
  EXPECT_EQ(args["eval_strategy"], "epoch");
  EXPECT_EQ(args["max_seq_length"], 16);
  EXPECT_EQ(args["learning_rate"], 3e-3);
  EXPECT_FALSE(args.contains("help"));

  // TensorBoard's own reader sees the logged scalars.
  const std::string check = std::string("python3 -c \"import sys\ntry:\n from tensorboard.backend.event_processing."
                                        "event_accumulator import EventAccumulator\nexcept ImportError:\n sys.exit(77)\n"
                                        "import glob\nf = glob.glob('") +
                            out + "/runs/*/events.out.tfevents.*')[0]\na = EventAccumulator(f)\na.Reload()\n"
                                  "print(' '.join(sorted(a.Tags()['scalars'])))\"";
  Result tb = run(check);
  if (tb.code == 77) {
    std::printf("[ SKIPPED part ] TensorBoard reading: the tensorboard Python package is not installed\n");
  } else {
    ASSERT_EQ(tb.code, 0) << tb.out;
    for (const char* tag : {"train/loss", "train/learning_rate", "eval/loss", "eval/accuracy"})
      EXPECT_TRUE(has(tb.out, tag)) << tag << " in " << tb.out;
  }

  // Predictions from the saved directory: one line per example, a known label, probabilities.
  const std::string test = s.write("test.jsonl", 10, 2);
  Result p = hone("predict --model_name_or_path " + out + " --test_file " + test +
                  " --text_column text --max_seq_length 16 --output_dir " + s.dir.path + "/pred");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("memory: planned"), std::string::npos) << p.out;  // the inference plan's bytes
  std::ifstream pf(s.dir.path + "/pred/predictions.jsonl");
  int lines = 0;
  for (std::string line; std::getline(pf, line); ++lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_TRUE(j["label"] == "positive" || j["label"] == "negative") << line;
    double sum = 0;
    for (double x : j["probabilities"]) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_EQ(j["logits"].size(), 2u);
  }
  EXPECT_EQ(lines, 10);
  EXPECT_TRUE(has(p.out, "'predict_accuracy': ")) << p.out;  // the test file has labels
  // Labels the model does not know: predictions without metrics, and a notice.
  std::ofstream(s.dir.path + "/other.jsonl") << R"({"text": "the plot was fine .", "label": "neutral"})" "\n";
  p = hone("predict --model_name_or_path " + out + " --test_file " + s.dir.path +
           "/other.jsonl --text_column text --output_dir " + s.dir.path + "/pred2");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_TRUE(has(p.out, "predicting without metrics")) << p.out;
  EXPECT_TRUE(has(p.out, "negative, positive")) << p.out;
  EXPECT_FALSE(has(p.out, "'predict_accuracy'")) << p.out;
}

// Numbers with a fraction make a regression; evaluation every 2 steps; a checkpoint only
// when the evaluation improves on the best MSE so far.
// Two ranks share each evaluation out and gather the logits: with a learning rate of 0
// (dropout then changes nothing) their metrics, during and after training, are one
// process's.
TEST(TextTraining, TwoRanksEvaluateAsOneProcess) {
  if (!have_mpi() || run("command -v mpiexec").code != 0) GTEST_SKIP() << "no MPI in this build or no mpiexec";
  TextSetup s;
  const std::string common = "train --model_name_or_path " + s.model + " --tokenizer_name " + s.tok +
                             " --train_file " + s.write("train.jsonl", 32, 0) + " --validation_file " +
                             s.write("dev.jsonl", 22, 1) +
                             " --text_column text --max_seq_length 16 --learning_rate 0 --num_train_epochs 2"
                             " --eval_strategy epoch --do_eval --per_device_eval_batch_size 4 --save_strategy no"
                             " --device cpu --output_dir " + s.dir.path;
  const Result one = hone(common + "/one --per_device_train_batch_size 8");
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = run(std::string(HONE_BINARY) + " launch --nproc_per_node 2 " + common +
                         "/two --per_device_train_batch_size 4");
  ASSERT_EQ(two.code, 0) << two.out;
  auto evals = [&](const std::string& out) {
    std::vector<nlohmann::json> e;
    for (const std::string& j : test::evaluations(s.dir.path + "/" + out)) e.push_back(nlohmann::json::parse(j));
    return e;
  };
  const std::vector<nlohmann::json> a = evals("one"), b = evals("two");
  ASSERT_EQ(a.size(), 3u);  // each epoch's, then the final one
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"eval_loss", "eval_accuracy", "eval_f1", "eval_matthews_correlation"})
      EXPECT_EQ(b[i][k].get<double>(), a[i][k].get<double>()) << k << ", evaluation " << i + 1;
}

TEST(TextTraining, RegressionWithStepEvaluationAndBestCheckpoints) {
  TextSetup s;
  auto write = [&](const std::string& name, int n) {
    std::ofstream f(s.dir.path + "/" + name);
    for (int i = 0; i < n; ++i)
      f << nlohmann::json{{"text", i % 2 ? "the film was great ." : "the plot was awful ."},
                          {"label", i % 2 ? 4.5 : 1.25}}.dump()
        << "\n";
    return s.dir.path + "/" + name;
  };
  const std::string train = write("train.jsonl", 32), dev = write("dev.jsonl", 8), out = s.dir.path + "/out";
  const std::string args = "train --model_name_or_path " + s.model + " --tokenizer_name " + s.tok +
                           " --train_file " + train + " --validation_file " + dev +
                           " --text_column text --per_device_train_batch_size 4 --max_steps 8 --learning_rate 1e-2"
                           " --eval_strategy steps --eval_steps 2 --save_strategy best --metric_for_best_model mse"
                           " --logging_steps 2 --output_dir " + out;
  // The model's classifier has two outputs; a regression needs one, as transformers says.
  Result r = hone(args);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "classifier.weight") && has(r.out, "--ignore_mismatched_sizes")) << r.out;
  r = hone(args + " --ignore_mismatched_sizes");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "initialised anew: ['classifier.weight', 'classifier.bias']")) << r.out;
  const ModelConfig c = ModelConfig::load(out + "/config.json");
  EXPECT_EQ(c.num_labels, 1);
  EXPECT_EQ(c.problem_type, "regression");
  std::ifstream stf(out + "/trainer_state.json");
  const nlohmann::json st = nlohmann::json::parse(stf);
  // Every evaluation, and a checkpoint exactly at each step whose MSE beat all before it.
  std::vector<int64_t> improved;
  double best = 1e300;
  for (const auto& h : st["log_history"]) {
    if (!h.contains("eval_mse")) continue;
    EXPECT_TRUE(h.contains("eval_pearson") && h.contains("eval_spearman"));
    if (h["eval_mse"].get<double>() < best) {
      best = h["eval_mse"].get<double>();
      improved.push_back(h["step"].get<int64_t>());
    }
  }
  ASSERT_FALSE(improved.empty());
  std::vector<int64_t> saved;
  for (const auto& [step, path] : list_checkpoints(out)) saved.push_back(step);
  EXPECT_EQ(saved, improved);
  EXPECT_EQ(st["best_metric"].get<double>(), best);
  EXPECT_EQ(st["best_model_checkpoint"], checkpoint_path(out, improved.back()));
}

TEST(TextTraining, BadDataIsAClearErrorWithTheLine) {
  TextSetup s;
  const std::string train = s.write("train.jsonl", 8, 0), dev = s.dir.path + "/dev.jsonl";
  std::ofstream(dev) << R"({"text": "the film was good .", "label": "positive"})" "\n"
                     << R"({"text": "the plot was fine .", "label": "neutral"})" "\n";
  const std::string base = "train --model_name_or_path " + s.model + " --tokenizer_name " + s.tok +
                           " --text_column text --max_steps 1 --output_dir " + s.dir.path + "/out --train_file ";
  Result r = hone(base + train + " --validation_file " + dev + " --do_eval");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "dev.jsonl:2")) << r.out;
  EXPECT_TRUE(has(r.out, "neutral")) << r.out;
  r = hone(base + train + " --text_column sentence");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "sentence")) << r.out;
  r = hone(base + train + " --do_eval");  // evaluation without a validation file
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "--validation_file")) << r.out;
}

// Sets element `index` of an F32 tensor of a safetensors file, in place.
void set_weight(const std::string& path, const std::string& tensor, int64_t index, float value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const nlohmann::json h = nlohmann::json::parse(header);
  ASSERT_EQ(h.at(tensor).at("dtype"), "F32");
  f.seekp(std::streamoff(8 + n + h.at(tensor).at("data_offsets")[0].get<uint64_t>() + uint64_t(index) * 4));
  f.write(reinterpret_cast<const char*>(&value), 4);
  ASSERT_TRUE(f.good()) << path;
}

// A NaN in one weight is an error as the file loads, naming the file, the tensor and the
// element, for predict, for train (not a divergence blamed on the learning rate) and
// for a resumed checkpoint.
TEST(TextTraining, PoisonedWeightsAreAnErrorNamingTheTensor) {
  TextSetup s;
  const std::string bad = s.dir.path + "/bad", test = s.write("test.jsonl", 4, 0), train = s.write("train.jsonl", 8, 0);
  fs::copy(s.model, bad);
  // hidden 16: element 37 of a [16, 16] matrix is row 2, column 5.
  set_weight(bad + "/model.safetensors", "bert.encoder.layer.1.attention.output.dense.weight", 37, std::nanf(""));
  Result r = hone("predict --model_name_or_path " + bad + " --tokenizer_name " + s.tok + " --test_file " + test +
                  " --text_column text --output_dir " + s.dir.path + "/pred");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "hone: error: " + bad + "/model.safetensors: ")) << r.out;
  EXPECT_TRUE(has(r.out, "'bert.encoder.layer.1.attention.output.dense.weight'")) << r.out;
  EXPECT_TRUE(has(r.out, "NaN at [2, 5]")) << r.out;
  EXPECT_FALSE(fs::exists(s.dir.path + "/pred/predictions.jsonl"));
  const std::string base = "train --tokenizer_name " + s.tok + " --train_file " + train +
                           " --text_column text --per_device_train_batch_size 4 --output_dir " + s.dir.path + "/out";
  r = hone(base + " --max_steps 1 --model_name_or_path " + bad);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "'bert.encoder.layer.1.attention.output.dense.weight'")) << r.out;
  EXPECT_FALSE(has(r.out, "learning_rate")) << r.out;

  // A checkpoint's weights go through the same check when a run resumes from it.
  r = hone(base + " --max_steps 2 --save_steps 1 --model_name_or_path " + s.model);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ck = checkpoint_path(s.dir.path + "/out", 1);
  set_weight(ck + "/model.safetensors", "classifier.bias", 1, std::numeric_limits<float>::infinity());
  r = hone(base + " --max_steps 2 --save_steps 1 --model_name_or_path " + s.model + " --resume_from_checkpoint " + ck);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, ck + "/model.safetensors: tensor 'classifier.bias' holds +inf at [1]")) << r.out;
}

// Weights that load finite can still overflow on an input: predict names the row's line
// and writes nothing, rather than a file of null probabilities.
TEST(TextTraining, PredictNeverWritesANonFiniteResult) {
  TextSetup s;
  const std::string big = s.dir.path + "/big", test = s.dir.path + "/test.jsonl", pred = s.dir.path + "/pred";
  fs::copy(s.model, big);
  // tanh saturates to 1 in every pooler output; 16 x 3e38 overflows the first logit.
  for (int i = 0; i < 16; ++i) {
    set_weight(big + "/model.safetensors", "bert.pooler.dense.bias", i, 1e30f);
    set_weight(big + "/model.safetensors", "classifier.weight", i, 3e38f);
  }
  std::ofstream(test) << "\n" << R"({"text": "the film was good ."})" "\n" << R"({"text": "bad ."})" "\n";
  Result r = hone("predict --model_name_or_path " + big + " --tokenizer_name " + s.tok + " --test_file " + test +
                  " --text_column text --output_dir " + pred);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "hone: error: " + test + ":2: ")) << r.out;  // line 1 is blank
  EXPECT_TRUE(has(r.out, "not finite")) << r.out;
  EXPECT_TRUE(has(r.out, "inf")) << r.out;
  EXPECT_FALSE(fs::exists(pred + "/predictions.jsonl"));
  // The model as it was predicts.
  r = hone("predict --model_name_or_path " + s.model + " --tokenizer_name " + s.tok + " --test_file " + test +
           " --text_column text --output_dir " + pred);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(pred + "/predictions.jsonl"));
}

// Text files with bytes that are no text, labels of two kinds, or one class: errors
// naming the file, the line and the column, from the command line.
TEST(TextTraining, BadTextFilesNameTheFileLineAndColumn) {
  TextSetup s;
  const std::string base = "train --model_name_or_path " + s.model + " --tokenizer_name " + s.tok +
                           " --text_column text --max_steps 1 --output_dir " + s.dir.path + "/out --train_file ";
  auto file = [&](const std::string& name, const std::string& content) {
    std::ofstream(s.dir.path + "/" + name, std::ios::binary) << content;
    return s.dir.path + "/" + name;
  };
  using namespace std::string_literals;
  Result r = hone(base + file("nul.csv", "text,label\nthe film was good .,pos\nthe fi\0lm,neg\n"s));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "nul.csv:3: column 1 (\"text\"), byte 7 of the field: a NUL byte")) << r.out;
  r = hone(base + file("latin1.tsv", "label\ttext\npos\tthe film was good .\nneg\tcaf\xE9 .\n"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "latin1.tsv:3: column 2 (\"text\"), byte 4 of the field: invalid UTF-8 (0xe9)")) << r.out;
  r = hone(base + file("mixed.csv", "text,label\ngood .,pos\nbad .,neg\nfine .,1\nawful .,neg\n"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "mixed.csv:4: the label \"1\" is a number, but column \"label\" holds class names")) << r.out;
  EXPECT_TRUE(has(r.out, "\"pos\" on line 2")) << r.out;
  r = hone(base + file("one.jsonl", R"({"text": "good .", "label": "pos"})" "\n" R"({"text": "great .", "label": "pos"})"
                                    "\n"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "one.jsonl: every label in column \"label\" is \"pos\": the data has one class")) << r.out;
  EXPECT_FALSE(has(r.out, "classifier.weight")) << r.out;
  // For a regression model, integer labels all alike are its targets.
  ModelConfig c = ModelConfig::load(s.model + "/config.json");
  c.num_labels = 1;
  c.id2label = {"LABEL_0"};
  c.problem_type = "regression";
  const std::string reg = test::save_random_model(s.dir.path + "/reg", c, 2);
  r = hone("train --model_name_or_path " + reg + " --tokenizer_name " + s.tok +
           " --text_column text --max_steps 1 --output_dir " + s.dir.path + "/reg_out --train_file " +
           file("three.csv", "text,label\ngood .,3\nbad .,3\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "regression targets")) << r.out;
  EXPECT_EQ(ModelConfig::load(s.dir.path + "/reg_out/config.json").problem_type, "regression");
}

TEST(TextTraining, ResumeFromLastContinuesTheRun) {
  TextSetup s;
  const std::string train = s.write("train.jsonl", 32, 0), out = s.dir.path + "/out";
  const std::string base = "train --model_name_or_path " + s.model + " --tokenizer_name " + s.tok +
                           " --train_file " + train + " --text_column text --per_device_train_batch_size 4"
                           " --num_train_epochs 2 --save_steps 5 --logging_steps 2 --output_dir " + out;
  Result first = hone(base);
  ASSERT_EQ(first.code, 0) << first.out;
  Result again = hone(base + " --resume_from_checkpoint " + checkpoint_path(out, 10));
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(has(again.out, "resumed from")) << again.out;
  EXPECT_TRUE(has(again.out, "at step 10")) << again.out;
}

}  // namespace
}  // namespace hone
