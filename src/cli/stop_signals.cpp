#include "cli/stop_signals.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "hone/error.h"

namespace hone::cli {
namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch a lock-free atomic");

extern "C" void on_stop_signal(int sig) {
  if (g_received.exchange(sig) != 0) {  // the second: stop now, as the default action does
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  static const char msg[] = "\nhone: stopping after the update in progress (again to stop at once)\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);  // async-signal-safe
}

void install(int sig, struct sigaction* previous) {
  // A signal ignored already (nohup, a background job) stays ignored.
  if (sigaction(sig, nullptr, previous) == 0 && previous->sa_handler == SIG_IGN) return;
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(sig, &sa, previous) != 0) fail("cannot install a handler for {}: {}", signal_name(sig), std::strerror(errno));
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  install(SIGINT, &previous_int_);
  install(SIGTERM, &previous_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
}

int StopSignals::received() { return g_received.load(); }

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

}  // namespace hone::cli
