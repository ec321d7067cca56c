#include "introspect/slurm_step.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "base/proc_stat.h"
#include "introspect/proc_usage.h"

namespace ddprun::introspect {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool in_step(pid_t pid, const SlurmStep& step) {
  if (proc_environ_value(pid, "SLURM_JOB_ID") != step.job) return false;
  if (step.step.empty()) return true;
  const auto id = proc_environ_value(pid, "SLURM_STEP_ID");
  return step.step == "batch" ? !id : id == step.step;
}

}  // namespace

std::optional<SlurmStep> parse_slurm_step(const std::string& text) {
  const auto dot = text.find('.');
  SlurmStep s{text.substr(0, dot), dot == std::string::npos ? "" : text.substr(dot + 1)};
  if (!all_digits(s.job)) return std::nullopt;
  if (dot != std::string::npos && s.step != "batch" && !all_digits(s.step)) return std::nullopt;
  return s;
}

std::vector<pid_t> slurm_step_roots(const SlurmStep& step) {
  std::set<pid_t> mine;  // this process and its ancestors
  for (pid_t p = ::getpid(); p > 1 && mine.insert(p).second;) {
    const auto st = base::read_proc_stat(p);
    if (!st) break;
    p = st->ppid;
  }
  std::set<pid_t> members;
  std::vector<std::pair<pid_t, pid_t>> with_parent;
  DIR* d = ::opendir("/proc");
  if (!d) return {};
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || mine.count(static_cast<pid_t>(pid))) continue;
    const auto st = base::read_proc_stat(static_cast<pid_t>(pid));
    if (!st || st->state == 'Z' || !in_step(static_cast<pid_t>(pid), step)) continue;
    members.insert(static_cast<pid_t>(pid));
    with_parent.emplace_back(static_cast<pid_t>(pid), st->ppid);
  }
  ::closedir(d);
  std::vector<pid_t> roots;
  for (const auto& [pid, ppid] : with_parent)
    if (!members.count(ppid)) roots.push_back(pid);
  std::sort(roots.begin(), roots.end());
  return roots;
}

}  // namespace ddprun::introspect
