// The hone executable as a user runs it: outputs, files, and clear errors with a
// non-zero exit for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/safetensors.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

using Result = test::CommandResult;
const auto hone = test::run_hone;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A small model directory as transformers would write it.
std::string write_model(const std::string& dir, int vocab = 30522) {
  ModelConfig c = *builtin_config("bert-tiny");
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.max_position_embeddings = 64;
  return test::save_random_model(dir, c, 1);
}

TEST(Cli, TrainsAndWritesWhatTrainerWrites) {
  test::TempDir tmp;
  const std::string model = write_model(tmp.path + "/model"), out = tmp.path + "/out";
  Result r = hone("train --model_name_or_path " + model +
                  " --dataset synthetic:16x16 --per_device_train_batch_size 4 --num_train_epochs 1 --logging_steps 2"
                  " --output_dir " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key : {"'train_runtime': ", "'train_samples_per_second': ", "'train_steps_per_second': ",
                          "'train_loss': ", "'epoch': 1.0}", "'grad_norm': ", "'learning_rate': "})
    EXPECT_TRUE(has(r.out, key)) << key << "\n" << r.out;
  std::ifstream results(out + "/train_results.json");
  nlohmann::json j = nlohmann::json::parse(results);
  EXPECT_EQ(j["epoch"], 1.0);
  EXPECT_GT(j["train_samples_per_second"].get<double>(), 0);
  // Where the process's time went: phases in order, each mark at or after the one before,
  // training at least its train_runtime.
  const nlohmann::ordered_json t =
      nlohmann::ordered_json::parse(std::ifstream(out + "/train_results.json"))["process_seconds"];
  std::vector<std::string> phases;
  double before = 0;
  for (const auto& [phase, at] : t.items()) {
    phases.push_back(phase);
    EXPECT_GE(at.get<double>(), before) << phase;
    before = at.get<double>();
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"inputs", "backend", "memory_plan", "weights_load", "weights_upload",
                                              "train", "save"}));
  EXPECT_GE(t["train"].get<double>() - t["weights_upload"].get<double>(), j["train_runtime"].get<double>() - 1e-3);
  EXPECT_TRUE(has(r.out, "process: inputs ")) << r.out;
  std::ifstream log(out + "/trainer_log.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line); ++lines) EXPECT_TRUE(nlohmann::json::parse(line).contains("loss"));
  EXPECT_EQ(lines, 2);  // 4 updates, logged every 2
  SafetensorsFile saved(out + "/model.safetensors");
  EXPECT_NE(saved.find("classifier.weight"), nullptr);
  EXPECT_EQ(ModelConfig::load(out + "/config.json").hidden_size, 32);
  EXPECT_TRUE(has(r.out, "memory anatomy")) << r.out;
}

// Merges `changes` into the config.json of the model directory `dir`; returns dir.
std::string edit_config(const std::string& dir, const nlohmann::json& changes) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  j.update(changes);
  std::ofstream(dir + "/config.json") << j.dump(2);
  return dir;
}

// Rewrites the model.safetensors of `dir` without the parameter `left_out`; returns dir.
std::string drop_tensor(const std::string& dir, const std::string& left_out) {
  const ModelConfig c = ModelConfig::load(dir + "/config.json");
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), 1);
  std::vector<NamedTensor> tensors;
  for (const ParamEntry& e : layout.entries())
    if (e.name != left_out) tensors.push_back({e.name, Tensor{w.data() + e.offset, DType::F32, e.shape, Device::CPU}});
  write_safetensors(dir + "/model.safetensors", tensors);
  return dir;
}

TEST(Cli, EstimatePrintsTheAnatomyOfTheSeedRun) {
  Result r = hone("estimate --model_name_or_path bert-large-uncased --per_device_train_batch_size 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "parameters: 335,143,938")) << r.out;
  for (const char* c : {"weights", "gradients", "optimizer state", "activations", "workspace", "total", "bytes/param"})
    EXPECT_TRUE(has(r.out, c)) << c << "\n" << r.out;
  EXPECT_TRUE(has(r.out, "batch 4 x 512 tokens")) << r.out;
}

// A bf16 run's plan, made anywhere (the CPU only plans it): fp32 master weights, the
// half-precision copy the model reads, and activations at 2 bytes.
TEST(Cli, EstimatePlansMixedPrecision) {
  Result fp32 = hone("estimate --model_name_or_path bert-large-uncased --per_device_train_batch_size 4 --device cpu");
  Result bf16 =
      hone("estimate --model_name_or_path bert-large-uncased --per_device_train_batch_size 4 --device cpu --bf16");
  ASSERT_EQ(fp32.code, 0) << fp32.out;
  ASSERT_EQ(bf16.code, 0) << bf16.out;
  EXPECT_FALSE(has(fp32.out, "master weights")) << fp32.out;
  EXPECT_TRUE(has(bf16.out, "master weights")) << bf16.out;
  EXPECT_TRUE(has(bf16.out, "bf16")) << bf16.out;
  // 335,143,938 parameters: 4 bytes each as master weights, 2 as the bf16 copy of all but
  // the 31,780,864 of the embedding tables, which the lookup reads from the master weights
  // (each rounded up to the 256-byte buffer alignment).
  EXPECT_TRUE(has(bf16.out, "1,340,576,000")) << bf16.out;
  EXPECT_TRUE(has(bf16.out, "606,726,400")) << bf16.out;
}

// --config_name replaces the model's configuration, as in transformers' example scripts:
// the run and the config.json it saves use it, and weights that do not fit it are refused.
TEST(Cli, ConfigNameReplacesTheModelsConfiguration) {
  test::TempDir tmp;
  const std::string model = write_model(tmp.path + "/model");
  ModelConfig tanh = ModelConfig::load(model + "/config.json");
  tanh.hidden_act = "gelu_pytorch_tanh";
  std::filesystem::create_directories(tmp.path + "/tanh");
  tanh.save(tmp.path + "/tanh/config.json");
  int run = 0;
  for (const std::string& config : {tmp.path + "/tanh", tmp.path + "/tanh/config.json"}) {
    const std::string out = tmp.path + "/out" + std::to_string(run++);
    Result r = hone("train --model_name_or_path " + model + " --config_name " + config +
                    " --dataset synthetic:8x16 --per_device_train_batch_size 4 --output_dir " + out);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(ModelConfig::load(out + "/config.json").hidden_act, "gelu_pytorch_tanh") << config;
  }
  const std::string out = tmp.path + "/out_refused";
  Result wide = hone("train --model_name_or_path " + model + " --config_name bert-tiny --dataset synthetic:8x16" +
                     " --output_dir " + out);
  EXPECT_NE(wide.code, 0);
  EXPECT_TRUE(has(wide.out, "--ignore_mismatched_sizes")) << wide.out;
  Result missing = hone("train --config_name " + tmp.path + "/nothing --output_dir " + out);
  EXPECT_NE(missing.code, 0);
  EXPECT_TRUE(has(missing.out, "--config_name " + tmp.path + "/nothing: no such file or directory")) << missing.out;
}

// On the CPU, --fp16 is refused; --bf16 rounds the products' operands where the build has
// oneDNN and is refused, naming it, where it has not; `hone env` says which.
TEST(Cli, CpuHalfPrecisionIsBf16ProductsOrAClearRefusal) {
  test::TempDir tmp;
  Result fp16 = hone("train --model_name_or_path bert-tiny --dataset synthetic:8x16 --device cpu --fp16 --output_dir " +
                     tmp.path + "/fp16");
  EXPECT_NE(fp16.code, 0);
  EXPECT_TRUE(has(fp16.out, "--fp16 needs a CUDA GPU")) << fp16.out;
  Result bf16 = hone("train --model_name_or_path bert-tiny --dataset synthetic:8x16 --device cpu --bf16 "
                     "--save_strategy no --output_dir " + tmp.path + "/bf16");
  std::string why;
  const bool available = cpu_bf16_products_available(&why);
  Result env = hone("env");  // says the same
  EXPECT_TRUE(has(env.out, std::string("CPU bf16 products (--bf16 --device cpu): ") + (available ? "oneDNN" : why)))
      << env.out;
  if (!available) {
    EXPECT_NE(bf16.code, 0);
    EXPECT_TRUE(has(bf16.out, "--bf16 on the CPU: " + why)) << bf16.out;
    return;
  }
  EXPECT_EQ(bf16.code, 0) << bf16.out;
  EXPECT_TRUE(has(bf16.out, "bf16 products, fp32 otherwise")) << bf16.out;
}

TEST(Cli, BadInputIsAClearErrorAndANonZeroExit) {
  test::TempDir tmp;
  struct Case {
    std::string args, message;
  };
  const std::string small = write_model(tmp.path + "/small_vocab", 101);
  const std::string broken = write_model(tmp.path + "/broken");
  std::filesystem::resize_file(broken + "/model.safetensors", 100);  // truncated
  std::filesystem::create_directories(tmp.path + "/bad_json");
  std::ofstream(tmp.path + "/bad_json/config.json") << "{\"hidden_size\": 32,";
  // What transformers would load as BERT, with a warning or new weights, and hone refuses.
  const std::string no_heads = edit_config(write_model(tmp.path + "/no_heads"), {{"num_attention_heads", 0}});
  const std::string no_layers = edit_config(write_model(tmp.path + "/no_layers"), {{"num_hidden_layers", -1}});
  const std::string gpt2 = edit_config(write_model(tmp.path + "/gpt2"), {{"model_type", "gpt2"}});
  const std::string key = "bert.encoder.layer.1.attention.self.key.weight";
  const std::string holed = drop_tensor(write_model(tmp.path + "/holed"), key);
  const std::string out = " --output_dir " + tmp.path + "/out";
  std::vector<Case> cases{
           {"train --per_device_batch_size 4", "per_device_batch_size"},
           {"train --per_device_train_batch_size 0", "--per_device_train_batch_size"},
           {"train --learning_rate nan", "--learning_rate"},
           {"train --optim galore_adamw", "galore_adamw"},
           {"train --dataset foo", "synthetic:NxL"},
           {"train --model_name_or_path no-such-model", "bert-large-uncased"},
           {"train --model_name_or_path " + small + " --dataset synthetic:8x8" + out, "vocab_size"},
           {"train --model_name_or_path " + broken + " --dataset synthetic:8x8" + out, "model.safetensors"},
           {"train --model_name_or_path " + tmp.path + "/bad_json" + out, "config.json"},
           {"train --model_name_or_path bert-tiny --dataset synthetic:8x1024" + out, "max_position_embeddings"},
           {"train --model_name_or_path " + no_heads + " --dataset synthetic:8x8" + out,
            no_heads + "/config.json: num_attention_heads must be >= 1, got 0"},
           {"train --model_name_or_path " + no_layers + " --dataset synthetic:8x8" + out,
            no_layers + "/config.json: num_hidden_layers must be in [1, 1364], got -1"},
           {"train --model_name_or_path " + gpt2 + " --dataset synthetic:8x8" + out,
            gpt2 + "/config.json: model_type \"gpt2\" is not one hone implements (hone has: \"bert\", \"roberta\", \"xlm-roberta\", \"distilbert\", \"electra\", \"modernbert\")"},
           {"train --model_name_or_path " + holed + " --dataset synthetic:8x8" + out,
            holed + "/model.safetensors: lacks 1 of the model's 37 embedding and encoder tensors ('" + key + "')"},
       };
  if (!cuda_available(nullptr)) cases.push_back({"estimate --device cuda", "CUDA"});  // no GPU here: refused
  for (const Case& c : cases) {
    Result r = hone(c.args);
    EXPECT_NE(r.code, 0) << c.args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, c.message)) << c.args << "\n" << r.out;
    EXPECT_FALSE(has(r.out, "internal error")) << c.args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace hone

namespace hone {
namespace {

TEST(CliFit, EstimateListsTheConfigurationsThatFitABudget) {
  Result r = test::run_hone("estimate --model_name_or_path bert-base-uncased --dataset synthetic:64x512 "
                            "--per_device_train_batch_size 32 --device cpu --memory_budget 8GB");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "configurations with 32 samples per update that fit 8GB")) << r.out;
  EXPECT_TRUE(has(r.out, "1.00x")) << r.out;
  EXPECT_TRUE(has(r.out, "checkpointing full")) << r.out;
  Result tiny = test::run_hone("estimate --model_name_or_path bert-large-uncased --dataset synthetic:64x512 --device "
                               "cpu --memory_budget 100MB");
  ASSERT_EQ(tiny.code, 0) << tiny.out;
  EXPECT_TRUE(has(tiny.out, "none: not even batch 1 fits")) << tiny.out;
  Result bad = test::run_hone("estimate --device cpu --memory_budget lots");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(has(bad.out, "memory size 'lots'")) << bad.out;
}

TEST(CliFit, AutoFindBatchSizeSaysWhatItDoesOnTheCpu) {
  test::TempDir tmp;
  Result r = test::run_hone("train --model_name_or_path bert-tiny --dataset synthetic:8x16 --device cpu "
                            "--per_device_train_batch_size 4 --num_train_epochs 1 --auto_find_batch_size "
                            "--save_strategy no --output_dir " + tmp.path);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "--auto_find_batch_size sizes the batch for GPU memory")) << r.out;
}

}  // namespace
}  // namespace hone
