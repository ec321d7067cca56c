#include "agent/stdin_forwarder.h"

#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <system_error>

namespace ddprun::agent {
namespace {

int reopen(int fd) {
  // /proc/self/fd/N opens the terminal device again: a description of our own.
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  int own = ::open(path.c_str(), O_RDONLY | O_NOCTTY | O_CLOEXEC);
  if (own < 0) throw std::system_error(errno, std::generic_category(), "open " + path);
  return own;
}

}  // namespace

StdinForwarder::StdinForwarder(boost::asio::io_context& io, int terminal_fd,
                               std::function<void()> on_line)
    : in_(io, reopen(terminal_fd)), on_line_(std::move(on_line)) {}

StdinForwarder::~StdinForwarder() {
  boost::system::error_code ignored;
  in_.close(ignored);
}

void StdinForwarder::start() { read_more(); }

void StdinForwarder::resume() {
  if (!reading_) read_more();
}

void StdinForwarder::add_target(int rank, pid_t pid, base::ScopedFd fd, bool is_pty,
                                bool preferred) {
  targets_.erase(std::remove_if(targets_.begin(), targets_.end(),
                                [&](const Target& t) { return t.rank == rank; }),
                 targets_.end());
  targets_.push_back({rank, pid, std::move(fd), is_pty, preferred});
}

void StdinForwarder::remove_target(pid_t pid) {
  targets_.erase(std::remove_if(targets_.begin(), targets_.end(),
                                [&](const Target& t) { return t.pid == pid; }),
                 targets_.end());
}

namespace {

// The worker's terminal is out of line mode: readline (pdb) reads it.
bool readline_waits(int pty_master) {
  termios t;
  return tcgetattr(pty_master, &t) == 0 && !(t.c_lflag & ICANON);
}

// The worker's main thread is blocked in read(0, ...): a plain input().
bool blocked_reading_stdin(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/syscall";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[64];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return std::strncmp(buf, "0 0x0 ", 6) == 0;  // syscall 0 (read), fd 0
}

}  // namespace

StdinForwarder::Target* StdinForwarder::pick() {
  Target* preferred = nullptr;
  Target* waiting = nullptr;
  for (auto& t : targets_) {
    if (t.preferred) preferred = &t;
    bool waits = (t.is_pty && readline_waits(t.fd.get())) || blocked_reading_stdin(t.pid);
    if (waits && (!waiting || t.preferred)) waiting = &t;
  }
  Target* chosen = waiting ? waiting : preferred ? preferred : nullptr;
  if (!chosen && !targets_.empty()) chosen = &targets_.front();
  if (chosen && chosen->rank != last_rank_) {
    if (last_rank_ >= 0 || !chosen->preferred)
      spdlog::info("typed input goes to rank {}{}", chosen->rank,
                   waiting ? " (it waits for input)" : "");
    last_rank_ = chosen->rank;
  }
  return chosen;
}

void StdinForwarder::read_more() {
  reading_ = true;
  in_.async_read_some(boost::asio::buffer(buf_), [this](const boost::system::error_code& ec,
                                                        size_t n) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (n > 0) {
      // The echo has moved the cursor already: the console learns it before
      // pick() may print which rank gets the line.
      if (on_line_ && std::memchr(buf_.data(), '\n', n)) on_line_();
      forward(pick(), buf_.data(), n);
    }
    if (ec == boost::asio::error::eof) {
      // Ctrl-D: end of input for the worker. A terminal can still be read
      // after it, so keep reading.
      if (Target* t = pick()) {
        if (t->is_pty)
          forward(t, "\x04", 1);  // VEOF of the worker's pty (canonical mode)
        else
          t->fd.reset();  // the pipe's reader sees EOF
      }
      read_more();
      return;
    }
    if (ec) {
      reading_ = false;  // EIO in the background; resume() after SIGCONT
      return;
    }
    read_more();
  });
}

void StdinForwarder::forward(Target* t, const char* data, size_t size) {
  if (!t || t->fd.get() < 0) return;
  while (size > 0) {
    ssize_t n = ::write(t->fd.get(), data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // The worker does not read (its input buffer is full) or is gone:
      // never wait for it on the loop.
      if (!warned_)
        spdlog::warn("the worker reading standard input is not reading it; typed input "
                     "dropped");
      warned_ = true;
      return;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace ddprun::agent
