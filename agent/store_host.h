// The agent's own rendezvous store, served on a thread of its own.
//
// The agent's event loop is single-threaded and next_round() blocks in
// store calls, so the store cannot share that loop: StoreHost runs a
// rendezvous::Server in a private io_context on one extra thread. Workers
// reach it through DDPRUN_STORE_ADDR; on a multi-node job the other agents
// meet through it.
//
// The same thread can also serve c10d's TCPStore protocol
// (rendezvous/tcpstore_server.h) at MASTER_ADDR:MASTER_PORT, the store
// TORCHELASTIC_USE_AGENT_STORE=True tells torch's env:// to join as a
// client, as torchrun's agent does. It lives as long as the agent (the
// port stays the job's); clear_tcpstore() empties it for each new attempt,
// as torchrun 2.x's agent starts each round with a new TCPStore (torch
// 2.x's env:// adds no /worker/attempt_<n> prefix, 1.13's does).
//
// Move-less RAII owner: the destructor closes every connection and joins
// the thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

namespace ddprun::rendezvous {
class Server;
class TcpStoreServer;
}

namespace ddprun::agent {

struct StoreHostOptions {
  // Address to bind: "127.0.0.1" for a single node, "0.0.0.0" for peers.
  std::string bind_host = "127.0.0.1";
  // TCP port; 0 picks a free one.
  uint16_t port = 0;
  // Shared secret for the HMAC challenge; empty means no authentication.
  std::string token;
  // Serve ddprun's store (false: only the TCPStore below).
  bool ddprun_store = true;
  // Keys ddprun's store holds before it serves anyone (a successor taking
  // the store over, rendezvous/succession.h).
  std::vector<std::pair<std::string, std::vector<uint8_t>>> preload;
  // Serve the TCPStore on this bound socket (PortReservation::take_socket),
  // which StoreHost then owns; -1: none.
  int tcpstore_fd = -1;
};

class StoreHost {
 public:
  // Binds and listens at once, then starts the thread. Throws
  // rendezvous::StoreError naming the address when it cannot listen.
  explicit StoreHost(const StoreHostOptions& options);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  // ddprun's store's port (0 without one).
  uint16_t port() const { return port_; }
  // The TCPStore's port (0 without one).
  uint16_t tcpstore_port() const { return tcpstore_port_; }
  // Empties the TCPStore's table on the store thread and waits (up to 10 s,
  // then warns) until it is done. Call before an attempt's workers start.
  void clear_tcpstore();

 private:
  boost::asio::io_context io_;
  std::unique_ptr<rendezvous::Server> server_;
  std::unique_ptr<rendezvous::TcpStoreServer> tcpstore_;
  uint16_t port_ = 0;
  uint16_t tcpstore_port_ = 0;
  std::thread thread_;
};

}  // namespace ddprun::agent
