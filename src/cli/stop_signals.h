#pragma once
// Ctrl-C (SIGINT) and SIGTERM during training: the first asks the run to stop after the
// update in progress (and save a checkpoint); a second stops the process at once. The
// handlers are installed for the lifetime of a StopSignals and the previous ones restored.
#include <csignal>

namespace hone::cli {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal that asked to stop, or 0.
  static int received();

 private:
  struct sigaction previous_int_{}, previous_term_{};
};

const char* signal_name(int sig);  // "SIGINT", "SIGTERM"

}  // namespace hone::cli
