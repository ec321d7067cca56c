#include "base/pidfd.h"

#include <errno.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ddprun::base {

ScopedFd open_pidfd(pid_t pid) {
  return ScopedFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
}

bool wait_readable(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    // Round up so a deadline 0.4 ms away is not a busy loop of 0 ms polls.
    long long ms = left.count() > 0 ? left.count() + 1 : 0;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(ms > 1 << 30 ? 1 << 30 : ms));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0) return true;
    if (r < 0 || std::chrono::steady_clock::now() >= deadline) return false;
  }
}

bool wait_exited(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  ScopedFd fd = open_pidfd(pid);
  if (!fd) return errno == ESRCH;
  return wait_readable(fd.get(), deadline);
}

}  // namespace ddprun::base
