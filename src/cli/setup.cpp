#include "cli/setup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <omp.h>

#include "hone/cpu_backend.h"
#include "hone/cuda.h"

namespace hone::cli {

bool wants_gpu(const TrainingArguments& a) {
  return a.device == "cuda" || (a.device == "auto" && cuda_available(nullptr));
}

std::future<void> prepare_gpu(const TrainingArguments& a, int device, PreparedWork work) {
  if (!wants_gpu(a)) return {};
  return std::async(std::launch::async, prepare_cuda, device, compute_dtype(a), a.tf32, work);
}

std::unique_ptr<Backend> make_backend(const TrainingArguments& a, bool plan_only, int device, bool time_products) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  std::string why;
  if (a.device == "cuda" || (a.device == "auto" && cuda_available(&why))) {
    if ((a.bf16 || a.fp16) && !plan_only && !mixed_precision_available(&why))
      fail("--{}: {}", a.bf16 ? "bf16" : "fp16", why);
    return make_cuda_backend({.device = device, .tf32 = a.tf32, .time_products = time_products});
  }
  if (a.tf32) fmt::print("notice: --tf32 affects CUDA matrix products only; the CPU backend computes in fp32\n");
  if (a.fp16 && !plan_only)
    fail("--fp16 needs a CUDA GPU{}: on the CPU --bf16 rounds the products' operands, or leave the flag out for fp32",
         why.empty() ? "" : " (" + why + ")");
  // A plan alone (hone estimate) on the CPU is the GPU's plan for these flags.
  if (!a.bf16 || plan_only) return std::make_unique<CpuBackend>();
  // The products' operands in bf16, everything else fp32, as on the GPU's tensor cores.
  if (std::string no_dnnl; !cpu_bf16_products_available(&no_dnnl)) fail("--bf16 on the CPU: {}", no_dnnl);
  if (!cpu_has_amx())
    fmt::print("notice: --bf16 on a CPU without AMX: its bf16 products may run slower than fp32 "
               "(they did on an AVX512-BF16 Xeon)\n");
  return std::make_unique<CpuBackend>(true);
}

std::string precision_name(const TrainingArguments& a) {
  return a.bf16 ? "bf16" : a.fp16 ? "fp16" : a.tf32 ? "tf32" : "fp32";
}

namespace {

// transformers writes LABEL_0, LABEL_1, ... when a model was never given label names.
bool names_its_labels(const ModelConfig& c) {
  for (size_t i = 0; i < c.id2label.size(); ++i)
    if (c.id2label[i] != fmt::format("LABEL_{}", i)) return true;
  return false;
}

LabelSpace labels_of(const ModelConfig& c) {
  LabelSpace s;
  s.regression = c.resolved_problem_type() == "regression";
  if (!s.regression) s.names = c.id2label;
  return s;
}

void apply_labels(const LabelSpace& s, ModelConfig& c) {
  if (s.regression) {
    c.num_labels = 1;
    c.id2label = {"LABEL_0"};
    c.problem_type = "regression";
  } else {
    c.num_labels = int(s.names.size());
    c.id2label = s.names;
    c.problem_type = "single_label_classification";
  }
}

}  // namespace

namespace {

// Where the run's config came from, for messages: a config.json, or a built-in name.
std::string config_source(const TrainingArguments& a) {
  const std::string& name = a.config_name.empty() ? a.model_name_or_path : a.config_name;
  if (std::filesystem::is_directory(name)) return (std::filesystem::path(name) / "config.json").string();
  if (std::filesystem::is_regular_file(name)) return name;
  return "the built-in configuration " + name;
}

// The run allocates the model its config describes once the inputs are read: a checkpoint
// that does not hold that model (a config.json with a vocab_size of 10^9) is refused first.
RunInputs checked(RunInputs in, const TrainingArguments& a) {
  if (!in.model.weights_path.empty())
    check_weights_fit(in.model.weights_path, in.model.config, a.ignore_mismatched_sizes);
  return in;
}

// The tokenizer of a text run, checked against the model, and the run's sequence length.
void load_tokenizer(const TrainingArguments& a, RunInputs& in) {
  const ModelConfig& cfg = in.model.config;
  const std::string tok_dir = a.tokenizer_name.empty() ? a.model_name_or_path : a.tokenizer_name;
  if (in.model.weights_path.empty() && a.tokenizer_name.empty())
    fail("--model_name_or_path {} is a built-in configuration without tokenizer files: pass --tokenizer_name DIR "
         "(a directory with tokenizer.json or vocab.txt)", a.model_name_or_path);
  in.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::load(tok_dir));
  if (in.tokenizer->pad_id() < 0)
    fail("{} has no padding token: name one as pad_token in {}/tokenizer_config.json",
         in.tokenizer->vocabulary_file(), tok_dir);
  const std::string config_file = config_source(a);
  if (in.tokenizer->vocab_size() > cfg.vocab_size)
    fail("{} has {} tokens but the model's vocab_size is {} ({}): the tokenizer gives ids the model has no "
         "embedding for", in.tokenizer->vocabulary_file(), in.tokenizer->vocab_size(), cfg.vocab_size, config_file);
  if (cfg.family().token_types && in.tokenizer->max_type_id() >= cfg.type_vocab_size)
    fail("{}: the post-processor gives token type id {} but the model's type_vocab_size is {} ({})",
         in.tokenizer->vocabulary_file(), in.tokenizer->max_type_id(), cfg.type_vocab_size, config_file);
  in.seq_len = std::min(a.max_seq_length, cfg.max_sequence_length());
  if (a.max_seq_length > cfg.max_sequence_length())
    fmt::print("notice: --max_seq_length {} is longer than the model's max_position_embeddings allow; using {}\n",
               a.max_seq_length, in.seq_len);
}

RunInputs read_inputs(const TrainingArguments& a, bool read_train, bool read_eval, bool read_test) {
  RunInputs in;
  in.model = resolve_model(a.model_name_or_path);
  if (!a.config_name.empty()) in.model.config = resolve_config(a.config_name);
  ModelConfig& cfg = in.model.config;
  const bool text = !a.train_file.empty() || (read_test && !a.test_file.empty()) ||
                    (!read_train && read_eval && !a.validation_file.empty());
  if (!text) {
    if (read_test) fail("hone predict needs a --test_file");
    const SyntheticSpec spec = parse_synthetic_dataset(a.dataset);
    in.seq_len = spec.len;
    if (read_train) {
      in.train = open_dataset(a.dataset, a.seed, cfg.resolved_problem_type() == "regression");
      if (cfg.vocab_size < SyntheticDataset::kEndId)
        fail("--dataset {}: synthetic token ids go up to {}, but the model's vocab_size is {}", a.dataset,
             SyntheticDataset::kEndId - 1, cfg.vocab_size);
    }
    return in;
  }

  if (read_test && in.model.weights_path.empty())
    fail("--model_name_or_path {}: predictions need trained weights (a directory with model.safetensors)",
         a.model_name_or_path);
  load_tokenizer(a, in);
  const TextColumns cols{a.text_column, a.text_pair_column, a.label_column};

  if (read_train && !a.train_file.empty()) {
    TextTable table = read_text_table(a.train_file, cols, true);
    // A model fine-tuned before keeps its label ids; a new head takes the data's labels.
    in.labels = names_its_labels(cfg) ? labels_of(cfg)
                                      : LabelSpace::infer(table, cfg.resolved_problem_type() == "regression");
    apply_labels(in.labels, cfg);
    in.train = std::make_unique<TextDataset>(std::move(table), in.tokenizer, in.labels, in.seq_len, true);
  } else {
    in.labels = labels_of(cfg);
  }
  if (read_eval && !a.validation_file.empty())
    in.eval = std::make_unique<TextDataset>(read_text_table(a.validation_file, cols, true), in.tokenizer, in.labels,
                                            in.seq_len, true);
  if (read_test) {
    if (a.test_file.empty()) fail("hone predict needs a --test_file");
    // Labels are optional here: where every row has one of the model's labels, predict
    // also reports metrics; otherwise it predicts without them.
    TextTable table;
    try {
      table = read_text_table(a.test_file, cols, true);
    } catch (const Error&) {
      table = read_text_table(a.test_file, cols, false);  // no label column: the real error, if any, again
    }
    in.test_has_labels = !table.labels.empty() &&
                         std::all_of(table.labels.begin(), table.labels.end(),
                                     [&](const std::string& l) { return in.labels.find(l).has_value(); });
    if (!table.labels.empty() && !in.test_has_labels)
      fmt::print("notice: {} has labels that are not the model's ({}); predicting without metrics\n", a.test_file,
                 in.labels.regression ? "not numbers" : fmt::format("{}", fmt::join(in.labels.names, ", ")));
    in.test = std::make_unique<TextDataset>(std::move(table), in.tokenizer, in.labels, in.seq_len, in.test_has_labels);
  }
  return in;
}

}  // namespace

RunInputs prepare_inputs(const TrainingArguments& a, bool read_train, bool read_eval, bool read_test) {
  return checked(read_inputs(a, read_train, read_eval, read_test), a);
}

RunInputs prepare_model(const TrainingArguments& a) {
  RunInputs in;
  in.model = resolve_model(a.model_name_or_path);
  if (!a.config_name.empty()) in.model.config = resolve_config(a.config_name);
  if (in.model.weights_path.empty())
    fail("--model_name_or_path {}: serving needs trained weights (a directory with model.safetensors)",
         a.model_name_or_path);
  load_tokenizer(a, in);
  in.labels = labels_of(in.model.config);
  return checked(std::move(in), a);
}

}  // namespace hone::cli
