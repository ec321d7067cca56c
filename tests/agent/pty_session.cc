#include "tests/agent/pty_session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <stdexcept>

#include "tests/agent/ddprun_process.h"

namespace ddprun::testing {
namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point until) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

}  // namespace

PtySession::PtySession(std::vector<std::string> args, unsigned short cols) {
  master_ = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master_ < 0 || grantpt(master_) != 0 || unlockpt(master_) != 0)
    throw std::runtime_error("posix_openpt failed");
  std::string slave = ptsname(master_);
  winsize size{};
  size.ws_row = 40;
  size.ws_col = cols;
  ioctl(master_, TIOCSWINSZ, &size);
  if (tcgetattr(master_, &initial_) != 0) throw std::runtime_error("tcgetattr failed");
  args.insert(args.begin(), DDPRUN_BIN);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    // A new session whose controlling terminal is the pty: a terminal window.
    setsid();
    int fd = open(slave.c_str(), O_RDWR);
    if (fd < 0) _exit(126);
    ioctl(fd, TIOCSCTTY, 0);
    dup2(fd, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    if (fd > 2) close(fd);
    execv(argv[0], argv.data());
    _exit(127);
  }
}

PtySession::~PtySession() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    wait_child(pid_, Seconds(10), nullptr);
  }
  if (master_ >= 0) close(master_);
}

termios PtySession::modes() const {
  termios t{};
  if (tcgetattr(master_, &t) != 0) throw std::runtime_error("tcgetattr failed");
  return t;
}

bool PtySession::read_some(Clock::time_point until) {
  pollfd p{master_, POLLIN, 0};
  int r = poll(&p, 1, ms_left(until));
  if (r <= 0) return true;
  char buf[65536];
  ssize_t n = read(master_, buf, sizeof buf);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) return false;  // EIO: every slave descriptor closed
  screen_.append(buf, static_cast<size_t>(n));
  return true;
}

bool PtySession::wait_for(const std::function<bool(const std::string&)>& ready,
                          std::chrono::milliseconds deadline) {
  auto until = Clock::now() + deadline;
  while (!ready(screen_)) {
    if (Clock::now() >= until || !read_some(until)) return ready(screen_);
  }
  return true;
}

void PtySession::type(const std::string& bytes) {
  ssize_t n = write(master_, bytes.data(), bytes.size());
  if (n != static_cast<ssize_t>(bytes.size())) throw std::runtime_error("typing failed");
}

int PtySession::finish(std::chrono::milliseconds deadline) {
  auto until = Clock::now() + deadline;
  // Until ddprun is gone (the pty may stay open a moment longer in a
  // process that inherited it), reading what it shows on the way.
  while (Clock::now() < until && !wait_dead(pid_, Seconds(0))) {
    if (!read_some(std::min(until, Clock::now() + std::chrono::milliseconds(50)))) break;
  }
  int status = 0;
  if (!wait_child(pid_, Seconds(ms_left(until) / 1000 + 1), &status)) {
    kill(pid_, SIGKILL);
    wait_child(pid_, Seconds(10), nullptr);
    pid_ = -1;
    return -1;
  }
  pid_ = -1;
  for (;;) {  // what is left on the screen
    pollfd p{master_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || !read_some(Clock::now())) break;
  }
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace ddprun::testing
