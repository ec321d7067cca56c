// Small readers of /proc for the watchdog: a process's scheduler state,
// parent, executable name, and its kernel-side stack state (the fallback
// when gdb is not installed). All functions are safe on a pid that has
// already exited: they return nullopt or an explanatory string.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace ddprun::watchdog {

struct ProcStat {
  // Scheduler state letter from /proc/PID/stat: R, S, D, T, t, Z, ...
  char state = '?';
  pid_t ppid = 0;
  // Executable name from the stat line (comm, at most 15 characters).
  std::string comm;
};

std::optional<ProcStat> read_proc_stat(pid_t pid);

// True when `pid` is `ancestor` or one of its descendants (walks ppid).
bool is_same_or_descendant(pid_t pid, pid_t ancestor);

// True when the process runs a Python interpreter (exe or comm "python*").
bool is_python_process(pid_t pid);

// Human-readable kernel view of every thread: name, state, wchan and, when
// readable, /proc/PID/task/TID/stack. Used when gdb is unavailable.
std::string proc_stack_summary(pid_t pid);

}  // namespace ddprun::watchdog
