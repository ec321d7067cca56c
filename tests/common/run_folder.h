// The run folder ddprun made under a --log-dir: <run_id>_<random>, or
// <run_id>_<host>_<random> on several nodes. Tests give every job a fresh
// log folder, so exactly one folder matches; anything else returns "" (and
// the test's path checks then fail, naming the folder they looked in).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ddprun::testing {

// Every folder in `log_dir` whose name starts with `prefix` followed by '_'.
inline std::vector<std::string> run_folders(const std::string& log_dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(log_dir, ec)) {
    std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind(prefix + "_", 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

// The one such folder, or "" when there is none or more than one.
inline std::string run_folder(const std::string& log_dir, const std::string& prefix) {
  auto all = run_folders(log_dir, prefix);
  return all.size() == 1 ? all[0] : "";
}

}  // namespace ddprun::testing
