#include "rendezvous/tcpstore_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <list>
#include <stdexcept>

#include "base/scoped_fd.h"
#include "rendezvous/server_io.h"
#include "rendezvous/server_limits.h"
#include "rendezvous/tcpstore_codec.h"
#include "rendezvous/tcpstore_executor.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using tcpstore::Bytes;

namespace {
// Parsing pauses while this much output waits for a client that does not
// read its replies.
constexpr size_t kMaxTcpStoreOutBuffered = 1 << 20;
}  // namespace

struct TConn;

struct TcpStoreServer::Impl : std::enable_shared_from_this<TcpStoreServer::Impl> {
  Impl(asio::io_context& io, TcpStoreServerOptions o)
      : io(io), options(std::move(o)), acceptor(io), accept_retry(io), log(io.get_executor()),
        executor(options.max_store_bytes) {}
  void admit(tcp::socket s);

  asio::io_context& io;
  TcpStoreServerOptions options;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  RateLimitedLog log;
  Bytes scratch;
  tcpstore::Executor executor;
  std::list<std::shared_ptr<TConn>> conns;
  size_t buffered = 0;
  bool closed = false;
};

struct TConn : std::enable_shared_from_this<TConn> {
  TConn(std::shared_ptr<TcpStoreServer::Impl> s, tcp::socket sk)
      : srv(std::move(s)), sock(std::move(sk)), frame_timer(sock.get_executor()),
        write_timer(sock.get_executor()) {}
  // close() cancelled the wait already; this covers a connection dropped
  // unclosed, so the executor never holds a dangling waiter.
  ~TConn() { srv->executor.cancel(waiter); }

  void start();
  void read_more();
  bool read_paused() const { return closed; }  // read_more checks the rest
  void process();
  // Answers one query; false when it closed the connection.
  bool handle(tcpstore::Request& q);
  void flush();
  void account();
  void fail(const std::string& why);
  void close();

  std::shared_ptr<TcpStoreServer::Impl> srv;
  tcp::socket sock;
  std::string peer;
  std::list<std::shared_ptr<TConn>>::iterator self_it;
  tcpstore::Dialect dialect = tcpstore::Dialect::kUnknown;
  Bytes in;         // received, not yet parsed
  PeekAhead ahead;  // the wait for input's own peek (server_io.h)
  size_t need = 1;  // parse again once `in` holds this many bytes
  Bytes out, sending;
  bool reading = false, writing = false, closed = false, resume_posted = false;
  tcpstore::Executor::Waiter waiter;  // while blocked in WAIT or BARRIER
  size_t charged = 0;
  asio::steady_timer frame_timer, write_timer;
  bool frame_timer_armed = false;
};

void TConn::start() {
  // Weak: the executor calls it from another connection's query, and a
  // connection closed meanwhile has cancelled its wait.
  waiter.on_ready = [weak = weak_from_this()](const Bytes& reply) {
    auto self = weak.lock();
    if (!self || self->closed) return;
    self->out.insert(self->out.end(), reply.begin(), reply.end());
    self->flush();
  };
  boost::system::error_code ec;
  sock.set_option(tcp::no_delay(true), ec);
  sock.non_blocking(true, ec);
  read_more();
}

void TConn::read_more() {
  if (reading || closed || resume_posted || writing || out.size() >= kMaxTcpStoreOutBuffered)
    return;
  if (in.size() >= tcpstore::kMaxFrameSize) return;  // the codec refuses such a frame first
  read_some_into(*this, kReadChunk);
}

void TConn::process() {
  size_t pos = 0, handled = 0;
  while (!closed) {
    if (out.size() >= kMaxTcpStoreOutBuffered) {
      // Send what is built before building more; go on only if it all went.
      flush();
      if (closed || writing) break;
    }
    const uint8_t* front = in.data() + pos;
    size_t avail = in.size() - pos;
    if (avail == 0 || avail < need) break;
    if (dialect == tcpstore::Dialect::kUnknown) {
      dialect = tcpstore::detect_dialect(front, avail);
      if (dialect == tcpstore::Dialect::kUnknown) break;
    }
    if (handled == kRequestsPerTurn) {
      resume_next_turn(*this);
      break;
    }
    auto r = tcpstore::parse_request(dialect, front, avail);
    if (r.kind == tcpstore::ParseResult::kNeedMore) {
      need = r.need;
      if (need <= tcpstore::kMaxFrameSize) in.reserve(pos + need);
      break;
    }
    if (r.kind == tcpstore::ParseResult::kError) return fail("bad query: " + r.error);
    pos += r.consumed;
    need = 1;
    ++handled;
    if (!handle(r.request)) return;
  }
  if (closed) return;
  in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(pos));
  release_if_empty(in);
  run_frame_timer(*this, !in.empty(), "partial query");
  account();
  flush();
}

bool TConn::handle(tcpstore::Request& q) {
  std::string refusal;
  if (!srv->executor.execute(q, out, waiter, refusal)) {
    fail(refusal);
    return false;
  }
  return !closed;  // a reply flushed on the way (a barrier's own) may have failed
}

void TConn::account() {
  if (closed) return;
  size_t now = buffer_charge(in) + buffer_charge(out) + buffer_charge(sending);
  srv->buffered = srv->buffered - charged + now;
  charged = now;
  if (srv->buffered > srv->options.max_buffered_bytes)
    fail("the connections buffer more than " + std::to_string(srv->options.max_buffered_bytes) +
         " bytes; this one holds " + std::to_string(now));
}

void TConn::flush() {
  if (writing || closed || out.empty()) return;
  if (write_directly(*this) || closed) return;
  writing = true;
  write_timer.expires_after(srv->options.partial_frame_timeout);
  write_timer.async_wait([self = shared_from_this()](boost::system::error_code e) {
    if (e || self->closed || !self->writing) return;
    self->fail("replies not read within " +
               std::to_string(self->srv->options.partial_frame_timeout.count()) + " ms");
  });
  asio::async_write(sock, asio::buffer(sending),
                    [self = shared_from_this()](boost::system::error_code e, size_t) {
                      self->writing = false;
                      self->write_timer.cancel();
                      self->sending.clear();
                      release_if_empty(self->sending);
                      if (self->closed) return;
                      if (e) return self->close();
                      self->account();
                      self->flush();
                      if (!self->resume_posted) self->process();  // parsing held back by output
                      self->read_more();
                    });
}

void TConn::fail(const std::string& why) {
  if (closed) return;
  srv->log.warn("tcpstore: closing " + peer + ": " + why);
  close();
}

void TConn::close() {
  if (closed) return;
  srv->executor.cancel(waiter);
  closed = true;
  srv->buffered -= charged;
  charged = 0;
  Bytes().swap(in);
  Bytes().swap(out);  // `sending` may be in the kernel's hands: freed on completion
  boost::system::error_code ec;
  frame_timer.cancel();
  write_timer.cancel();
  sock.shutdown(tcp::socket::shutdown_both, ec);
  sock.close(ec);
  if (!srv->closed) srv->conns.erase(self_it);
}

void TcpStoreServer::Impl::admit(tcp::socket s) {
  boost::system::error_code ignored;
  auto ep = s.remote_endpoint(ignored);
  std::string peer = ignored ? "unknown peer" : ep.address().to_string() + ":" + std::to_string(ep.port());
  if (conns.size() >= options.max_connections) {
    log.warn("tcpstore: refusing a connection from " + peer + ": " +
             std::to_string(options.max_connections) + " connections is the limit");
    s.close(ignored);
    return;
  }
  auto c = std::make_shared<TConn>(shared_from_this(), std::move(s));
  c->peer = peer;
  c->self_it = conns.insert(conns.end(), c);
  c->start();
}

TcpStoreServer::TcpStoreServer(asio::io_context& io, TcpStoreServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  auto& o = impl_->options;
  std::string where = o.listen_fd >= 0 ? "the reserved port" : o.host + ":" + std::to_string(o.port);
  try {
    if (o.listen_fd >= 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (::getsockname(o.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        const base::ScopedFd refused(o.listen_fd);  // ours to close, as on success
        throw std::runtime_error("tcpstore: cannot serve the reserved port: getsockname failed");
      }
      impl_->acceptor.assign(ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), o.listen_fd);
      o.listen_fd = -1;  // the acceptor owns it now
      impl_->acceptor.listen(o.backlog);
      impl_->acceptor.non_blocking(true);  // the accept loop drains the queue without blocking
    } else {
      listen_on(impl_->acceptor, o.host, o.port, o.backlog);
    }
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("tcpstore: cannot listen on " + where + ": " + e.code().message());
  }
  accept_connections(impl_, "tcpstore");
}

TcpStoreServer::~TcpStoreServer() { close(); }

uint16_t TcpStoreServer::port() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void TcpStoreServer::close() { shut_down_server(*impl_); }

void TcpStoreServer::clear() { impl_->executor.clear(); }

size_t TcpStoreServer::num_connections() const { return impl_->conns.size(); }
size_t TcpStoreServer::num_keys() const { return impl_->executor.num_keys(); }
size_t TcpStoreServer::num_waiters() const { return impl_->executor.num_waiters(); }

}  // namespace ddprun::rendezvous
