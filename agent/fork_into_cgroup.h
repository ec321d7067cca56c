// fork_into_cgroup: fork() whose child starts inside a cgroup v2 (Linux 5.7's
// clone3 CLONE_INTO_CGROUP), instead of forking and then writing the child's
// pid into cgroup.procs. The write is a migration: the kernel takes its
// cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period,
// about 13 ms a process here, three times per launch (the job cgroup's probe
// and two workers): most of ddprun's launch (bench/launch_bench.py). A child
// created in place is never migrated.
//
// Falls back to plain fork() (and says so through `placed`) where clone3 or
// CLONE_INTO_CGROUP is refused (older kernel, seccomp, permissions), and
// always under ThreadSanitizer, whose runtime must see every fork. The
// child of either is like fork()'s: async-signal-safe calls only until exec.
#pragma once

#include <sys/types.h>

namespace ddprun::agent {

// `cgroup_dir_fd`: the cgroup's folder, opened O_DIRECTORY (or -1: fork()).
// `*placed`: true when the child already is in that cgroup.
pid_t fork_into_cgroup(int cgroup_dir_fd, bool* placed);

}  // namespace ddprun::agent
