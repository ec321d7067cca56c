// What /proc says about a process's progress: scheduler state, CPU time,
// resident memory, I/O bytes. Used by the agent's status sampler and by
// `ddprun attach`, read through base/procfs.h. Safe on a pid that has
// exited: nullopt.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/procfs.h"

namespace ddprun::introspect {

struct ProcUsage {
  char state = '?';
  pid_t ppid = 0;
  uint64_t cpu_ticks = 0;  // utime + stime, in clock ticks
  uint64_t rss_bytes = 0;
  // rchar + wchar from /proc/PID/io (every read/write, pipes and sockets
  // included); nullopt when unreadable.
  std::optional<uint64_t> io_bytes;
};

std::optional<ProcUsage> read_proc_usage(pid_t pid);
long clock_ticks_per_second();

// Direct children of `pid`; `pid` and every descendant, parents before
// children; the value of a key in /proc/PID/environ: base/procfs.h's.
using base::child_pids;
using base::proc_environ_value;
using base::process_tree;

// True once `pid` has exited (zombie) or does not exist.
bool process_gone(pid_t pid);
// Every process whose process group is `pgid`.
std::vector<pid_t> group_members(pid_t pgid);
// The ranks in the trees of `roots`: processes with RANK in their
// environment (the topmost one of each rank; a DataLoader child inheriting
// RANK is not another rank), by pid; a tree without any counts as its
// root, with the rank in its SLURM_PROCID (a task srun started directly),
// else -1.
std::map<pid_t, int> find_ranks(const std::vector<pid_t>& roots);

// True when the process has a handler installed for `sig` (SigCgt).
using base::catches_signal;

}  // namespace ddprun::introspect
