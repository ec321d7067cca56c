#include "agent/store_host.h"

#include <boost/asio/post.hpp>

#include "rendezvous/server.h"

namespace ddprun::agent {

StoreHost::StoreHost(const StoreHostOptions& options) {
  rendezvous::ServerOptions so;
  so.host = options.bind_host;
  so.port = options.port;
  so.token = options.token;
  // Constructed before the loop runs, on this thread (allowed by server.h).
  server_ = std::make_unique<rendezvous::Server>(io_, so);
  port_ = server_->endpoint().port();
  thread_ = std::thread([this] { io_.run(); });
}

StoreHost::~StoreHost() {
  // close() must run on the loop's thread; then the loop has nothing left.
  boost::asio::post(io_, [this] {
    server_->close();
    io_.stop();
  });
  thread_.join();
  server_.reset();
}

}  // namespace ddprun::agent
