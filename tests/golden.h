#pragma once
// Parity with transformers on the golden fixtures, as checks any backend can run.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hone/backend.h"
#include "hone/config.h"
#include "hone/safetensors.h"
#include "hone/trainer.h"
#include "test_util.h"

namespace hone::test {

// One fixture directory: config.json, golden.safetensors, train_args.json.
struct Golden {
  std::string dir;
  ModelConfig config;
  SafetensorsFile file;
  nlohmann::json train_args;
  explicit Golden(const std::string& name)
      : dir(test::fixtures_dir() + "/" + name),
        config(ModelConfig::load(dir + "/config.json")),
        file(dir + "/golden.safetensors") {
    std::ifstream f(dir + "/train_args.json");
    train_args = nlohmann::json::parse(f);
  }
  std::vector<float> floats(const std::string& name) const {
    const SafetensorsEntry* e = file.find(name);
    EXPECT_NE(e, nullptr) << name;
    std::vector<float> v(size_t(e->numel()));
    file.read_f32(*e, v.data(), e->numel());
    return v;
  }
  std::vector<int32_t> ints(const std::string& name) const {
    std::vector<int32_t> out;
    for (float x : floats(name)) out.push_back(int32_t(x));
    return out;
  }
};

// The batch named `prefix` + field + `suffix`, and a run over it.
struct GoldenBatch {
  std::vector<int32_t> ids, mask, types;
  std::vector<float> labels;
  GoldenBatch(const Golden& g, const std::string& prefix, const std::string& suffix)
      : ids(g.ints(prefix + "input_ids" + suffix)),
        mask(g.ints(prefix + "attention_mask" + suffix)),
        types(g.ints(prefix + "token_type_ids" + suffix)),
        labels(g.floats(prefix + "labels" + suffix)) {}
  int batch() const { return int(labels.size()); }
  int seq() const { return int(ids.size() / labels.size()); }
};

inline TrainingArguments golden_args(const Golden& g, int batch) {
  TrainingArguments a;
  a.per_device_train_batch_size = batch;
  a.learning_rate = g.train_args["learning_rate"];
  a.weight_decay = g.train_args["weight_decay"];
  a.warmup_steps = g.train_args["warmup_steps"];
  a.max_grad_norm = g.train_args["max_grad_norm"];
  a.adam_beta1 = g.train_args["adam_beta1"];
  a.adam_beta2 = g.train_args["adam_beta2"];
  a.adam_epsilon = g.train_args["adam_epsilon"];
  a.max_steps = g.train_args["max_steps"];
  return a;
}


struct GoldenTolerances {
  double logits = 1e-5;  // max relative error of the logits
  double loss = 1e-5;    // relative error of the loss
  double grads = 1e-4;   // max error of each gradient over its tensor's largest value
  double steps = 1e-5;   // losses, gradient norms and final weights of three optimizer steps
  // Gradients that are zero in exact arithmetic (the key bias) hold rounding alone: their
  // error is measured against this fraction of the model's largest gradient instead.
  double zero_floor = 1e-6;
};

// Changes the fixture's training arguments before the run (e.g. to --bf16), and the run
// before its first step.
struct GoldenHooks {
  std::function<void(TrainingArguments&)> args;
  std::function<void(TrainingRun&)> run;
};

// Logits, loss and every parameter gradient of one batch.
void check_golden_forward_backward(const std::string& fixture, Backend& be, const GoldenTolerances& tol = {},
                                   const GoldenHooks& hooks = {});
// Three Trainer-style optimizer steps: losses, gradient norms, learning rates, final weights.
void check_golden_training(const std::string& fixture, Backend& be, const GoldenTolerances& tol = {},
                           GradientMemory grads = GradientMemory::Persistent, const GoldenHooks& hooks = {});

}  // namespace hone::test
