// Finding and ending every process below the agent.
//
// Workers may start children (data loaders) that outlive them or leave their
// process group; the agent is a child subreaper, so orphans are re-parented
// to it. At the end of each attempt sweep_descendants() SIGKILLs whatever is
// still below the agent and waits, with a deadline, until it is gone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <set>

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;

// Waits until `pid` has exited (pidfd + poll: no sleeping) or `deadline`
// passes; reaps it when it is our child. Returns true when it is gone.
bool wait_gone(pid_t pid, Clock::time_point deadline);

// SIGKILLs every descendant of this process (base::process_tree: live or
// zombie, a snapshot that the loop repeats) except `keep`, reaps the ones
// that are (or become) our children, and repeats until none is left or
// `deadline` passes. Returns how many processes it killed.
int sweep_descendants(const std::set<pid_t>& keep, Clock::time_point deadline);

}  // namespace ddprun::agent
