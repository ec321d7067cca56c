// A free TCP port for MASTER_PORT that no other job can be handed.
//
// torchrun binds port 0, reads the port, closes the socket and binds it
// again later; in between, another job can get the same port. Instead the
// agent binds port 0 with SO_REUSEADDR and keeps the socket: the kernel
// never hands a bound port to anyone else's bind(0). The agent then makes
// that socket itself the listener of the c10d TCPStore it hosts for its
// workers at MASTER_PORT (take_socket(), rendezvous/tcpstore_server.h), as
// torchrun's agent hosts one there: the port stays this job's.
//
// Move-only; the destructor releases the port (unless taken).
#pragma once

#include <string>

#include "base/scoped_fd.h"

namespace ddprun::agent {

class PortReservation {
 public:
  // Binds `addr` (IPv4 or IPv6 literal; a host name is resolved) port
  // `port` (0: a free one). Throws std::runtime_error naming the address
  // on failure.
  explicit PortReservation(const std::string& addr, int port = 0);
  PortReservation(PortReservation&& other) noexcept = default;
  PortReservation& operator=(PortReservation&&) = delete;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;

  int port() const { return port_; }
  // Hands the bound socket over (its new owner keeps the port); -1 once
  // taken.
  int take_socket() { return fd_.release(); }

 private:
  base::ScopedFd fd_;
  int port_ = 0;
};

}  // namespace ddprun::agent
