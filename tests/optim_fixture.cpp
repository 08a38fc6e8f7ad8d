#include "optim_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hone/model.h"
#include "hone/ops.h"
#include "test_util.h"

namespace hone::test {
namespace {

// A fixture entry per parameter, gathered into hone's flat layout.
std::vector<float> gather(const SafetensorsFile& file, const ParamLayout& layout, const std::string& prefix) {
  std::vector<float> flat(size_t(layout.count()));
  for (const ParamEntry& e : layout.entries()) {
    const SafetensorsEntry* s = file.find(prefix + e.name);
    if (!s) throw std::runtime_error(file.path() + ": no " + prefix + e.name);
    file.read_f32(*s, flat.data() + e.offset, e.shape.numel());
  }
  return flat;
}

TrainingArguments fixture_args(const std::string& json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text);
  std::vector<std::string> argv;
  for (const auto& [key, value] : j.items()) {
    argv.push_back("--" + key);
    argv.push_back(value.is_string() ? value.get<std::string>() : value.dump());
  }
  return parse_training_arguments(argv);
}

}  // namespace

OptimFixture::OptimFixture(const std::string& name)
    : dir(fixtures_dir() + "/optim/" + name), config(ModelConfig::load(dir + "/config.json")) {
  SafetensorsFile file(dir + "/steps.safetensors");
  args = fixture_args(file.metadata().at("args"));
  steps = std::stoi(file.metadata().at("steps"));
  lr.resize(size_t(steps));
  file.read_f32(*file.find("lr"), lr.data(), steps);
  const ParamLayout layout(config);
  init = gather(file, layout, "init.");
  for (int k = 0; k < steps; ++k) {
    grads.push_back(gather(file, layout, "grad." + std::to_string(k) + "."));
    after.push_back(gather(file, layout, "step." + std::to_string(k) + "."));
  }
}

std::vector<std::vector<float>> replay_optim_fixture(const OptimFixture& f, Backend& be) {
  const ParamLayout layout(f.config);
  std::unique_ptr<Optimizer> opt = make_optimizer(f.args);
  Tensor params, sumsq, norm_coef, scalars;
  std::vector<Tensor> grads;
  // Setup and one update, planned by running them against a planner, then served.
  auto setup = [&](BufferSource& mem) {
    mem.begin_phase(Phase::Setup);
    params = mem.take(Category::Weights, "parameters", -1, DType::F32, {layout.count()});
    grads.clear();
    for (size_t k = 0; k < layout.groups().size(); ++k)
      grads.push_back(mem.take(Category::Gradients, "group_grads", int(k), DType::F32, {layout.groups()[k].size()}));
    sumsq = mem.take(Category::Workspace, "sumsq", -1, DType::F32, {1});
    norm_coef = mem.take(Category::Workspace, "norm_coef", -1, DType::F32, {kNormCoefSize});
    scalars = mem.take(Category::Workspace, "scalars", -1, DType::F32, {kOptimizerScalarsSize});
    opt->take_state(mem, layout);
    mem.end_phase();
  };
  auto update = [&](BufferSource& mem) {
    mem.begin_phase(Phase::OptimizerStep);
    ops::fill(be, sumsq, 0.0f);
    ops::sum_squares(be, grads.data(), int(grads.size()), sumsq);
    ops::clip_coefficient(be, sumsq, float(f.args.max_grad_norm), norm_coef);
    opt->update(be, mem, OptimizerTarget{layout, params, Tensor{}, grads, norm_coef, scalars});
    mem.end_phase();
  };
  MemoryPlanner planner;
  be.dry_run = true;
  setup(planner);
  update(planner);
  be.dry_run = false;
  PlannedMemory mem(planner.finish(), be);
  setup(mem);
  opt->reset_state(be);

  auto upload = [&](const std::vector<float>& host, int64_t at, Tensor dst) {
    ops::copy(be, Tensor{const_cast<float*>(host.data()) + at, DType::F32, dst.shape, Device::CPU}, dst);
  };
  upload(f.init, 0, params);
  std::vector<std::vector<float>> out;
  for (int k = 0; k < f.steps; ++k) {
    for (size_t g = 0; g < grads.size(); ++g) upload(f.grads[size_t(k)], layout.groups()[g].begin, grads[g]);
    std::vector<float> host(kOptimizerScalarsSize, 0.0f);
    opt->scalars(f.lr[size_t(k)], k + 1, host.data());
    upload(host, 0, scalars);
    update(mem);
    std::vector<float> p(size_t(layout.count()));
    Tensor dst{p.data(), DType::F32, params.shape, Device::CPU};
    ops::copy(be, params, dst);
    be.synchronize();
    out.push_back(std::move(p));
  }
  return out;
}

double worst_param_error(const OptimFixture& f, const std::vector<float>& got, const std::vector<float>& want) {
  const ParamLayout layout(f.config);
  double worst = 0;
  std::string where;
  for (const ParamEntry& e : layout.entries()) {
    const float* a = got.data() + e.offset;
    const float* b = want.data() + e.offset;
    const int64_t n = e.shape.numel();
    double scale = 0, err = 0;
    for (int64_t i = 0; i < n; ++i) scale = std::max(scale, double(std::fabs(b[i])));
    for (int64_t i = 0; i < n; ++i) err = std::max(err, std::fabs(double(a[i]) - b[i]));
    const double rel = err / std::max(scale, 1e-12);
    if (rel > worst) worst = rel, where = e.name;
  }
  if (!where.empty()) std::cout << "  worst: " << where << " " << worst << "\n";
  return worst;
}

}  // namespace hone::test
