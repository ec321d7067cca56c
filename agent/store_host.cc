#include "agent/store_host.h"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <future>

#include "rendezvous/server.h"
#include "rendezvous/tcpstore_server.h"

namespace ddprun::agent {

StoreHost::StoreHost(const StoreHostOptions& options) {
  // Constructed before the loop runs, on this thread (allowed by server.h).
  if (options.ddprun_store) {
    rendezvous::ServerOptions so;
    so.host = options.bind_host;
    so.port = options.port;
    so.token = options.token;
    server_ = std::make_unique<rendezvous::Server>(io_, so);
    for (const auto& [key, value] : options.preload) server_->preload(key, value);
    port_ = server_->endpoint().port();
  }
  if (options.tcpstore_fd >= 0) {
    rendezvous::TcpStoreServerOptions to;
    to.listen_fd = options.tcpstore_fd;
    tcpstore_ = std::make_unique<rendezvous::TcpStoreServer>(io_, to);
    tcpstore_port_ = tcpstore_->port();
  }
  thread_ = std::thread([this] { io_.run(); });
}

void StoreHost::clear_tcpstore() {
  if (!tcpstore_) return;
  auto done = std::make_shared<std::promise<void>>();
  auto cleared = done->get_future();
  boost::asio::post(io_, [this, done] {
    tcpstore_->clear();
    done->set_value();
  });
  // The store thread only runs ddprun's own handlers, each short.
  if (cleared.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
    spdlog::warn("the TCPStore at MASTER_PORT was not cleared within 10 s; "
                 "the new attempt may see the last one's keys");
}

StoreHost::~StoreHost() {
  // close() must run on the loop's thread; then the loop has nothing left.
  boost::asio::post(io_, [this] {
    if (server_) server_->close();
    if (tcpstore_) tcpstore_->close();
    io_.stop();
  });
  thread_.join();
  server_.reset();
  tcpstore_.reset();
}

}  // namespace ddprun::agent
