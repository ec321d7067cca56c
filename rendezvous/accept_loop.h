// What both store servers (server.cc: ddprun's protocol; tcpstore_server.cc:
// torch's TCPStore protocol) do with their listening socket, written once:
// the accept loop and the shutdown. `Impl` is the server's state, owned by a
// shared_ptr (the loop's handlers keep it alive), with the members
//   bool closed; asio::io_context& io; tcp::acceptor acceptor (non-blocking);
//   asio::steady_timer accept_retry; RateLimitedLog log;
//   a container `conns` of shared_ptr<connection> with close();
//   void admit(tcp::socket) (the server's own admission rules).
// Single-threaded: the server's event loop runs all of it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <string>

namespace ddprun::rendezvous {

// At most this many connections taken from the kernel's queue a turn.
constexpr size_t kAcceptsPerTurn = 256;

template <typename Impl>
void accept_connections(const std::shared_ptr<Impl>& impl, const char* server_name) {
  using boost::asio::ip::tcp;
  if (impl->closed) return;
  impl->acceptor.async_accept([self = impl, server_name](boost::system::error_code ec, tcp::socket s) {
    if (self->closed) return;
    if (ec) {
      // Out of descriptors (or similar): back off instead of spinning.
      self->log.warn(std::string(server_name) + ": accept failed: " + ec.message());
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self, server_name](boost::system::error_code e) {
        if (!e) accept_connections(self, server_name);
      });
      return;
    }
    self->admit(std::move(s));
    // Take every connection already queued, not one a turn: behind a
    // flood of connects a good client's would otherwise wait one turn of
    // the loop (every busy connection's chunk) per connection ahead of it.
    for (size_t i = 1; i < kAcceptsPerTurn && !self->closed; ++i) {
      tcp::socket next(self->io);
      self->acceptor.accept(next, ec);
      if (ec) break;  // drained (would block), or an error async_accept reports
      self->admit(std::move(next));
    }
    accept_connections(self, server_name);
  });
}

// Stops accepting and closes every connection; the second call does nothing.
template <typename Impl>
void shut_down_server(Impl& impl) {
  if (impl.closed) return;
  boost::system::error_code ec;
  impl.acceptor.close(ec);
  impl.accept_retry.cancel();
  impl.log.cancel();
  impl.closed = true;
  auto conns = std::move(impl.conns);
  impl.conns.clear();
  for (auto& c : conns) c->close();
}

}  // namespace ddprun::rendezvous
