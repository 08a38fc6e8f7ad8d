#pragma once
// Where a process's wall time goes: named marks in seconds since the kernel started the
// process (so the dynamic loader's work on the CUDA libraries counts too), for the
// "process" line of `hone train` and train_results.json's process_seconds.
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace hone::cli {

class Timeline {
 public:
  Timeline();
  void mark(std::string name);  // the time now, under `name`
  double now() const;           // seconds since the process started
  // {"name": seconds since the process started, ...}, in the order marked
  nlohmann::ordered_json to_json() const;
  // "name 0.40 s, ..., 3.21 s in all": what each phase (the time up to its mark) took
  std::string summary() const;

 private:
  double start_;  // CLOCK_MONOTONIC seconds at the process's start
  std::vector<std::pair<std::string, double>> marks_;
};

}  // namespace hone::cli
