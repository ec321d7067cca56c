#include "agent/worker_streams.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "agent/spawn.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

[[noreturn]] void fail(const std::string& call) {
  int err = errno;
  throw SpawnError(base::describe_error(call, "", err), err);
}

void open_pipe(base::ScopedFd& read, base::ScopedFd& write) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) fail("pipe2");
  read.reset(fds[0]);
  write.reset(fds[1]);
}

void open_pty(const winsize& size, base::ScopedFd& master, base::ScopedFd& slave,
              const termios* input = nullptr) {
  master.reset(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (master.get() < 0) fail("posix_openpt");
  if (grantpt(master.get()) != 0) fail("grantpt");
  if (unlockpt(master.get()) != 0) fail("unlockpt");
  char name[128];
  if (ptsname_r(master.get(), name, sizeof name) != 0) fail("ptsname_r");
  slave.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (slave.get() < 0) fail(std::string("open ") + name);
  termios t;
  if (tcgetattr(slave.get(), &t) != 0) fail("tcgetattr");
  t.c_oflag &= ~OPOST;  // "\n" stays "\n"; the real terminal adds "\r"
  if (input) {
    // Typed input comes here: edit and echo as ddprun's terminal does.
    constexpr tcflag_t kLocal = ICANON | ISIG | IEXTEN | ECHO | ECHOE | ECHOK | ECHOKE | ECHOCTL;
    t.c_iflag = input->c_iflag;
    std::copy(std::begin(input->c_cc), std::end(input->c_cc), std::begin(t.c_cc));
    t.c_lflag = (t.c_lflag & ~kLocal) | (input->c_lflag & kLocal);
  } else {
    t.c_lflag &= ~(ECHO | ECHONL);  // nothing is typed here
  }
  if (tcsetattr(slave.get(), TCSANOW, &t) != 0) fail("tcsetattr");
  if (size.ws_col > 0 && ioctl(master.get(), TIOCSWINSZ, &size) != 0) fail("TIOCSWINSZ");
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) fail("fcntl");
}

}  // namespace

WorkerStreams open_worker_streams(const StreamPlan& plan) {
  WorkerStreams s;
  if (plan.pty) {
    const bool typed = plan.stdin_mode == StdinMode::kForward && plan.terminal;
    open_pty(plan.size, s.out_read, s.out_write, typed ? &*plan.terminal : nullptr);
    open_pty(plan.size, s.err_read, s.err_write);
  } else {
    open_pipe(s.out_read, s.out_write);
    open_pipe(s.err_read, s.err_write);
  }
  switch (plan.stdin_mode) {
    case StdinMode::kNull:
      s.in_child.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (s.in_child.get() < 0) fail("open /dev/null");
      break;
    case StdinMode::kInherit:
      break;
    case StdinMode::kForward:
      if (plan.pty) {
        // The stdout pty, as on a real terminal: fd 0 and 1 the same device.
        s.in_child.reset(fcntl(s.out_write.get(), F_DUPFD_CLOEXEC, 0));
        if (s.in_child.get() < 0) fail("fcntl");
        s.input.reset(fcntl(s.out_read.get(), F_DUPFD_CLOEXEC, 0));
        if (s.input.get() < 0) fail("fcntl");
        s.input_is_pty = true;
      } else {
        open_pipe(s.in_child, s.input);
      }
      set_nonblocking(s.input.get());
      break;
  }
  return s;
}

bool console_window(int fd, size_t prefix_width, winsize& size) {
  if (ioctl(fd, TIOCGWINSZ, &size) != 0) return false;
  // Leave room for the prefix, so a full-width bar does not wrap (a wrapped
  // line cannot be rewritten in place with '\r').
  if (size.ws_col > prefix_width + 20) size.ws_col -= static_cast<unsigned short>(prefix_width);
  size.ws_xpixel = size.ws_ypixel = 0;
  return true;
}

}  // namespace ddprun::agent
