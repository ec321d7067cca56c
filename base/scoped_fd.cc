#include "base/scoped_fd.h"

#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>

namespace ddprun::base {

Pipe make_pipe(int flags) {
  int fds[2];
  if (::pipe2(fds, flags) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  return Pipe{ScopedFd(fds[0]), ScopedFd(fds[1])};
}

void close_from(int lowest) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(lowest), ~0U, 0) == 0) return;
#endif
  rlimit rl{};
  long max = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                 ? static_cast<long>(rl.rlim_cur)
                 : 65536;
  for (long fd = lowest; fd < max; ++fd) (void)::close(static_cast<int>(fd));
}

bool write_fully(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool send_fully(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool read_fully(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace ddprun::base
