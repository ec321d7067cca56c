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
// Thread safety: beat() may be called from any thread concurrently; the
// socket is created once and sendto on a datagram socket is atomic.
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

#include "base/contract.h"
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
    if (n <= 0 || static_cast<std::size_t>(n) >= sizeof(buf)) return;
    ssize_t rc;
    do {
      rc = ::sendto(fd_.get(), buf, static_cast<std::size_t>(n), MSG_DONTWAIT | MSG_NOSIGNAL,
                    reinterpret_cast<const sockaddr*>(&addr_), addr_len_);
    } while (rc < 0 && errno == EINTR);
    // Any other failure drops this beat; the next one tries again.
  }

 private:
  base::ScopedFd fd_;
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

}  // namespace ddprun::watchdog
