// What both store servers (server.cc: ddprun's protocol; tcpstore_server.cc:
// torch's TCPStore protocol) do with their sockets, written once: the accept
// loop, the shutdown and a connection's read pump. `Impl` is the server's state, owned by a
// shared_ptr (the loop's handlers keep it alive), with the members
//   bool closed; asio::io_context& io; tcp::acceptor acceptor (non-blocking);
//   asio::steady_timer accept_retry; RateLimitedLog log;
//   a container `conns` of shared_ptr<connection> with close();
//   void admit(tcp::socket) (the server's own admission rules).
// Single-threaded: the server's event loop runs all of it.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <sys/socket.h>

namespace ddprun::rendezvous {

// A connection's buffer policy, both servers': buffers up to this capacity
// are part of a connection's fixed cost (bounded by the connection limits);
// larger ones are charged to the server's max_buffered_bytes and freed as
// soon as they are empty, so an idle connection that once carried a big
// frame does not keep holding it.
constexpr size_t kKeepCapacity = 1024;

// Opens `acceptor` on host:port (an address literal), with SO_REUSEADDR so
// a restarted store need not wait out TIME_WAIT, and listens; non-blocking,
// as accept_connections drains the queue without blocking. Throws
// boost::system::system_error.
inline void listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host,
                      uint16_t port, int backlog) {
  const boost::asio::ip::tcp::endpoint ep(boost::asio::ip::make_address(host), port);
  acceptor.open(ep.protocol());
  acceptor.set_option(boost::asio::ip::tcp::acceptor::reuse_address(true));
  acceptor.bind(ep);
  acceptor.listen(backlog);
  acceptor.non_blocking(true);
}
inline void release_if_empty(std::vector<uint8_t>& b) {
  if (b.empty() && b.capacity() > kKeepCapacity) std::vector<uint8_t>().swap(b);
}
// What a buffer is charged to max_buffered_bytes.
inline size_t buffer_charge(const std::vector<uint8_t>& b) {
  return b.capacity() > kKeepCapacity ? b.capacity() : 0;
}

// Reads go through one buffer of this size, shared by every connection;
// a connection reads at most one chunk a turn of the event loop.
constexpr size_t kReadChunk = 64 * 1024;
// A connection answers at most this many requests a turn, then yields to
// the others: a pipelined flood of tiny requests (64 KiB holds thousands)
// delays everyone else by one small batch, not by the whole chunk.
constexpr size_t kRequestsPerTurn = 64;

// At most this many connections taken from the kernel's queue a turn.
constexpr size_t kAcceptsPerTurn = 256;

// A connection's wait for input peeks this many bytes (read_some_into):
// enough for the common small requests (a set of 64 bytes and the get
// behind it: 104), a fixed cost of every connection (4 MiB for 16,384).
constexpr size_t kPeekAheadBytes = 256;
struct PeekAhead {
  uint8_t buf[kPeekAheadBytes];
  size_t n = 0;  // what the wait peeked, while its completion runs
};

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

// Yields `c`'s turn after kRequestsPerTurn: what it has read and not
// parsed yet is parsed behind the other connections' ready handlers, then
// it reads again. `Conn` (shared_from_this) has: sock, bool resume_posted
// (read_more() does not read while it is set), closed, process(),
// read_more().
template <typename Conn>
void resume_next_turn(Conn& c) {
  if (c.resume_posted) return;
  c.resume_posted = true;
  boost::asio::post(c.sock.get_executor(), [self = c.shared_from_this()] {
    self->resume_posted = false;
    if (self->closed) return;
    self->process();
    self->read_more();
  });
}

// Runs `c`'s slow-loris clock while `partial` (from the first partial byte
// on: later bytes do not restart it) and stops it otherwise; past the
// server's partial_frame_timeout the connection fails with "<what> not
// completed within N ms". `Conn` (shared_from_this) has: frame_timer,
// bool frame_timer_armed, closed, srv->options.partial_frame_timeout and
// fail(why).
template <typename Conn>
void run_frame_timer(Conn& c, bool partial, const char* what) {
  if (!partial || c.closed) {
    if (c.frame_timer_armed) c.frame_timer.cancel();
    c.frame_timer_armed = false;
    return;
  }
  if (c.frame_timer_armed) return;
  c.frame_timer_armed = true;
  c.frame_timer.expires_after(c.srv->options.partial_frame_timeout);
  c.frame_timer.async_wait([self = c.shared_from_this(), what](boost::system::error_code ec) {
    if (ec || self->closed || !self->frame_timer_armed) return;
    self->fail(std::string(what) + " not completed within " +
               std::to_string(self->srv->options.partial_frame_timeout.count()) + " ms");
  });
}

// Writes c.out without waiting, as much as the socket takes: the common
// reply fits its buffer and needs no trip through the reactor. True when
// all of it went; false with the rest moved to c.sending for the caller to
// send in the background, or with the connection closed (a write error,
// or account() over the buffer limit). `Conn` has: sock, out, sending,
// account(), close().
template <typename Conn>
bool write_directly(Conn& c) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  const size_t n = c.sock.write_some(asio::buffer(c.out), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    c.close();
    return false;
  }
  const bool all = n == c.out.size();
  if (!all) c.sending.assign(c.out.begin() + static_cast<std::ptrdiff_t>(n), c.out.end());
  c.out.clear();
  release_if_empty(c.out);
  c.account();
  return all;
}

// Drops `n` bytes already copied out with MSG_PEEK from the front of the
// socket's receive queue. TCP discards them without copying (MSG_TRUNC,
// tcp(7)); a Unix stream socket (Server::adopt, the fuzzer's socketpair)
// ignores the flag and copies them into `spare`, at least `n` bytes.
inline bool consume_peeked(boost::asio::ip::tcp::socket& s, uint8_t* spare, size_t n) {
  ssize_t r = ::recv(s.native_handle(), spare, n, MSG_TRUNC | MSG_DONTWAIT);
  return r == static_cast<ssize_t>(n);
}

// One read of up to `allowed` bytes into c.in, handed to c.process(); then,
// unless c.read_paused() (closed, closing, or held back by its output), the
// next read is armed. Read directly, then wait: asio's epoll reactor is
// edge-triggered, so waiting is only safe once a read came back short (data
// that arrives after that read raises a fresh edge). `Conn`
// (shared_from_this) has: sock, in, reading, closed, ahead (PeekAhead),
// srv->scratch, account(), process(), close(), read_more() (its own
// preconditions, then read_some_into), and bool read_paused().
//
// The bytes are peeked, answered, and only then taken off the socket. A
// read that empties the receive queue of two or more small pushed segments
// (a client's set and get, sent one after the other) makes Linux send a
// bare ACK at once (tcp_cleanup_rbuf, ICSK_ACK_PUSHED2), even though the
// reply follows microseconds later and carries the same ACK. That ACK was
// 20% of the server's time under 16 set+get clients on loopback (perf: the
// recv path's __tcp_transmit_skb). Peeked, the queue is not empty when the
// kernel decides; the reply then acknowledges everything and clears the
// pending ACK, and the consuming recv finds nothing to acknowledge. The
// cost is one more recv per read, which copies nothing.
template <typename Conn>
void read_some_into(Conn& c, size_t allowed) {
  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  boost::system::error_code ec;
  // Made at the first read, not with the server: its 64 KiB are page
  // faults a launch need not take before its workers.
  if (c.srv->scratch.size() < allowed) c.srv->scratch.resize(allowed);
  const uint8_t* data = c.srv->scratch.data();
  size_t n = c.ahead.n;
  c.ahead.n = 0;
  if (n > 0 && n < kPeekAheadBytes && n <= allowed) {
    data = c.ahead.buf;  // the wait saw the whole queue: no second peek
  } else {
    n = c.sock.receive(asio::buffer(c.srv->scratch.data(), allowed), tcp::socket::message_peek, ec);
  }
  const bool drained = ec == asio::error::would_block || ec == asio::error::try_again;
  if (ec && !drained) return c.close();  // EOF or reset: the client is gone
  if (!drained) {
    c.in.insert(c.in.end(), data, data + n);
    c.account();
    if (c.closed) return;
    // No nested read_more() during process(): it would peek the same bytes.
    c.reading = true;
    c.process();
    c.reading = false;
    if (c.closed) return;
    if (!consume_peeked(c.sock, c.srv->scratch.data(), n)) return c.close();  // n <= scratch's size
    if (c.read_paused()) return;
  }
  c.reading = true;
  if (!drained && n == allowed) {
    // More may be waiting, and no new edge would announce it. One chunk a
    // turn: continue behind the other connections' ready handlers, so a
    // client streaming megabytes (or a flood of tiny frames) costs the
    // others one chunk's work per turn, not the whole socket's.
    asio::post(c.sock.get_executor(), [self = c.shared_from_this()] {
      self->reading = false;
      if (!self->closed) self->read_more();
    });
    return;
  }
  // The wait is itself a peek: asio 1.74's async_wait re-arms the socket
  // in epoll (EPOLL_CTL_MOD) every time it starts, one syscall a request,
  // while a receive that came back short last time is queued without one
  // and performed when the next edge arrives. Its bytes are then used as
  // they are when they are all there was (fewer than the buffer holds).
  c.sock.async_receive(asio::buffer(c.ahead.buf), tcp::socket::message_peek,
                       [self = c.shared_from_this()](boost::system::error_code e, size_t got) {
                         self->reading = false;
                         if (self->closed) return;
                         if (e) return self->close();  // EOF or reset
                         self->ahead.n = got;
                         self->read_more();
                         self->ahead.n = 0;  // not taken (read_more held back): peeked again later
                       });
}

}  // namespace ddprun::rendezvous
