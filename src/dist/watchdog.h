#pragma once
// Stops a job whose collective waits too long for another rank (one that died or hung),
// with a message naming this rank and what it waited in, rather than hanging forever.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace hone {

class CollectiveWatchdog {
 public:
  // Every poll, `stalled` says whether the oldest collective in flight is still running
  // (and what it is); once one has run past the timeout, `abort` ends the job.
  using Stalled = std::function<bool(std::string* what, std::chrono::steady_clock::time_point* since)>;
  CollectiveWatchdog(int rank, int timeout_seconds, Stalled stalled, std::function<void()> abort);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

 private:
  void watch();
  int rank_, timeout_;
  Stalled stalled_;
  std::function<void()> abort_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hone
