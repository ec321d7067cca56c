// Heartbeat datagram format, shared by the clients (heartbeat.h,
// python/ddprun_heartbeat.py) and the agent's HeartbeatServer. Nothing else
// knows the bytes.
//
// One AF_UNIX SOCK_DGRAM datagram per message, ASCII, one of:
//
//   "hb <global_rank> <step>\n"      explicit beat (beat(step) in the user's code)
//   "ab <global_rank> <step>\n"      automatic beat: an optimizer.step() seen by
//                                    ddprun's Python bootstrap; step = that
//                                    process's optimizer steps so far (from 1)
//   "fw <global_rank>\n"             progress seen in a forward pass (rate-
//                                    limited by the client, kForwardMinIntervalMs)
//   "ss <global_rank> <section>\n"   the rank entered a section (checkpoint, ...)
//   "se <global_rank> <section>\n"   the rank left it
//
// global_rank: decimal, 0 <= rank < kMaxRank.
// step:        decimal, >= 0, or -1 when the worker has no step to report.
// section:     1..kMaxSectionBytes of [A-Za-z0-9_.-]; "setup" (start to the
//              first beat) is implied and never sent.
// A client that has sent one "hb" sends no more "ab" (explicit wins).
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
inline constexpr const char* kPrefixAuto = "ab ";
inline constexpr const char* kPrefixForward = "fw ";
inline constexpr const char* kPrefixSectionStart = "ss ";
inline constexpr const char* kPrefixSectionEnd = "se ";
inline constexpr std::size_t kMaxSectionBytes = 32;
// Clients send at most one "fw" per this many milliseconds.
inline constexpr int kForwardMinIntervalMs = 100;
// Upper bound on one datagram; longer ones are malformed.
inline constexpr std::size_t kMaxDatagramBytes = 64;
// Ranks at or above this are malformed (no job is that large per agent view).
inline constexpr int64_t kMaxRank = 1 << 24;

}  // namespace ddprun::watchdog::heartbeat_wire
