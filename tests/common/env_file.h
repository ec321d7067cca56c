// A worker's environment as the test workers dump it ("NAME=value" a line),
// read back into a map.
#pragma once

#include <fstream>
#include <map>
#include <string>

namespace ddprun::testing {

// Lines without '=' are skipped; a missing file gives an empty map.
inline std::map<std::string, std::string> read_env(const std::string& path) {
  std::map<std::string, std::string> env;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

}  // namespace ddprun::testing
