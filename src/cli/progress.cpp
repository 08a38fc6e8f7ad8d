#include "cli/progress.h"

#include <fmt/format.h>
#include <string>
#include <unistd.h>

namespace hone::cli {
namespace {

std::string clock_time(double s) {
  int t = int(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace

ProgressBar::ProgressBar(bool enabled)
    : enabled_(enabled), tty_(isatty(fileno(stderr))), start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t done, int64_t total, int64_t samples, const std::string& postfix) {
  if (!enabled_ || total <= 0) return;
  const int64_t decile = done * 10 / total;
  if (!tty_ && decile == last_decile_ && done != total) return;
  last_decile_ = decile;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? double(done) / elapsed : 0;
  const double left = rate > 0 ? double(total - done) / rate : 0;
  constexpr int kWidth = 30;
  const double frac = double(done) / double(total);
  const int full = int(frac * kWidth);
  std::string bar(size_t(full), '#');
  bar.resize(kWidth, ' ');
  std::string line = fmt::format("{:3.0f}%|{}| {}/{} [{}<{}, {}, {:.1f} samples/s{}{}]", 100 * frac, bar, done, total,
                                 clock_time(elapsed), clock_time(left),
                                 rate >= 1 || rate == 0 ? fmt::format("{:.2f}it/s", rate)
                                                        : fmt::format("{:.2f}s/it", 1 / rate),
                                 rate * double(samples), postfix.empty() ? "" : ", ", postfix);
  std::fprintf(stderr, tty_ ? "\r%s" : "%s\n", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (enabled_ && tty_ && drawn_) std::fputs("\r\033[K", stderr);
}

void ProgressBar::finish() {
  if (enabled_ && tty_ && drawn_) std::fputc('\n', stderr);
}

}  // namespace hone::cli
