// Header-only heartbeat client for workers launched by ddprun.
//
// A worker calls ddprun::watchdog::beat(step) every training step (or any
// time it makes progress). Each beat is one non-blocking sendto() on an
// AF_UNIX datagram socket to the agent's address in DDPRUN_HEARTBEAT_SOCKET;
// the format is in heartbeat_wire.h. When the variable is unset (not run
// under ddprun) every call is a no-op. A beat never blocks and never throws:
// when the socket buffer is full or the agent is gone the beat is dropped,
// because a late beat is worth less than a stalled training step.
//
// Sections mark known slow phases so the agent judges them by their own
// timeout: start_section("checkpoint") / end_section("checkpoint"), or the
// guard `ddprun::watchdog::Section s("checkpoint");`. A name is 1..32 of
// [A-Za-z0-9_.-]; other characters become '_' and longer names are cut (the
// same rule as ddprun_heartbeat.py). Sections of one name nest: only the
// outermost start and end are sent.
//
// Thread safety: every call may be made from any thread concurrently; the
// socket is created once, sendto on a datagram socket is atomic, and the
// section depths are guarded by a mutex.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "base/contract.h"
#include "base/mutex.h"
#include "base/scoped_fd.h"
#include "watchdog/heartbeat_wire.h"

namespace ddprun::watchdog {

class HeartbeatClient {
 public:
  // Reads DDPRUN_HEARTBEAT_SOCKET and RANK. Disabled (beat() is a no-op)
  // when the socket variable is unset, empty or too long for sun_path, or
  // the socket cannot be created.
  HeartbeatClient() noexcept {
    const char* path = std::getenv(base::kEnvHeartbeatSocket);
    if (path == nullptr || path[0] == '\0') return;
    const std::size_t len = std::strlen(path);
    if (len >= sizeof(addr_.sun_path)) return;
    const char* rank = std::getenv(base::kEnvRank);
    if (rank != nullptr && rank[0] != '\0') {
      char* end = nullptr;
      const long long r = std::strtoll(rank, &end, 10);
      if (end != rank && *end == '\0' && r >= 0 && r < heartbeat_wire::kMaxRank) rank_ = r;
    }
    addr_.sun_family = AF_UNIX;
    std::memcpy(addr_.sun_path, path, len + 1);
    addr_len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len + 1);
    fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  }
  HeartbeatClient(const HeartbeatClient&) = delete;
  HeartbeatClient& operator=(const HeartbeatClient&) = delete;

  // True when beats are actually sent (running under ddprun).
  bool enabled() const noexcept { return fd_.valid(); }
  int64_t rank() const noexcept { return rank_; }

  // Sends "hb <rank> <step>\n". step < 0 means "no step". Drops the beat on
  // any error (EAGAIN: buffer full; ECONNREFUSED/ENOENT: agent gone).
  void beat(int64_t step = heartbeat_wire::kNoStep) noexcept {
    if (!fd_) return;
    if (step < 0) step = heartbeat_wire::kNoStep;
    char buf[heartbeat_wire::kMaxDatagramBytes];
    const int n = std::snprintf(buf, sizeof(buf), "%s%" PRId64 " %" PRId64 "\n",
                                heartbeat_wire::kPrefix, rank_, step);
    send(buf, n);
  }

  // Sends "fw <rank>\n": progress without a step. Call it where each step
  // enters its first collective wait (before the gradients' all-reduce):
  // when a rank stops after step N and the others wait for it in step
  // N+1's collective, every rank reports step N, and the watchdog tells the
  // one that stopped by its older last beat (Watchdog::culprit); without
  // this beat the step-N beats of all ranks came at the same moment. Not
  // rate-limited (the Python client's automatic ones are): once per step.
  void forward() noexcept {
    if (!fd_) return;
    char buf[heartbeat_wire::kMaxDatagramBytes];
    const int n = std::snprintf(buf, sizeof(buf), "%s%" PRId64 "\n",
                                heartbeat_wire::kPrefixForward, rank_);
    send(buf, n);
  }

  // Sends "ss <rank> <name>\n" unless a section of that name is already open.
  void start_section(std::string_view name) noexcept { section(name, true); }
  // Sends "se <rank> <name>\n" when the outermost one of that name ends; an
  // end without a start is ignored.
  void end_section(std::string_view name) noexcept { section(name, false); }

  // The name as sent: invalid characters become '_', cut to kMaxSectionBytes.
  static std::string section_name(std::string_view name) {
    std::string out(name.substr(0, heartbeat_wire::kMaxSectionBytes));
    for (char& c : out) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
      if (!ok) c = '_';
    }
    return out.empty() ? "section" : out;
  }

 private:
  void section(std::string_view name, bool start) noexcept {
    if (!fd_) return;
    try {
      const std::string key = section_name(name);
      {
        base::MutexLock lock(mu_);
        int& depth = open_sections_[key];
        const int before = depth;
        depth = start ? depth + 1 : (depth > 0 ? depth - 1 : 0);
        if (depth == 0) open_sections_.erase(key);
        // Only the outermost start (0 -> 1) and end (1 -> 0) are sent.
        if (start ? before != 0 : before != 1) return;
      }
      char buf[heartbeat_wire::kMaxDatagramBytes];
      const int n = std::snprintf(buf, sizeof(buf), "%s%" PRId64 " %s\n",
                                  start ? heartbeat_wire::kPrefixSectionStart
                                        : heartbeat_wire::kPrefixSectionEnd,
                                  rank_, key.c_str());
      send(buf, n);
    } catch (...) {
      // std::bad_alloc from the name: the section is dropped, never thrown.
    }
  }

  void send(const char* buf, int n) noexcept {
    if (n <= 0 || static_cast<std::size_t>(n) >= heartbeat_wire::kMaxDatagramBytes) return;
    ssize_t rc;
    do {
      rc = ::sendto(fd_.get(), buf, static_cast<std::size_t>(n), MSG_DONTWAIT | MSG_NOSIGNAL,
                    reinterpret_cast<const sockaddr*>(&addr_), addr_len_);
    } while (rc < 0 && errno == EINTR);
    // Any other failure drops this datagram; the next one tries again.
  }

  base::ScopedFd fd_;
  base::Mutex mu_;
  std::map<std::string, int> open_sections_ GUARDED_BY(mu_);
  int64_t rank_ = 0;
  sockaddr_un addr_{};
  socklen_t addr_len_ = 0;
};

// Process-wide client, created on first use (thread-safe static init).
inline HeartbeatClient& default_heartbeat_client() noexcept {
  static HeartbeatClient client;
  return client;
}

// Convenience: ddprun::watchdog::beat(step) from anywhere in a worker.
inline void beat(int64_t step = heartbeat_wire::kNoStep) noexcept {
  default_heartbeat_client().beat(step);
}

inline void start_section(std::string_view name) noexcept {
  default_heartbeat_client().start_section(name);
}
inline void end_section(std::string_view name) noexcept {
  default_heartbeat_client().end_section(name);
}

// RAII: the section ends when the guard goes out of scope, exception or not.
class Section {
 public:
  explicit Section(std::string_view name) : name_(HeartbeatClient::section_name(name)) {
    start_section(name_);
  }
  ~Section() { end_section(name_); }
  Section(const Section&) = delete;
  Section& operator=(const Section&) = delete;

 private:
  std::string name_;
};

}  // namespace ddprun::watchdog
