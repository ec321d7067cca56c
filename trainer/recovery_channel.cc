#include "trainer/recovery_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "base/contract.h"
#include "base/recovery_wire.h"
#include "base/system_error.h"
#include "trainer/log.h"

namespace ddprun::trainer {
namespace wire = base::recovery_wire;

namespace {

bool unset(const char* v) { return v == nullptr || v[0] == '\0'; }

// A decimal in [0, max], the whole string; false otherwise.
bool parse_decimal(const char* v, long long max, long long* out) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || x < 0 || x > max) return false;
  *out = x;
  return true;
}

[[noreturn]] void bad(const char* name, const char* value, const std::string& why) {
  throw TrainerError(std::string(name) + "=" + (value ? value : "") + ": " + why +
                     " (docs/RECOVERY.md)");
}

}  // namespace

RecoveryEnv parse_recovery_env(const char* scope, const char* fd, const char* generation,
                               const char* standby) {
  RecoveryEnv env;
  if (unset(scope) || std::string_view(scope) == "group") {
    if (!unset(standby)) bad(base::kEnvStandby, standby, "a standby needs the rank restart scope");
    return env;
  }
  if (std::string_view(scope) != "rank") bad(base::kEnvRestartScope, scope, "not rank or group");
  env.rank_scope = true;
  long long n = 0;
  if (unset(fd)) bad(base::kEnvRecoveryFd, fd, "unset, but the restart scope is rank");
  if (!parse_decimal(fd, 1 << 20, &n)) bad(base::kEnvRecoveryFd, fd, "not a descriptor number");
  int type = 0;
  socklen_t len = sizeof type;
  if (::fcntl(int(n), F_GETFD) < 0) bad(base::kEnvRecoveryFd, fd, "not an open descriptor");
  if (::getsockopt(int(n), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    bad(base::kEnvRecoveryFd, fd, "not a SOCK_SEQPACKET socket");
  }
  env.fd = int(n);
  if (!unset(generation)) {
    if (!parse_decimal(generation, wire::kMaxGeneration, &n)) {
      bad(base::kEnvGeneration, generation, "not a generation (0 or more)");
    }
    env.generation = n;
  }
  if (!unset(standby)) {
    if (!parse_decimal(standby, 1 << 20, &n) || n < 1) {
      bad(base::kEnvStandby, standby, "not a standby number (1 or more)");
    }
    env.standby = int(n);
  }
  return env;
}

RecoveryChannel::RecoveryChannel(int fd, int64_t generation, int standby)
    : fd_(fd), generation_(generation), standby_(standby) {
  // Nothing train starts should hold the agent's channel open.
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) (void)::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

bool RecoveryChannel::requested() {
  drain();
  return fallback_ || failed_generation_ > generation_;
}

void RecoveryChannel::drain() {
  // One byte over the limit: MSG_TRUNC then reports a longer packet's size.
  std::array<char, wire::kMaxPacketBytes + 1> buf;
  while (!closed_) {
    const ssize_t n = ::recv(fd_.get(), buf.data(), buf.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0) log_warn("recovery channel: recv: %s; no more recovery messages",
                        base::errno_text(errno).c_str());
    if (n <= 0) {
      closed_ = true;  // 0: the agent's end is gone, nothing more can come
      return;
    }
    if (size_t(n) > wire::kMaxPacketBytes) {
      log_error("recovery channel: a %zd-byte packet ignored (limit %zu)", n,
                wire::kMaxPacketBytes);
      continue;
    }
    take(std::string(buf.data(), size_t(n)));
  }
}

void RecoveryChannel::take(const std::string& packet) {
  const std::optional<wire::Message> m = wire::parse(packet);
  if (!m) {
    log_error("recovery channel: malformed packet ignored: '%s'", packet.c_str());
    return;
  }
  // parse() rejected a known event without the fields it needs.
  if (m->event == wire::Event::kFailed) {
    if (m->generation > failed_generation_) {
      failed_generation_ = m->generation;
      failed_ranks_ = m->ranks;
    }
  } else if (m->event == wire::Event::kAssign) {
    if (standby_ == 0 || assigned_) {
      log_error("recovery channel: event=assign to a process that is no standby ignored: '%s'",
                packet.c_str());
    } else {
      assigned_ = Assignment{m->rank, m->local_rank, m->generation};
    }
  } else if (m->event == wire::Event::kFallback) {
    fallback_ = true;
    fallback_reason_ = wire::name(m->reason);
  }
  // ready (informational) and events added later: nothing to do.
}

int64_t RecoveryChannel::wait_failed(Clock::time_point deadline, const std::string& what) {
  for (;;) {
    drain();
    if (fallback_) {
      throw TrainerError("rank-scoped recovery gave up (event=fallback reason=" +
                         fallback_reason_ + "): the agent restarts the group");
    }
    if (failed_generation_ > generation_) return generation_ = failed_generation_;
    if (closed_) {
      throw TrainerError("recovery channel closed by the agent while waiting for event=failed");
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      throw TrainerError("no event=failed for generation " + std::to_string(generation_ + 1) +
                         " within " + what);
    }
    // Rounded up: a poll that ends just short of the deadline would spin.
    const long long left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, int(std::min<long long>(left, 60000))) < 0 && errno != EINTR) {
      throw TrainerError("recovery channel: poll: " + base::errno_text(errno));
    }
  }
}

std::optional<Assignment> RecoveryChannel::wait_assigned(const volatile std::sig_atomic_t* stop) {
  for (;;) {
    drain();
    if (assigned_) {
      generation_ = assigned_->generation;
      standby_ = 0;
      return assigned_;
    }
    if (stop != nullptr && *stop != 0) return std::nullopt;
    if (closed_) {
      throw TrainerError("recovery channel closed by the agent before this standby was assigned "
                         "a rank");
    }
    // SIGTERM interrupts the poll (EINTR); the slice bounds the window
    // between the check above and the poll, where it would not.
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 1000) < 0 && errno != EINTR) {
      throw TrainerError("recovery channel: poll: " + base::errno_text(errno));
    }
  }
}

void RecoveryChannel::joined(int rank) {
  wire::Message m;
  m.event = wire::Event::kJoined;
  m.generation = static_cast<int>(generation_);  // <= wire::kMaxGeneration, as parsed
  m.rank = rank;
  const std::string packet = wire::format(m);
  if (closed_) return;
  ssize_t n;
  do {
    n = ::send(fd_.get(), packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    log_warn("recovery channel: '%s' not sent: %s", packet.c_str(),
             base::errno_text(errno).c_str());
  }
}

}  // namespace ddprun::trainer
