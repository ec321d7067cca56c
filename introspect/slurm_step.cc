#include "introspect/slurm_step.h"

#include <unistd.h>

#include <algorithm>
#include <set>

#include "base/procfs.h"
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
  const auto up = base::ancestry(::getpid());
  const std::set<pid_t> mine(up.begin(), up.end());  // this process and its ancestors
  std::set<pid_t> members;
  std::vector<std::pair<pid_t, pid_t>> with_parent;
  for (const auto& st : base::scan_processes()) {
    if (mine.count(st.pid) || st.state == 'Z' || !in_step(st.pid, step)) continue;
    members.insert(st.pid);
    with_parent.emplace_back(st.pid, st.ppid);
  }
  std::vector<pid_t> roots;
  for (const auto& [pid, ppid] : with_parent)
    if (!members.count(ppid)) roots.push_back(pid);
  std::sort(roots.begin(), roots.end());
  return roots;
}

}  // namespace ddprun::introspect
