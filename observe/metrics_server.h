// MetricsServer: the Prometheus scrape endpoint of `--metrics-port`, a
// minimal HTTP/1.1 server on the agent's io_context.
//
// GET (or HEAD) /metrics answers 200 with `render()`'s text; / answers a
// line pointing there; any other path 404, any other method 405. One
// request per connection ("Connection: close"), as Prometheus is happy
// with. Why not prometheus-cpp: its pull exposer is CivetWeb, a C web
// server with threads of its own, and three shared libraries (prometheus-cpp
// core and pull, civetweb) the self-contained ddprun and its wheel would
// have to carry; the exporter needs one GET and one text body, which this
// file serves with the Asio loop the agent already runs, no lock and no
// thread (docs/observability.md has the comparison).
//
// Never blocks the loop: every read and write is asynchronous, and each
// connection has one deadline for its whole life (request and reply) after
// which it is closed, so a scraper that stops reading costs a socket and a
// copy of the body until then, no more. A request larger than
// kMaxRequestBytes is closed unanswered; past max_connections open at once
// new ones are closed at accept.
//
// Thread safety: io_context thread only; `render` runs there.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/liveness.h"

namespace ddprun::observe {

struct MetricsServerOptions {
  // An IP address (IPv4 or IPv6), not a name: 127.0.0.1 keeps the metrics
  // on this host; 0.0.0.0 or :: serve every interface.
  std::string address = "127.0.0.1";
  // 0: a free port the system picks (port() says which).
  uint16_t port = 0;
  // A connection's whole life: reading the request and writing the reply.
  std::chrono::milliseconds deadline{10000};
  // Connections open at once; more are closed at accept.
  int max_connections = 16;
};

class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  // Listens at once; throws std::runtime_error naming address and port
  // (a port in use, an address that is not an IP address).
  MetricsServer(boost::asio::io_context& io, MetricsServerOptions options, Render render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const { return port_; }
  // http://ADDRESS:PORT/metrics (IPv6 addresses in brackets).
  std::string url() const;

  // Largest request (request line and headers) read.
  static constexpr std::size_t kMaxRequestBytes = 8192;

 private:
  void accept();

  boost::asio::io_context& io_;
  MetricsServerOptions options_;
  Render render_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::shared_ptr<int> open_ = std::make_shared<int>(0);  // connections open now
  base::Liveness alive_;
};

// The reply to one request (its first line and headers, as read): status
// line, headers and, except for HEAD, the body. Pure, for tests.
std::string http_reply(const std::string& request, const MetricsServer::Render& render);

}  // namespace ddprun::observe
