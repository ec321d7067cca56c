// The agent's control socket: one request, one reply, then the agent closes.
//
// Transport: AF_UNIX stream socket base::kFileControlSocket ("control.sock",
// base/contract.h) in the agent's private
// runtime folder (mode 0700, so only its user can connect); agents are found
// through the registry (registry.h).
// Request: one JSON object on one line, at most kMaxRequestBytes:
//   {"op": "status"}                   every node's rows (multi-node jobs)
//   {"op": "status", "nodes": "local"} this agent's rows only
//   {"op": "stacks", "rank": R}        R = -1: every rank, on every node
//   {"op": "stacks", "rank": R, "nodes": "local"}   this agent's ranks only
// Reply: one JSON object on one line, at most kMaxReplyBytes:
//   status: {"run_id", "host", "agent_pid", "attempt", "restarts",
//            "straggler": {"fraction", "window_s"},
//            "workers": [{"rank", "local_rank", "pid", "state", "step",
//                         "beat_age_s" (null without beats), "steps_per_s"
//                         (null without two samples), "cpu_percent",
//                         "rss_bytes", "cpu_seconds" (the process's CPU time
//                         so far; null before the first sample), "straggler"}],
//            "nodes" (the round's node count), "hangs", "hang_culprits"
//            ({"<rank>": hangs blamed on it}), "last_culprit" (null before
//            a hang), "recoveries", "recovery_fallbacks" (job_counters.h),
//            "hang_timeouts" (learned) or "hang_timeout" (words) and
//            "hang_timeout_s" (fixed),
//            in a multi-node round also "peers": [the other nodes' status
//            replies as they published them in the job's store, each with
//            "node" (group rank), "published_unix", "age_s"], and
//            "peers_error" when the store could not be read (node_board.h)}
//   stacks: {"run_id", "host", "stacks": [{"rank", "pid", "python",
//            "python_note", "native", "native_method", "native_note",
//            "host" (multi-node)}], "errors": [nodes that failed, one line
//            each] (multi-node)}
//   any failure: {"error": "one line"}
#pragma once

#include <chrono>
#include <cstddef>

#include "base/contract.h"

namespace ddprun::introspect::control_wire {

inline constexpr std::size_t kMaxRequestBytes = 4096;
inline constexpr std::size_t kMaxReplyBytes = 8 * 1024 * 1024;
// A client that has not sent its request by then is dropped.
inline constexpr std::chrono::seconds kRequestDeadline{5};
// Longest a stacks request may take on the agent (tools are bounded too).
inline constexpr std::chrono::seconds kStacksDeadline{60};

}  // namespace ddprun::introspect::control_wire
