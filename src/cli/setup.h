#pragma once
// What `train`, `estimate` and `predict` share: the model, the backend, and for text
// data the tokenizer, the label set (written into config.json) and the datasets.
#include <future>
#include <memory>
#include <string>

#include "hone/args.h"
#include "hone/backend.h"
#include "hone/cuda.h"
#include "hone/data.h"
#include "hone/tokenizer.h"
#include "hone/weights.h"

namespace hone::cli {

// --device auto takes the GPU when there is one. --bf16 / --fp16 need one, unless the
// backend only plans (hone estimate).
// device: the GPU's index (a rank's local rank). time_products: CudaOptions::time_products.
std::unique_ptr<Backend> make_backend(const TrainingArguments& a, bool plan_only = false, int device = 0,
                                      bool time_products = false);
// Whether make_backend will take a GPU.
bool wants_gpu(const TrainingArguments& a);
// When make_backend will take GPU `device`: prepare_cuda (hone/cuda.h) on another thread,
// which the caller waits for (get) before make_backend, having read its inputs meanwhile.
// Otherwise a future without a state.
std::future<void> prepare_gpu(const TrainingArguments& a, int device, PreparedWork work);

// "fp32", "tf32", "bf16" or "fp16": what the matrix products run in (peak_flops' names).
std::string precision_name(const TrainingArguments& a);

struct RunInputs {
  ModelSource model;  // its config carries the run's labels
  std::shared_ptr<const Tokenizer> tokenizer;  // null for synthetic data
  LabelSpace labels;
  std::unique_ptr<Dataset> train, eval, test;           // those the arguments name
  bool test_has_labels = false;
  int seq_len = 0;                                      // the longest sequence of the run
};

// Reads what the arguments name. With text files, the label set comes from the model's
// config.json when it names its labels (a fine-tuned model), else from the training
// file, and the config is updated to it.
RunInputs prepare_inputs(const TrainingArguments& a, bool read_train, bool read_eval, bool read_test);
// A trained model with its tokenizer and labels, and no data (hone serve).
RunInputs prepare_model(const TrainingArguments& a);

}  // namespace hone::cli
