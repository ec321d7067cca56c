// Heartbeat datagram format, shared by the clients (heartbeat.h,
// python/ddprun_heartbeat.py) and the agent's HeartbeatServer. Nothing else
// knows the bytes.
//
// One AF_UNIX SOCK_DGRAM datagram per beat, ASCII:
//
//   "hb <global_rank> <step>\n"
//
// global_rank: decimal, 0 <= rank < kMaxRank.
// step:        decimal, >= 0, or -1 when the worker has no step to report.
// The trailing newline is required; the whole datagram is at most
// kMaxDatagramBytes. Clients never block: a full buffer drops the beat.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddprun::watchdog::heartbeat_wire {

// Environment variable naming the agent's socket path (docs/CONTRACTS.md).
inline constexpr const char* kSocketEnv = "DDPRUN_HEARTBEAT_SOCKET";
// torchrun's global rank variable; the client reads it once.
inline constexpr const char* kRankEnv = "RANK";
// Datagram prefix, including the separating space.
inline constexpr const char* kPrefix = "hb ";
// Step value meaning "no step reported".
inline constexpr int64_t kNoStep = -1;
// Upper bound on one datagram; longer ones are malformed.
inline constexpr std::size_t kMaxDatagramBytes = 64;
// Ranks at or above this are malformed (no job is that large per agent view).
inline constexpr int64_t kMaxRank = 1 << 24;

}  // namespace ddprun::watchdog::heartbeat_wire
