#pragma once
// Optimizer fixtures (tools/make_optimizer_fixtures.py) replayed through hone's Optimizer
// on any backend: the same parameters, gradients and learning rates as the library
// Trainer built, clipped by hone's own clip_coefficient, updated by make_optimizer.
#include <string>
#include <vector>

#include "hone/backend.h"
#include "hone/config.h"
#include "hone/optimizer.h"
#include "hone/safetensors.h"

namespace hone::test {

struct OptimFixture {
  std::string dir;
  ModelConfig config;
  TrainingArguments args;  // the flags the fixture's Trainer was given
  int steps = 0;
  std::vector<float> lr;   // of each update
  // Flat, in hone's parameter layout: the parameters before, each update's gradients,
  // the parameters after each update.
  std::vector<float> init;
  std::vector<std::vector<float>> grads, after;
  explicit OptimFixture(const std::string& name);  // a directory under tests/fixtures/optim
};

// Runs the fixture's updates on `be` (a fresh optimizer, state reset, no mixed precision)
// and returns the parameters after each update, flat in hone's layout.
std::vector<std::vector<float>> replay_optim_fixture(const OptimFixture& f, Backend& be);

// Max over parameters of max |a - b| / (max |b| of that parameter); prints the worst
// parameter.
double worst_param_error(const OptimFixture& f, const std::vector<float>& got, const std::vector<float>& want);

}  // namespace hone::test
