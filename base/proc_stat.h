// The one reader of /proc/<pid>/stat in ddprun (agent, watchdog, introspect,
// tests); the rest of /proc is read by base/procfs.h.
//
// Safe on a pid that has exited or never existed: returns nullopt. The
// comm field may hold spaces and parentheses, so fields are read after the
// LAST ')'. Uses open/read into a stack buffer (no iostreams): the agent
// reads every process's stat when it sweeps its descendants.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace ddprun::base {

struct ProcStat {
  pid_t pid = 0;
  // Executable name (at most 15 characters), without the parentheses.
  std::string comm;
  // Scheduler state letter: R, S, D, T, t, Z, X, I, ...
  char state = '?';
  pid_t ppid = 0;
  pid_t pgrp = 0;     // process group id
  pid_t session = 0;  // session id
  // Start time after boot in clock ticks: with the pid, names one process
  // even after the pid is reused.
  unsigned long long start_time = 0;
  // CPU time in user and kernel mode, in clock ticks.
  unsigned long long utime = 0;
  unsigned long long stime = 0;
  // Resident set size in pages.
  unsigned long long rss_pages = 0;
};

// Parses one stat line; nullopt when it is malformed.
std::optional<ProcStat> parse_proc_stat(std::string_view line);

// Reads /proc/<pid>/stat (a thread id works too); nullopt when gone.
std::optional<ProcStat> read_proc_stat(pid_t pid);

}  // namespace ddprun::base
