#pragma once
// Helpers shared by the tests: host buffers that own their memory, random fill,
// comparisons with a relative tolerance, temporary directories.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hone/backend.h"
#include "hone/config.h"
#include "hone/tensor.h"

namespace hone::test {

// A host tensor that owns its storage (tests only; the library never owns memory this way).
struct HostTensor {
  std::vector<std::byte> storage;
  Tensor t;
  HostTensor() = default;
  HostTensor(DType d, Shape s);
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  float* f() { return t.f32(); }
  int32_t* i() { return t.ptr<int32_t>(); }
  int64_t n() const { return t.numel(); }
};

// Uniform in [lo, hi) from a seeded generator.
void fill_uniform(HostTensor& h, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// New F32 host tensors: uniform random, or every element `value`.
HostTensor random(Shape s, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
HostTensor filled(Shape s, float value);
HostTensor clone(const HostTensor& h);  // a copy (HostTensor itself is move-only)
// A clip_coefficient output (F32 [kNormCoefSize]) with norm and coefficient `value` and no skip.
HostTensor norm_coef(float value);

// max |a - b| / max(|b|, floor) over all elements; the floor keeps near-zero
// references from dominating.
double max_rel_error(const float* a, const float* b, int64_t n, double floor = 1e-6);
// Relative error of the whole vector: ||a - b|| / ||b||.
double norm_rel_error(const float* a, const float* b, int64_t n);

// A fresh empty directory under the system temp dir, removed at destruction.
struct TempDir {
  std::string path;
  TempDir();
  ~TempDir();
};

std::string fixtures_dir();

// A model directory as transformers writes it (config.json, model.safetensors), with
// weights initialised from `seed`; returns dir.
std::string save_random_model(const std::string& dir, const ModelConfig& c, uint64_t seed);

// bert-tiny's configuration at this hidden and intermediate size, without dropout (the same
// function on any number of ranks), saved as save_random_model does; returns dir.
std::string save_dropout_free_tiny_model(const std::string& dir, int hidden, int intermediate);
// The "loss" of every line of output_dir/trainer_log.jsonl, in order.
std::vector<double> logged_losses(const std::string& output_dir);
// Every evaluation of a finished run in output_dir: those in trainer_state.json's history,
// then eval_results.json's (each as "key": value text, for the caller to parse).
std::vector<std::string> evaluations(const std::string& output_dir);

// Runs a shell command; its stdout and stderr together, and its exit code (-1 if it did
// not exit normally).
struct CommandResult {
  int code;
  std::string out;
};
CommandResult run_command(const std::string& cmd);
// The hone executable with these arguments, on one OpenMP thread.
CommandResult run_hone(const std::string& args);
// A Python helper script: skips the test (printing why) when it exits 77 (a package is
// missing) or python3 is not on PATH; otherwise expects exit 0 and prints its output.
#define HONE_EXPECT_PYTHON_CHECK(cmd)                                                    \
  do {                                                                                   \
    const ::hone::test::CommandResult r_ = ::hone::test::run_command(cmd);               \
    if (r_.code == 77) GTEST_SKIP() << r_.out;                                           \
    if (r_.code == 127) GTEST_SKIP() << "python3 is not on PATH: " << r_.out;            \
    EXPECT_EQ(r_.code, 0) << (cmd) << "\n" << r_.out;                                   \
    std::printf("%s", r_.out.c_str());                                                   \
  } while (0)

}  // namespace hone::test
