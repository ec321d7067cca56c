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
// Clients find the socket in $DDPRUN_HEARTBEAT_SOCKET and their rank in
// $RANK (base/contract.h's kEnvHeartbeatSocket and kEnvRank).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddprun::watchdog::heartbeat_wire {

// Datagram prefix, including the separating space.
inline constexpr const char* kPrefix = "hb ";
// Step value meaning "no step reported".
inline constexpr int64_t kNoStep = -1;
// Upper bound on one datagram; longer ones are malformed.
inline constexpr std::size_t kMaxDatagramBytes = 64;
// Ranks at or above this are malformed (no job is that large per agent view).
inline constexpr int64_t kMaxRank = 1 << 24;

}  // namespace ddprun::watchdog::heartbeat_wire
