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
#include <stdexcept>

#include "base/contract.h"

namespace ddprun::introspect {

namespace fs = std::filesystem;

namespace {

// mkdir 0700 if missing, then insist it is ours and closed to others.
void ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw std::runtime_error("cannot create " + dir + ": " + std::strerror(errno));
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) {
    throw std::runtime_error("cannot stat " + dir + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 022) != 0) {
    throw std::runtime_error(dir + " is not a private folder of this user (owner, mode or "
                             "type): refusing to use it as the agent registry");
  }
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
  std::string base;
  if (const char* x = std::getenv(base::kEnvXdgRuntimeDir); x && *x && ::access(x, W_OK) == 0) {
    base = std::string(x) + "/ddprun";
  } else {
    base = "/tmp/ddprun-" + std::to_string(::getuid());
  }
  ensure_private_dir(base);
  ensure_private_dir(base + "/agents");
  return base + "/agents";
}

Registration::Registration(const std::string& dir, const AgentEntry& e) {
  path_ = dir + "/" + std::to_string(e.pid) + ".json";
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"run_id", e.run_id}, {"host", e.host}, {"pid", e.pid},
                          {"socket", e.socket}}
               .dump()
        << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + ": " + std::strerror(err));
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
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".json") continue;
    std::ifstream in(it->path());
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
      fs::remove(it->path(), ignored);  // the agent was killed before cleaning up
      continue;
    }
    if (run_id.empty() || e.run_id == run_id) out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace ddprun::introspect
