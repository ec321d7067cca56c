// The names of the entries of one folder, sorted, for tests that compare a
// folder's contents to the files a run should have left there.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace ddprun::testing {

// Throws std::filesystem::filesystem_error when `folder` cannot be read:
// the test then fails naming the folder.
inline std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(folder)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ddprun::testing
