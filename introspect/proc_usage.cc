#include "introspect/proc_usage.h"

#include <dirent.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/contract.h"
#include "base/proc_stat.h"

namespace ddprun::introspect {

namespace {

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

long clock_ticks_per_second() {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? ticks : 100;
}

std::optional<ProcUsage> read_proc_usage(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  const auto stat = slurp(dir + "/stat");
  if (!stat) return std::nullopt;
  const auto parsed = base::parse_proc_stat(*stat);
  if (!parsed) return std::nullopt;
  ProcUsage u;
  u.state = parsed->state;
  u.ppid = parsed->ppid;
  // Fields after the last ')': state(3) ppid ... utime(14) stime(15) ... rss(24).
  std::istringstream rest(stat->substr(stat->rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 24 && rest >> field; ++i) {
    if (i == 14 || i == 15) u.cpu_ticks += std::stoull(field);
    if (i == 24) u.rss_bytes = std::stoull(field) * static_cast<uint64_t>(::getpagesize());
  }
  if (const auto io = slurp(dir + "/io")) {
    std::istringstream in(*io);
    std::string key;
    uint64_t value = 0, total = 0;
    while (in >> key >> value) {
      if (key == "rchar:" || key == "wchar:") total += value;
    }
    u.io_bytes = total;
  }
  return u;
}

std::vector<pid_t> child_pids(pid_t pid) {
  std::vector<pid_t> out;
  const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  // Each thread lists the children it forked.
  for (std::filesystem::directory_iterator it(task_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::istringstream in(slurp(it->path().string() + "/children").value_or(""));
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  return out;
}

std::vector<pid_t> process_tree(pid_t pid) {
  std::vector<pid_t> out{pid};
  for (std::size_t i = 0; i < out.size() && out.size() < 100000; ++i) {
    for (pid_t c : child_pids(out[i])) out.push_back(c);
  }
  return out;
}

std::optional<std::string> proc_environ_value(pid_t pid, const std::string& key) {
  const auto env = slurp("/proc/" + std::to_string(pid) + "/environ");
  if (!env) return std::nullopt;
  std::size_t start = 0;
  while (start < env->size()) {
    std::size_t end = env->find('\0', start);
    if (end == std::string::npos) end = env->size();
    if (env->compare(start, key.size(), key) == 0 && start + key.size() < end &&
        (*env)[start + key.size()] == '=') {
      return env->substr(start + key.size() + 1, end - start - key.size() - 1);
    }
    start = end + 1;
  }
  return std::nullopt;
}

bool catches_signal(pid_t pid, int sig) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/status").value_or(""));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
    return sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1);
  }
  return false;
}

bool process_gone(pid_t pid) {
  const auto st = base::read_proc_stat(pid);
  return !st || st->state == 'Z' || st->state == 'X';
}

std::vector<pid_t> group_members(pid_t pgid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const auto st = base::read_proc_stat(static_cast<pid_t>(pid));
    if (st && st->pgrp == pgid) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

// The ranks of each tree (RANK in the environment), else the tree's root.
std::map<pid_t, int> find_ranks(const std::vector<pid_t>& roots) {
  std::map<pid_t, int> out;
  for (pid_t r : roots) {
    if (process_gone(r)) continue;
    bool any = false;
    for (pid_t p : process_tree(r)) {
      const auto rank = proc_environ_value(p, base::kEnvRank);
      if (!rank || process_gone(p)) continue;
      // A rank's own children (DataLoader workers) inherit RANK: keep the
      // topmost process carrying each rank.
      const auto parent = base::read_proc_stat(p);
      if (parent && proc_environ_value(parent->ppid, base::kEnvRank) == rank) continue;
      try {
        out[p] = std::stoi(*rank);
        any = true;
      } catch (const std::exception&) {
      }
    }
    if (any) continue;
    // A task srun started directly (no launcher) has its rank in SLURM_PROCID.
    out[r] = -1;
    if (const auto procid = proc_environ_value(r, "SLURM_PROCID")) {
      try {
        out[r] = std::stoi(*procid);
      } catch (const std::exception&) {
      }
    }
  }
  return out;
}

}  // namespace ddprun::introspect
