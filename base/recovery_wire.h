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

// What a packet says (event=). kOther: an event added later, accepted and
// ignored by whoever does not know it.
enum class Event { kOther, kFailed, kReady, kRecovered, kFallback, kJoined, kAssign };
// Why the ranks of event=failed failed (cause=): kNone when left out or
// not known here.
enum class Cause { kNone, kExit, kHang };
// Why the agent gave up rank-scoped recovery (event=fallback reason=WORD,
// docs/RECOVERY.md); kOther when left out or not known here.
enum class Fallback {
  kOther,
  kSecondFailure,     // another rank failed during a recovery
  kNoRestartLeft,     // --max-restarts spent
  kNoRestartExitCode, // the exit status is one of --no-restart-exit-codes
  kTimeout,           // --recovery-timeout passed
  kGroupStopped,      // the group stops for another reason
  kSpawnFailed,       // the replacement could not start
  kStoreLost,         // the agents' store is gone (several nodes)
};

struct Message {
  Event event = Event::kOther;
  int generation = -1;      // -1: absent (a generation fits: <= kMaxGeneration)
  std::vector<int> ranks;   // failed, ready, recovered
  int rank = -1;            // joined, assign; -1: absent
  int local_rank = -1;      // assign; -1: absent
  Cause cause = Cause::kNone;            // failed
  Fallback reason = Fallback::kOther;    // fallback
};

// The wire's words, in the enumerators' order: an event's for kOther is
// "other", a cause's for kNone "", a fallback's for kOther "unknown".
inline constexpr std::string_view kEventWords[] = {"other",     "failed", "ready", "recovered",
                                                   "fallback",  "joined", "assign"};
inline constexpr std::string_view kCauseWords[] = {"", "exit", "hang"};
inline constexpr std::string_view kFallbackWords[] = {
    "unknown", "second_failure", "no_restart_left", "no_restart_exit_code",
    "timeout", "group_stopped",  "spawn_failed",    "store_lost"};

inline std::string_view name(Event e) { return kEventWords[static_cast<int>(e)]; }
inline std::string_view name(Cause c) { return kCauseWords[static_cast<int>(c)]; }
inline std::string_view name(Fallback f) { return kFallbackWords[static_cast<int>(f)]; }

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
  switch (m.event) {
    case Event::kFailed:
    case Event::kReady:
    case Event::kRecovered: return gen && !m.ranks.empty();
    case Event::kJoined: return gen && m.rank >= 0;
    case Event::kAssign: return gen && m.rank >= 0 && m.local_rank >= 0;
    case Event::kFallback:
    case Event::kOther: break;
  }
  return true;
}

// The enumerator whose word is `word`, else the first (kOther, kNone).
template <typename E, std::size_t N>
E from_word(std::string_view word, const std::string_view (&words)[N]) {
  for (std::size_t i = 1; i < N; ++i)
    if (words[i] == word) return static_cast<E>(i);
  return static_cast<E>(0);
}

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace detail

// The packet for `m`: event first, then the fields it sets, in a fixed order.
inline std::string format(const Message& m) {
  std::string s = "event=" + std::string(name(m.event));
  if (m.generation >= 0) s += " generation=" + std::to_string(m.generation);
  if (!m.ranks.empty()) s += " ranks=" + detail::join_ranks(m.ranks);
  if (m.rank >= 0) s += " rank=" + std::to_string(m.rank);
  if (m.local_rank >= 0) s += " local_rank=" + std::to_string(m.local_rank);
  if (m.cause != Cause::kNone) s += " cause=" + std::string(name(m.cause));
  if (m.event == Event::kFallback && m.reason != Fallback::kOther)
    s += " reason=" + std::string(name(m.reason));
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
      m.event = detail::from_word<Event>(value, kEventWords);
      have_event = true;
    } else if (key == "generation") {
      if (!detail::parse_number(value, kMaxGeneration, n)) return std::nullopt;
      m.generation = static_cast<int>(n);
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
      m.cause = detail::from_word<Cause>(value, kCauseWords);
    } else if (key == "reason") {
      m.reason = detail::from_word<Fallback>(value, kFallbackWords);
    }  // unknown keys: ignored
  }
  if (!have_event || !detail::complete(m)) return std::nullopt;
  return m;
}

}  // namespace ddprun::base::recovery_wire
