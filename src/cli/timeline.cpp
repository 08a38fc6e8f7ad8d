#include "cli/timeline.h"

#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace hone::cli {
namespace {

double monotonic_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The process's start on CLOCK_MONOTONIC's scale: /proc/self/stat's starttime (clock ticks
// since boot, which is what CLOCK_BOOTTIME counts) moved by the time since. Where /proc is
// absent, now, so that the marks count from the first Timeline.
double process_start() {
  const double now = monotonic_now();
  std::ifstream f("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return now;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) {
      timespec boot{};
      clock_gettime(CLOCK_BOOTTIME, &boot);
      const double since_boot = double(boot.tv_sec) + 1e-9 * double(boot.tv_nsec);
      const double age = since_boot - std::stod(field) / double(sysconf(_SC_CLK_TCK));
      return age >= 0 ? now - age : now;
    }
  return now;
}

}  // namespace

Timeline::Timeline() : start_(process_start()) {}

double Timeline::now() const { return monotonic_now() - start_; }

void Timeline::mark(std::string name) { marks_.emplace_back(std::move(name), now()); }

nlohmann::ordered_json Timeline::to_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, t] : marks_) j[name] = std::round(t * 1e3) / 1e3;
  return j;
}

std::string Timeline::summary() const {
  std::string s;
  double before = 0;
  for (const auto& [name, t] : marks_) {
    s += fmt::format("{} {:.2f} s, ", name, t - before);
    before = t;
  }
  return s + fmt::format("{:.2f} s in all", before);
}

}  // namespace hone::cli
