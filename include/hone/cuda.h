#pragma once
// The CUDA backend, when this build has one. Everything else in hone is device-agnostic.
#include <memory>
#include <string>

#include "hone/backend.h"

namespace hone {

struct CudaOptions {
  int device = 0;
  bool tf32 = false;  // TF32 tensor cores for fp32 matrix products (TrainingArguments.tf32)
  // Half-precision products of 2^30 multiply-adds or more time cuBLASLt's first candidates
  // on first use and keep the fastest; otherwise each takes the heuristic's first. Timing
  // loads every candidate's kernel, 0.1 s of a bert-large run, and gained 0.6% of a batch-32
  // step, nothing at batch 4 or in inference (H200, docs/BENCHMARKS.md): worth it only to
  // runs long enough (times_products, hone/trainer.h) and to a server's warm-up, before it answers.
  bool time_products = false;
};

// Whether this build has the CUDA backend and a GPU is usable; if not, `why` says why.
bool cuda_available(std::string* why);
// Whether --bf16 / --fp16 can run: a usable GPU (and a build with cuDNN when
// HONE_ATTENTION=cudnn selects its fused attention); if not, `why` says why.
bool mixed_precision_available(std::string* why);
// Throws hone::Error when cuda_available() is false.
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options);
// The products a prepared run makes: a training step's every kind, or inference's
// forward ones (`hone predict`, `hone serve`).
enum class PreparedWork { Training, Inference };
// Readies what a CUDA backend's first step would otherwise wait for, from any thread, so
// that `hone train`, `predict` and `serve` can do it while they read their inputs: the
// device's primary context and cuBLASLt's setup for each kind of product that `work` makes
// with `products` operands (each kind's first algorithm query took 4-110 ms; 0.10-0.13 s of
// bert-large's first training step). The next make_cuda_backend for `device` takes the
// handle. Best effort: a failing call ends it, and make_cuda_backend, which makes the same
// calls, reports the error.
void prepare_cuda(int device, DType products, bool tf32, PreparedWork work);

}  // namespace hone
