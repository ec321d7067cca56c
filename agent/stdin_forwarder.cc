#include "agent/stdin_forwarder.h"

#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <termios.h>
#include <unistd.h>

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

void StdinForwarder::set_target(base::ScopedFd fd, bool is_pty) {
  target_ = std::move(fd);
  target_is_pty_ = is_pty;
}

void StdinForwarder::read_more() {
  reading_ = true;
  in_.async_read_some(boost::asio::buffer(buf_), [this](const boost::system::error_code& ec,
                                                        size_t n) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (n > 0) {
      forward(buf_.data(), n);
      if (on_line_ && std::memchr(buf_.data(), '\n', n)) on_line_();
    }
    if (ec == boost::asio::error::eof) {
      // Ctrl-D: end of input for the worker. A terminal can still be read
      // after it, so keep reading.
      if (target_is_pty_) {
        forward("\x04", 1);  // VEOF of the worker's pty (canonical mode)
      } else {
        target_.reset();  // the pipe's reader sees EOF
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

void StdinForwarder::forward(const char* data, size_t size) {
  if (target_.get() < 0) return;
  while (size > 0) {
    ssize_t n = ::write(target_.get(), data, size);
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
