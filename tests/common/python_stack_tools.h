// Where the tests find py-spy and pystack (watchdog/stack_capture.h,
// capture_python_stack): the venv of scripts/setup-pytools.sh, whose bin/
// folder the target gets as PYTOOLS_BIN (ddprun_test_paths in
// tests/CMakeLists.txt), or PATH. ddprun looks for them on PATH, so a test
// runs ddprun with python_tools_path_env() in its environment.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace ddprun::testing {

inline std::string path_with_python_tools() {
  const char* path = std::getenv("PATH");
  return std::string(PYTOOLS_BIN) + ":" + (path ? path : "/usr/bin:/bin");
}

// "PATH=<venv>/bin:$PATH", for the environment of a ddprun under test.
inline std::string python_tools_path_env() { return "PATH=" + path_with_python_tools(); }

// True when py-spy is in the venv or on PATH (tests skip without it).
inline bool py_spy_available() {
  std::string dirs = path_with_python_tools();
  for (std::size_t start = 0; start <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    if (::access((dirs.substr(start, end - start) + "/py-spy").c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace ddprun::testing
