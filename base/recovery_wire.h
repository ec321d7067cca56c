// The recovery channel's packets (--restart-scope=rank, docs/RECOVERY.md),
// shared by the agent (agent/recovery_channel.h) and the workers that speak
// C++ (`train`); ddprun_recovery.py has the Python twin. Nothing else knows
// the bytes.
//
// One AF_UNIX SOCK_SEQPACKET packet per message, ASCII, at most
// kMaxPacketBytes, no newline needed (a trailing one is ignored):
//
//   agent to worker
//     "event=failed generation=<G> ranks=<R>[,<R>...] cause=exit|hang"
//     "event=ready generation=<G> ranks=<R>[,<R>...]"
//     "event=recovered generation=<G> ranks=<R>[,<R>...]"
//     "event=fallback reason=<word>"
//     "event=assign generation=<G> rank=<R> local_rank=<L>"   (to a standby)
//   worker to agent
//     "event=joined generation=<G> rank=<R>"
//
// Fields are space-separated key=value pairs in any order; unknown keys and
// events are ignored, so both can be added. G: decimal, 0 <= G <=
// kMaxGeneration; R: decimal global ranks, 0 <= R < kMaxRank. Rejected: a
// byte outside printable ASCII, a packet without event=, a field that is
// not key=value, a malformed number of a known key, a known event without
// a field it needs (above; cause and reason may be left out).
// ddprun_recovery.py's _parse() keeps these rules; both are held to
// tests/base/recovery_wire_cases.txt.
//
// Header-only and allocation-light: parse() is pure, for tests and fuzzing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::base::recovery_wire {

inline constexpr std::size_t kMaxPacketBytes = 512;
inline constexpr int64_t kMaxRank = 1 << 24;
// No generation past this (a job that replaced this many ranks is broken).
inline constexpr int64_t kMaxGeneration = 1 << 30;

inline constexpr std::string_view kEventFailed = "failed";
inline constexpr std::string_view kEventReady = "ready";
inline constexpr std::string_view kEventRecovered = "recovered";
inline constexpr std::string_view kEventFallback = "fallback";
inline constexpr std::string_view kEventJoined = "joined";
// To a pre-started standby (--standby-workers): become rank R (local rank
// L) and join generation G as its replacement.
inline constexpr std::string_view kEventAssign = "assign";
inline constexpr std::string_view kCauseExit = "exit";
inline constexpr std::string_view kCauseHang = "hang";

struct Message {
  std::string event;
  int64_t generation = -1;  // -1: absent
  std::vector<int> ranks;   // failed, ready
  int rank = -1;            // joined, assign; -1: absent
  int local_rank = -1;      // assign; -1: absent
  std::string cause;        // failed
  std::string reason;       // fallback: one word (second_failure, ...)
};

namespace detail {

inline bool parse_number(std::string_view s, int64_t max, int64_t& out) {
  if (s.empty() || s.size() > 12) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  out = v;
  return true;
}

// Whether `m`, of a known event, carries every field that event needs.
inline bool complete(const Message& m) {
  const bool gen = m.generation >= 0;
  if (m.event == kEventFailed || m.event == kEventReady || m.event == kEventRecovered)
    return gen && !m.ranks.empty();
  if (m.event == kEventJoined) return gen && m.rank >= 0;
  if (m.event == kEventAssign) return gen && m.rank >= 0 && m.local_rank >= 0;
  return true;
}

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace detail

// The packet for `m`: event first, then the fields it sets, in a fixed order.
inline std::string format(const Message& m) {
  std::string s = "event=" + m.event;
  if (m.generation >= 0) s += " generation=" + std::to_string(m.generation);
  if (!m.ranks.empty()) s += " ranks=" + detail::join_ranks(m.ranks);
  if (m.rank >= 0) s += " rank=" + std::to_string(m.rank);
  if (m.local_rank >= 0) s += " local_rank=" + std::to_string(m.local_rank);
  if (!m.cause.empty()) s += " cause=" + m.cause;
  if (!m.reason.empty()) s += " reason=" + m.reason;
  return s;
}

// nullopt for a packet the rules above reject.
inline std::optional<Message> parse(std::string_view packet) {
  if (packet.size() > kMaxPacketBytes) return std::nullopt;
  if (!packet.empty() && packet.back() == '\n') packet.remove_suffix(1);
  for (const char c : packet)
    if (c < 0x20 || c > 0x7e) return std::nullopt;
  Message m;
  bool have_event = false;
  size_t pos = 0;
  while (pos < packet.size()) {
    if (packet[pos] == ' ') {
      ++pos;
      continue;
    }
    size_t end = packet.find(' ', pos);
    if (end == std::string_view::npos) end = packet.size();
    const std::string_view field = packet.substr(pos, end - pos);
    pos = end;
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos || eq == 0) return std::nullopt;
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    int64_t n = 0;
    if (key == "event") {
      if (value.empty()) return std::nullopt;
      m.event = std::string(value);
      have_event = true;
    } else if (key == "generation") {
      if (!detail::parse_number(value, kMaxGeneration, n)) return std::nullopt;
      m.generation = n;
    } else if (key == "rank") {
      if (!detail::parse_number(value, kMaxRank - 1, n)) return std::nullopt;
      m.rank = static_cast<int>(n);
    } else if (key == "local_rank") {
      if (!detail::parse_number(value, kMaxRank - 1, n)) return std::nullopt;
      m.local_rank = static_cast<int>(n);
    } else if (key == "ranks") {
      m.ranks.clear();
      size_t p = 0;
      while (p <= value.size()) {
        size_t comma = value.find(',', p);
        if (comma == std::string_view::npos) comma = value.size();
        if (!detail::parse_number(value.substr(p, comma - p), kMaxRank - 1, n))
          return std::nullopt;
        m.ranks.push_back(static_cast<int>(n));
        p = comma + 1;
      }
    } else if (key == "cause") {
      m.cause = std::string(value);
    } else if (key == "reason") {
      m.reason = std::string(value);
    }  // unknown keys: ignored
  }
  if (!have_event || !detail::complete(m)) return std::nullopt;
  return m;
}

}  // namespace ddprun::base::recovery_wire
