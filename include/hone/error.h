#pragma once
// One exception type for everything a user can cause (bad files, bad flags, bad data).
// The CLI prints its message and exits non-zero; nothing else catches it.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace hone {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// Internal invariant: a failure here is a bug in hone, not a user error.
#define HONE_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::hone::fail("internal error at {}:{}: {}", __FILE__, __LINE__,       \
                              ::fmt::format(__VA_ARGS__));                             \
  } while (0)

}  // namespace hone
