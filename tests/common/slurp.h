// A whole file read into a string, byte for byte, for tests that check what
// a run wrote (logs, consoles, reports). Shared by every component's tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace ddprun::testing {

// "" when the file cannot be opened: the test's checks on its content then
// fail and show the empty text, which names the problem well enough.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace ddprun::testing
