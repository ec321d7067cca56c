// The watchdog layer's one error type. System-call failures are turned into
// it in exactly one place (sys_error), naming the call, the file or socket,
// and errno's text.
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun::watchdog {

class WatchdogError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "call(path): errno's text" (base::errno_text).
WatchdogError sys_error(const std::string& call, const std::string& path, int err);

}  // namespace ddprun::watchdog
