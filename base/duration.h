// Durations given in seconds (command-line flags, environment variables) to
// the std::chrono type the components use: one conversion, one rounding.
#pragma once

#include <chrono>
#include <cmath>

namespace ddprun::base {

// `seconds` to the nearest millisecond (0.0005 s rounds up).
inline std::chrono::milliseconds millis_from_seconds(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

}  // namespace ddprun::base
