// The agent's own rendezvous store, served on a thread of its own.
//
// The agent's event loop is single-threaded and next_round() blocks in
// store calls, so the store cannot share that loop: StoreHost runs a
// rendezvous::Server in a private io_context on one extra thread. Workers
// reach it through DDPRUN_STORE_ADDR; on a multi-node job the other agents
// meet through it.
//
// Move-less RAII owner: the destructor closes every connection and joins
// the thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>

namespace ddprun::rendezvous {
class Server;
}

namespace ddprun::agent {

struct StoreHostOptions {
  // Address to bind: "127.0.0.1" for a single node, "0.0.0.0" for peers.
  std::string bind_host = "127.0.0.1";
  // TCP port; 0 picks a free one.
  uint16_t port = 0;
  // Shared secret for the HMAC challenge; empty means no authentication.
  std::string token;
};

class StoreHost {
 public:
  // Binds and listens at once, then starts the thread. Throws
  // rendezvous::StoreError naming the address when it cannot listen.
  explicit StoreHost(const StoreHostOptions& options);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  uint16_t port() const { return port_; }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<rendezvous::Server> server_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace ddprun::agent
