#include "introspect/registry.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <spdlog/spdlog.h>
#include <stdexcept>

#include "base/contract.h"
#include "base/procfs.h"
#include "base/safe_file.h"

namespace ddprun::introspect {

namespace fs = std::filesystem;

namespace {

// An override folder: created 0700 if missing (through base::SafeDir, so no
// planted symlink is followed on the way), then it must be ours and closed
// to others.
void ensure_private_dir(const std::string& dir) {
  try {
    const base::SafeDir d = base::SafeDir::open(dir, true, 0700);
    struct stat st{};
    if (::fstat(d.fd(), &st) != 0) throw std::runtime_error("cannot stat " + dir);
    if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
      throw std::runtime_error(dir + " is not a private folder of this user (owner or mode): "
                               "refusing to use it as the agent registry");
    }
  } catch (const base::FileError& e) {
    throw std::runtime_error(dir + " is not a private folder of this user (" + e.what() +
                             "): refusing to use it as the agent registry");
  }
}

// $XDG_RUNTIME_DIR when it is a folder of ours closed to others (as
// pam_systemd makes it); nullopt otherwise.
std::optional<base::SafeDir> xdg_runtime_dir() {
  const char* x = std::getenv(base::kEnvXdgRuntimeDir);
  if (x == nullptr || *x == '\0') return std::nullopt;
  try {
    base::SafeDir d = base::SafeDir::open(x);
    struct stat st{};
    if (::fstat(d.fd(), &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0)
      return d;
  } catch (const base::FileError&) {
  }
  return std::nullopt;
}

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

std::string registry_dir(const std::string& override_dir) {
  if (!override_dir.empty()) {
    ensure_private_dir(override_dir);
    return override_dir;
  }
  if (const char* d = std::getenv(base::kEnvRegistryDir); d && *d) {
    ensure_private_dir(d);
    return d;
  }
  // Verified or replaced, never silently unusable: another user who made
  // /tmp/ddprun-<uid> first is moved aside (base::open_private_dir).
  try {
    std::string note;
    std::optional<base::SafeDir> xdg = xdg_runtime_dir();
    const base::SafeDir top =
        xdg ? base::open_private_dir(*xdg, "ddprun", &note)
            : base::open_private_dir(base::SafeDir::open("/tmp"),
                                     "ddprun-" + std::to_string(::geteuid()), &note);
    if (!note.empty()) spdlog::warn("{}", note);
    note.clear();
    const base::SafeDir agents = base::open_private_dir(top, "agents", &note);
    if (!note.empty()) spdlog::warn("{}", note);
    return agents.path();
  } catch (const base::FileError& e) {
    throw std::runtime_error(std::string(e.what()) + " (the agent registry)");
  }
}

Registration::Registration(const std::string& dir, const AgentEntry& e) {
  path_ = dir + "/" + std::to_string(e.pid) + ".json";
  try {
    base::SafeDir::open(dir).write_atomically(std::to_string(e.pid) + ".json",
                          nlohmann::json{{"run_id", e.run_id}, {"host", e.host}, {"pid", e.pid},
                                         {"socket", e.socket}}
                                  .dump() +
                              "\n",
                          false, 0600);
  } catch (const base::FileError& err) {
    path_.clear();
    throw std::runtime_error(err.what());
  }
}

Registration::~Registration() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

Registration::Registration(Registration&& other) noexcept : path_(std::move(other.path_)) {
  other.path_.clear();
}

std::vector<AgentEntry> list_agents(const std::string& dir, const std::string& run_id) {
  std::vector<AgentEntry> out;
  for (const auto& entry : base::list_dir_or_empty(dir)) {
    const fs::path path = dir + "/" + entry.name;
    if (path.extension() != ".json") continue;
    std::ifstream in(path);
    AgentEntry e;
    try {
      const auto j = nlohmann::json::parse(in);
      e.run_id = j.at("run_id").get<std::string>();
      e.host = j.at("host").get<std::string>();
      e.pid = j.at("pid").get<pid_t>();
      e.socket = j.at("socket").get<std::string>();
    } catch (const std::exception&) {
      continue;  // being written, or not ours to judge
    }
    if (!alive(e.pid)) {
      std::error_code ignored;
      fs::remove(path, ignored);  // the agent was killed before cleaning up
      continue;
    }
    if (run_id.empty() || e.run_id == run_id) out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace ddprun::introspect
