// ScopedFd: the one owner of a file descriptor in ddprun.
//
// Move-only; the destructor closes the descriptor (errors from close are
// ignored: the descriptor is released either way on Linux, and retrying
// could close a descriptor another thread just got). release() hands the
// number over without closing it, for a child's dup2 or an Asio object that
// takes ownership. make_pipe() returns both ends already owned, so an
// exception between pipe2 and the use of its ends leaks nothing.
//
// ScopedFd is header-only, so header-only clients (the workers' heartbeat
// client) can use it without linking. Not thread-safe: one owner, one thread at a time, like the fd itself.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <utility>

namespace ddprun::base {

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) noexcept : fd_(fd) {}
  ~ScopedFd() { reset(); }
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership without closing; returns the descriptor (or -1).
  int release() { return std::exchange(fd_, -1); }
  // Closes the owned descriptor (if any) and owns `fd` instead. close()
  // is not retried on EINTR: Linux has released the descriptor already.
  void reset(int fd = -1) {
    int old = std::exchange(fd_, fd);
    if (old >= 0 && old != fd) (void)::close(old);
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  ScopedFd read;
  ScopedFd write;
};

// pipe2(flags); throws std::system_error naming "pipe2" on failure
// (EMFILE with a low fd limit).
Pipe make_pipe(int flags = O_CLOEXEC);

// Closes every descriptor numbered `lowest` or above (close_range, else one
// close per number up to the soft limit). Async-signal-safe: for a forked
// child that must not keep what its parent had open.
void close_from(int lowest);

// Writes all of `data`, retrying on EINTR and short writes; false with errno
// set on any other error (EPIPE, EAGAIN on a non-blocking fd).
bool write_fully(int fd, const void* data, size_t size);

// The same on a socket with send(MSG_NOSIGNAL): a peer that closed is EPIPE,
// not SIGPIPE; EAGAIN once SO_SNDTIMEO passed.
bool send_fully(int fd, const void* data, size_t size);

// Reads exactly `size` bytes, retrying on EINTR and short reads; false at
// end of file (errno 0) or on an error (errno set; EAGAIN once SO_RCVTIMEO
// passed on a socket).
bool read_fully(int fd, void* data, size_t size);

}  // namespace ddprun::base
