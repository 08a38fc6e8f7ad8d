#pragma once
// The subcommands of the hone executable.
#include <cstdint>
#include <string>

#include "hone/args.h"

namespace hone::cli {

int train_command(const TrainingArguments& a);
int predict_command(const TrainingArguments& a);

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (printed)
  double max_batch_delay_ms = 0;    // how long a batch waits for more (0: what queued while the last ran)
  int max_queued_sequences = 1024;  // past this, requests get 503
  int max_concurrent_requests = 512;  // connections served at once (a thread each), as TEI's
  int64_t max_request_bytes = int64_t(4) << 20;
};
int serve_command(const TrainingArguments& a, const ServeOptions& o);
struct ProfileOptions {
  int skip_steps = 2;     // updates run before profiling: lazily loaded kernels, the products' algorithm choice
  int profile_steps = 5;  // updates profiled
};
int profile_command(const TrainingArguments& a, const ProfileOptions& o);

// memory_budget: empty, a size ("16GB") or "gpu" (see `hone estimate --help`); world_size:
// the data-parallel ranks whose per-rank plans to print.
int estimate_command(const TrainingArguments& a, bool list_buffers, const std::string& memory_budget,
                     int world_size = 1);

}  // namespace hone::cli
