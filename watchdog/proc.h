// Small readers of /proc for the watchdog: ancestry, whether a process runs
// Python, and its kernel-side stack state (the fallback when gdb is not
// installed), on base/procfs.h, the one reader of /proc. All
// functions are safe on a pid that has already exited.
#pragma once

#include <sys/types.h>

#include <string>

namespace ddprun::watchdog {

// True when `pid` is `ancestor` or one of its descendants (walks ppid).
bool is_same_or_descendant(pid_t pid, pid_t ancestor);

// True when the process runs a Python interpreter (exe or comm "python*").
bool is_python_process(pid_t pid);

// Human-readable kernel view of every thread: name, state, wchan and, when
// readable, /proc/PID/task/TID/stack. Used when gdb is unavailable.
std::string proc_stack_summary(pid_t pid);

}  // namespace ddprun::watchdog
