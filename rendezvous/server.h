// The store server: one Boost.Asio event loop serving thousands of clients.
//
// Runs inside a caller-supplied io_context (the agent embeds it in its own
// loop; ddprun-store runs one of its own). Every connection is bounded: a
// frame that breaks a limit in wire.h, a truncated or garbage frame, or a
// slow-loris client is answered with an error and/or closed, and the server
// keeps serving everyone else. Not thread-safe: call from the io_context's
// thread (or before it runs).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/wire.h"

namespace ddprun::rendezvous {

struct ServerOptions {
  // Address to bind; "0.0.0.0" for every IPv4 interface, "::" for IPv6.
  std::string host = "0.0.0.0";
  // TCP port; 0 picks a free one (learn it from Server::endpoint()).
  uint16_t port = 0;
  // Shared secret; empty means no authentication. Never logged.
  std::string token;
  // Connections beyond this are closed at accept.
  size_t max_connections = wire::kMaxConnections;
  // A partial frame must complete within this window (slow-loris guard).
  std::chrono::milliseconds partial_frame_timeout = wire::kPartialFrameTimeout;
  // With a token, a client must authenticate within this window.
  std::chrono::milliseconds handshake_timeout = wire::kHandshakeTimeout;
  // Bytes of keys plus values the store may hold.
  size_t max_store_bytes = wire::kMaxStoreBytes;
  // listen() backlog: barriers connect thousands of clients at once.
  int backlog = 4096;
};

class Server {
 public:
  // Binds and listens at once; throws StoreError naming the address.
  Server(boost::asio::io_context& io, ServerOptions options);
  // Closes the listener and every connection.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  boost::asio::ip::tcp::endpoint endpoint() const;
  // Stops accepting and closes every connection; blocked clients see EOF.
  void close();
  size_t num_connections() const;
  size_t num_keys() const;
  // Requests blocked in get/wait/multi-get (tests wait on this).
  size_t num_waiters() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Raises the RLIMIT_NOFILE soft limit to the hard limit; returns the new
// soft limit. Servers and benchmarks with thousands of sockets need it.
uint64_t raise_fd_limit();

}  // namespace ddprun::rendezvous
