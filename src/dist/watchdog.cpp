#include "dist/watchdog.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace hone {

CollectiveWatchdog::CollectiveWatchdog(int rank, int timeout_seconds, Stalled stalled, std::function<void()> abort)
    : rank_(rank), timeout_(timeout_seconds), stalled_(std::move(stalled)), abort_(std::move(abort)) {
  thread_ = std::thread([this] { watch(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::watch() {
  using clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) {
    std::string what;
    clock::time_point since;
    if (!stalled_(&what, &since)) continue;
    const double waited = std::chrono::duration<double>(clock::now() - since).count();
    if (waited < timeout_) continue;
    std::fprintf(stderr,
                 "hone: error: rank %d: %s has waited %.0f s for the other ranks (HONE_COLLECTIVE_TIMEOUT=%d): "
                 "another rank has died or hung; stopping the job\n",
                 rank_, what.c_str(), waited, timeout_);
    std::fflush(stderr);
    abort_();
    std::_Exit(1);
  }
}

}  // namespace hone
