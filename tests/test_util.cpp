#include "test_util.h"

#include "hone/weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace hone::test {

HostTensor::HostTensor(DType d, Shape s) : storage(size_t(s.numel()) * dtype_size(d)) {
  t = Tensor{storage.data(), d, s, Device::CPU};
}

void fill_uniform(HostTensor& h, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < h.n(); ++i) h.f()[i] = u(g);
}

HostTensor random(Shape s, uint64_t seed, float lo, float hi) {
  HostTensor h(DType::F32, s);
  fill_uniform(h, seed, lo, hi);
  return h;
}

HostTensor filled(Shape s, float value) {
  HostTensor h(DType::F32, s);
  std::fill(h.f(), h.f() + h.n(), value);
  return h;
}

HostTensor clone(const HostTensor& h) {
  HostTensor c(h.t.dtype, h.t.shape);
  c.storage = h.storage;
  return c;
}

HostTensor norm_coef(float value) {
  HostTensor h = filled({kNormCoefSize}, value);
  h.f()[2] = 0.0f;
  return h;
}

double max_rel_error(const float* a, const float* b, int64_t n, double floor) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), floor));
  return worst;
}

double norm_rel_error(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

TempDir::TempDir() {
  static int counter = 0;
  auto base = std::filesystem::temp_directory_path();
  for (;;) {
    auto p = base / ("hone-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    if (std::filesystem::create_directory(p)) {
      path = p.string();
      return;
    }
  }
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string fixtures_dir() { return HONE_FIXTURES_DIR; }

std::string save_random_model(const std::string& dir, const ModelConfig& c, uint64_t seed) {
  ParamLayout layout(c);
  std::vector<float> w(size_t(layout.count()));
  init_weights(c, layout, w.data(), seed);
  save_pretrained(dir, c, layout, w.data());
  return dir;
}

std::string save_dropout_free_tiny_model(const std::string& dir, int hidden, int intermediate) {
  ModelConfig c = *builtin_config("bert-tiny");
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.max_position_embeddings = 64;
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  return save_random_model(dir, c, 1);
}

std::vector<double> logged_losses(const std::string& output_dir) {
  std::vector<double> losses;
  std::ifstream log(output_dir + "/trainer_log.jsonl");
  for (std::string line; std::getline(log, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.contains("loss")) losses.push_back(e["loss"].get<double>());
  }
  return losses;
}

std::vector<std::string> evaluations(const std::string& output_dir) {
  std::vector<std::string> out;
  std::ifstream f(output_dir + "/trainer_state.json");
  const nlohmann::json state = nlohmann::json::parse(f);
  for (const auto& h : state["log_history"])
    if (h.contains("eval_loss")) out.push_back(h.dump());
  std::ifstream last(output_dir + "/eval_results.json");
  out.push_back(nlohmann::json::parse(last).dump());
  return out;
}

CommandResult run_command(const std::string& cmd) {
  std::FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

CommandResult run_hone(const std::string& args) {
  return run_command(std::string("OMP_NUM_THREADS=1 ") + HONE_BINARY + " " + args);
}

}  // namespace hone::test
