// start_in_cgroup: a new process whose child side runs one function, created
// inside a cgroup v2 (Linux 5.7's clone3 CLONE_INTO_CGROUP) instead of
// forking and then writing the child's pid into cgroup.procs. The write is a
// migration: the kernel takes its cgroup_threadgroup_rwsem for writing,
// which waits for an RCU grace period, about 13 ms a process here, three
// times per launch (the job cgroup's probe and two workers): most of
// ddprun's launch (bench/launch_bench.py). A child created in place is
// never migrated.
//
// On x86-64 the child also shares the agent's memory until it execs or
// exits, on a small stack of its own, while the caller waits
// (CLONE_VM|CLONE_VFORK, posix_spawn's way; glibc's posix_spawn with a
// cgroup does the same): no page tables are copied for a process that
// throws them away at exec, and no page of the agent is copied on write
// meanwhile (a fork copies the agent's page tables on each worker's start).
// Off x86-64 and under ASan (whose runtime would see code run on a
// stack it did not make) the child gets a copy (clone3 without CLONE_VM);
// where clone3 is refused, and always under TSan (whose runtime must see
// every fork), it is a fork() outside the cgroup (`*placed` false).
//
// Either way `child` may make async-signal-safe calls only, must end in
// execve or _exit, and must write nothing of the agent's memory but its own
// stack (it may share it): build everything it needs before the call.
#pragma once

#include <sys/types.h>

namespace ddprun::agent {

// The child's side: `placed` is true when it already is in the cgroup.
using ChildMain = void (*)(const void* arg, bool placed);

// `cgroup_dir_fd`: the cgroup's folder, opened O_DIRECTORY (or -1: none).
// Returns the child's pid, once its `child` has exec'd or exited where the
// memory is shared, at once otherwise; -1 with errno when no process could
// be made. `*placed`: true when the child was created in that cgroup.
pid_t start_in_cgroup(int cgroup_dir_fd, ChildMain child, const void* arg, bool* placed);

}  // namespace ddprun::agent
