// The text ddprun prints when an attempt fails: the root cause first (rank,
// local rank, pid, exit code or signal name, the worker's error message and
// traceback, its log files), then the other ranks that ended with it.
#pragma once

#include <string>

#include "agent/attempt_types.h"

namespace ddprun::agent {

// Multi-line summary of a failed attempt, each line ending in '\n'.
// `host` names this node; `verdict` says what ddprun does next (the restart
// policy's or the rendezvous' reason, printed after "; ").
std::string failure_summary(const AttemptResult& result, const std::string& host,
                            const std::string& verdict);

// One line for the root cause, e.g. "rank 1 (local rank 1, pid 42) exited
// with exit code 3".
std::string root_cause_line(const AttemptResult& result);

}  // namespace ddprun::agent
