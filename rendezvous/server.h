// The store server: one Boost.Asio event loop serving thousands of clients.
//
// Runs inside a caller-supplied io_context (the agent embeds it in its own
// loop; ddprun-store runs one of its own). Every connection is bounded: a
// frame that breaks a limit in wire.h, a truncated or garbage frame, or a
// slow-loris client is answered with an error and/or closed, and the server
// keeps serving everyone else. Its memory is bounded as a whole too: the
// table by max_store_bytes, everything the connections buffer (requests
// arriving, requests blocked in get/wait, replies not yet read) by
// max_buffered_bytes, and the slots by per-peer limits, so one host or one
// client without the token cannot take the store from the others. Not
// thread-safe: call from the io_context's thread (or before it runs).
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
  // Connections from one peer address beyond this are closed at accept.
  size_t max_connections_per_peer = wire::kMaxConnectionsPerPeer;
  // With a token: connections that have not authenticated yet, in all and
  // from one peer address; more are closed at accept.
  size_t max_unauthenticated = wire::kMaxUnauthenticated;
  size_t max_unauthenticated_per_peer = wire::kMaxUnauthenticatedPerPeer;
  // ... and from one /24 (IPv6: /64). When all max_unauthenticated slots
  // are taken, a newcomer evicts the oldest unauthenticated connection of
  // the biggest holder instead, if that holds more than its own address;
  // when its subnet's share is taken, the biggest holder of that subnet.
  size_t max_unauthenticated_per_subnet = wire::kMaxUnauthenticatedPerSubnet;
  // Bytes all connections may buffer together (requests being received or
  // blocked, replies not yet sent); past it the biggest holder is closed.
  size_t max_buffered_bytes = wire::kMaxBufferedBytes;
  // A partial frame must complete within this window (slow-loris guard).
  std::chrono::milliseconds partial_frame_timeout = wire::kPartialFrameTimeout;
  // With a token, a client must authenticate within this window.
  std::chrono::milliseconds handshake_timeout = wire::kHandshakeTimeout;
  // Bytes of keys plus values, with each entry's bookkeeping, the table may
  // hold.
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
  // Bytes the connections buffer now (what max_buffered_bytes bounds).
  size_t buffered_bytes() const;
  // Sets `key` before any client can read it (call before the loop runs):
  // a successor's store starts with the job's state (succession.h).
  // Throws StoreError when the table refuses it (full, too large).
  void preload(const std::string& key, wire::Bytes value);
  // Serves an already connected stream socket (a socketpair end in the
  // fuzzer) as if it had been accepted from `peer`.
  void adopt(int fd, const std::string& peer);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
