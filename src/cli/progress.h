#pragma once
// A tqdm-style progress bar on stderr: redrawn in place on a terminal, a line every
// tenth of the run otherwise (so CI logs stay short).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace hone::cli {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  // `samples` per step give the throughput; `postfix` (e.g. "loss=0.6931") ends the line.
  void update(int64_t done, int64_t total, int64_t samples, const std::string& postfix);
  void clear();  // erases the bar before other output on a terminal
  void finish();

 private:
  bool enabled_, tty_;
  int64_t last_decile_ = -1;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace hone::cli
