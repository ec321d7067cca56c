// A TCP socket bound to 127.0.0.1 on a port the kernel picks: the one way
// the tests get a port, to hold (a port in use, a port taken by something
// that is no store) or to hand on (free_loopback_port: closed again, the
// program under test binds it next).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddprun::testing {

class LoopbackPort {
 public:
  // Bound, not listening; close-on-exec, so a program the test starts
  // does not hold it too. Throws when the kernel gives no port.
  LoopbackPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a = address(0);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      const int err = errno;
      close();
      throw std::runtime_error(std::string("binding a loopback port: ") + std::strerror(err));
    }
    port_ = ntohs(a.sin_port);
  }
  LoopbackPort(LoopbackPort&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), port_(o.port_) {}
  LoopbackPort& operator=(LoopbackPort&&) = delete;
  LoopbackPort(const LoopbackPort&) = delete;
  ~LoopbackPort() { close(); }

  int fd() const { return fd_; }
  uint16_t port() const { return port_; }
  // Frees the port (the socket closes); port() stays what it was.
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // 127.0.0.1:`port`, for a second bind or a connect.
  static sockaddr_in address(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A port the kernel just handed out, closed again: the caller binds it next.
inline uint16_t free_loopback_port() { return LoopbackPort().port(); }

}  // namespace ddprun::testing
