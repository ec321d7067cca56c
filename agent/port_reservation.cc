#include "agent/port_reservation.h"
#include "base/system_error.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace ddprun::agent {

PortReservation::PortReservation(const std::string& addr, int port) {
  std::string host = addr;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    throw std::runtime_error("cannot resolve master address '" + addr + "': " + gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    base::ScopedFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last_error = base::errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      fd_ = std::move(fd);
      port_ = ntohs(bound.ss_family == AF_INET6
                        ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      break;
    }
    last_error = base::errno_text(errno);
  }
  freeaddrinfo(res);
  if (!fd_)
    throw std::runtime_error("cannot reserve " +
                             (port ? "port " + std::to_string(port) : std::string("a port")) +
                             " on master address '" + addr + "': " + last_error);
}

}  // namespace ddprun::agent
