#include "introspect/proc_usage.h"

#include <unistd.h>

#include <cstdlib>

#include "base/contract.h"
#include "base/procfs.h"

namespace ddprun::introspect {

long clock_ticks_per_second() {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? ticks : 100;
}

std::optional<ProcUsage> read_proc_usage(pid_t pid) {
  const auto stat = base::read_proc_stat(pid);
  if (!stat) return std::nullopt;
  ProcUsage u;
  u.state = stat->state;
  u.ppid = stat->ppid;
  u.cpu_ticks = stat->utime + stat->stime;
  u.rss_bytes = stat->rss_pages * static_cast<uint64_t>(::getpagesize());
  u.io_bytes = base::read_proc_io_bytes(pid);
  return u;
}

bool process_gone(pid_t pid) {
  const auto st = base::read_proc_stat(pid);
  return !st || st->state == 'Z' || st->state == 'X';
}

std::vector<pid_t> group_members(pid_t pgid) {
  std::vector<pid_t> out;
  for (const auto& st : base::scan_processes())
    if (st.pgrp == pgid) out.push_back(st.pid);
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
