// The hone executable: `hone train`, `launch`, `predict`, `serve`, `profile`, `estimate`, `env` and `tokenize`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <new>

#include "cli/commands.h"
#include "cli/env.h"
#include "cli/launch.h"
#include "cli/tokenize.h"
#include "hone/error.h"
#include "train/arguments_cli.h"

int main(int argc, char** argv) {
  using namespace hone;
  CLI::App app{"hone: fine-tune BERT, RoBERTa, XLM-RoBERTa, DistilBERT and ELECTRA for sequence classification, with Hugging Face Trainer's flags and files"};
  app.require_subcommand(1);
  TrainingArguments train_args, predict_args, estimate_args, serve_args;
  bool list_buffers = false;
  CLI::App* train = app.add_subcommand("train", "train a model (TrainingArguments flags)");
  add_training_arguments(*train, train_args);
  CLI::App* predict = app.add_subcommand(
      "predict", "write predictions for --test_file (label and probabilities per line) to output_dir/predictions.jsonl");
  add_training_arguments(*predict, predict_args);
  CLI::App* serve = app.add_subcommand(
      "serve", "serve a trained model over HTTP: POST /predict as text-embeddings-inference, GET /health, GET /info");
  add_training_arguments(*serve, serve_args);
  cli::ServeOptions serve_options;
  serve->add_option("--host", serve_options.host, "the address to listen on (default 127.0.0.1)");
  serve->add_option("--port", serve_options.port, "the port (default 8080; 0: any free one, printed)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--max_batch_delay_ms", serve_options.max_batch_delay_ms,
                    "how long a batch waits for more requests before it runs (default 0: a batch takes what "
                    "queued while the last one ran)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--max_queued_sequences", serve_options.max_queued_sequences,
                    "sequences that may wait for the model; past them requests get 503 (default 1024)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--max_concurrent_requests", serve_options.max_concurrent_requests,
                    "connections served at once, each by a thread of its own (default 512)")
      ->check(CLI::PositiveNumber);
  TrainingArguments profile_args;
  CLI::App* profile = app.add_subcommand(
      "profile", "time every op of a few training steps: the operation anatomy by class and phase against this "
                 "device's roofline, with profile.json, a Chrome trace and profile.svg in output_dir");
  add_training_arguments(*profile, profile_args);
  cli::ProfileOptions profile_options;
  profile->add_option("--profile_steps", profile_options.profile_steps, "optimizer steps profiled (default 5)")
      ->check(CLI::PositiveNumber);
  profile->add_option("--skip_steps", profile_options.skip_steps,
                      "optimizer steps run before profiling starts (default 2)")
      ->check(CLI::NonNegativeNumber);
  CLI::App* est = app.add_subcommand("estimate", "print the memory plan of a run without running it");
  add_training_arguments(*est, estimate_args);
  est->add_flag("--list_buffers", list_buffers, "also list every planned buffer");
  std::string memory_budget;
  int estimate_world = 1;
  est->add_option("--world_size", estimate_world,
                  "plan each of this many data-parallel ranks (with --zero_stage or a DeepSpeed file's stage)")
      ->check(CLI::PositiveNumber);
  est->add_option("--memory_budget", memory_budget,
                  "list the configurations that fit this much memory, fastest first: a size such as 16GB or 24GiB "
                  "(the card's; the CUDA context measured here is taken off it), or 'gpu' for this GPU's free memory");
  CLI::App* launch = app.add_subcommand(
      "launch", "run `hone train ...` (or `hone profile ...`) as several processes, one per GPU (as torchrun; mpiexec on the CPU)");
  cli::LaunchOptions launch_options;
  launch->add_option("--nproc_per_node", launch_options.nproc_per_node, "processes (GPUs) on this machine")
      ->check(CLI::PositiveNumber);
  launch->add_option("--master_addr", launch_options.master_addr, "where rank 0 listens for the other ranks");
  launch->add_option("--master_port", launch_options.master_port, "its port (default: a free one)");
  launch->prefix_command();  // the rest is the hone command the ranks run
  CLI::App* env = app.add_subcommand("env", "print the GPUs, driver, CUDA versions and supported features");
  std::string tokenizer_dir;
  int tokenize_max_length = 0;
  CLI::App* tok = app.add_subcommand(
      "tokenize", "tokenize JSON lines {\"text\": ..., \"text_pair\": ...} from stdin; print ids as JSON lines");
  tok->add_option("--tokenizer", tokenizer_dir, "a directory with tokenizer.json or vocab.txt")->required();
  tok->add_option("--max_length", tokenize_max_length, "truncate to this many tokens (0: no truncation)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train->parsed()) {
      validate(train_args);
      apply_deepspeed(train_args);
      return cli::train_command(train_args);
    }
    if (predict->parsed()) {
      validate(predict_args);
      return cli::predict_command(predict_args);
    }
    if (profile->parsed()) {
      validate(profile_args);
      apply_deepspeed(profile_args);
      return cli::profile_command(profile_args, profile_options);
    }
    if (serve->parsed()) {
      validate(serve_args);
      return cli::serve_command(serve_args, serve_options);
    }
    if (env->parsed()) return cli::env_command();
    if (launch->parsed()) return cli::launch_command(launch_options, launch->remaining());
    if (tok->parsed()) return cli::tokenize_command(tokenizer_dir, tokenize_max_length);
    validate(estimate_args);
    apply_deepspeed(estimate_args);
    return cli::estimate_command(estimate_args, list_buffers, memory_budget, estimate_world);
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "hone: error: {}\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "hone: error: out of host memory\n");
  }
  return 1;
}
