// A c10d TCPStore server (tcpstore_codec.h) for torch's own clients: what
// torchrun's agent hosts at MASTER_ADDR:MASTER_PORT when it tells workers
// TORCHELASTIC_USE_AGENT_STORE=True, so every rank's env:// (and any
// `TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)`) is a client.
//
// The queries are answered on the store's table by tcpstore_executor.h,
// with torch's libuv server's semantics; a connection blocked in WAIT
// keeps being served meanwhile, as CANCEL_WAIT needs. Each connection
// speaks the dialect its first bytes show (torch 1.13 or 2.x).
// Bounded like rendezvous/server.h, more simply: frames by the codec's
// limits, connections by max_connections, the table by max_store_bytes, a
// partial frame or unread replies by partial_frame_timeout; a connection
// that breaks a bound is closed with one (rate-limited) log line, and
// nothing a client does blocks the loop or the other clients.
// Not thread-safe: call from the io_context's thread (or before it runs).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace ddprun::rendezvous {

struct TcpStoreServerOptions {
  // A bound, not yet listening, TCP socket to serve on (the agent's
  // MASTER_PORT reservation); the server owns it from then on. -1: bind
  // host:port instead.
  int listen_fd = -1;
  // Address and port to bind when listen_fd is -1; port 0 picks one.
  std::string host = "0.0.0.0";
  uint16_t port = 0;
  // Connections beyond this are closed at accept.
  size_t max_connections = 16384;
  // A partial query must complete, and a reply being sent must progress,
  // within this window.
  std::chrono::milliseconds partial_frame_timeout{10000};
  // Bytes of keys plus values (queues included) the table may hold; a
  // write past it closes the writer's connection.
  size_t max_store_bytes = size_t{1} << 30;
  // Bytes all connections may buffer together (queries arriving, replies
  // not yet sent); the connection that goes past it is closed.
  size_t max_buffered_bytes = size_t{256} << 20;
  int backlog = 4096;
};

class TcpStoreServer {
 public:
  // Listens at once; throws std::runtime_error naming the address.
  TcpStoreServer(boost::asio::io_context& io, TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  // Stops accepting and closes every connection.
  void close();
  // Empties the table and the queues (a new attempt's workers start from a
  // fresh store, as under torchrun 2.x, whose agent makes a new TCPStore
  // for every round: torch 2.x's env:// adds no per-attempt prefix).
  // Connections and their waits stay.
  void clear();
  size_t num_connections() const;
  size_t num_keys() const;
  // Connections blocked in WAIT or BARRIER (tests wait on this).
  size_t num_waiters() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
