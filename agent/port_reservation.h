// A free TCP port for MASTER_PORT that no other job can be handed.
//
// torchrun binds port 0, reads the port, closes the socket and lets rank 0
// bind it later; in between, another job can get the same port. Instead the
// agent binds port 0 with SO_REUSEADDR and keeps the socket bound, but not
// listening, for the whole job. Linux lets rank 0's TCPStore (which also
// sets SO_REUSEADDR) bind and listen on that port, while the kernel never
// hands a bound port to anyone else's bind(0).
//
// Move-only; the destructor releases the port.
#pragma once

#include <string>

#include "base/scoped_fd.h"

namespace ddprun::agent {

class PortReservation {
 public:
  // Binds `addr` (IPv4 or IPv6 literal; a host name is resolved) port 0.
  // Throws std::runtime_error naming the address on failure.
  explicit PortReservation(const std::string& addr);
  PortReservation(PortReservation&& other) noexcept = default;
  PortReservation& operator=(PortReservation&&) = delete;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;

  int port() const { return port_; }

 private:
  base::ScopedFd fd_;
  int port_ = 0;
};

}  // namespace ddprun::agent
