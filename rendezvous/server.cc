#include "rendezvous/server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <list>

#include "rendezvous/auth.h"
#include "rendezvous/store.h"
#include "rendezvous/table.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Bytes;

namespace {
// A connection stops parsing while this much output waits to be sent, and
// stops reading while a whole frame (plus a header) is already buffered.
constexpr size_t kMaxOutBuffered = 2 * wire::kMaxFrameSize;
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kIdleChunk = 4096;
}  // namespace

struct Conn;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, ServerOptions o)
      : io(io), options(std::move(o)), acceptor(io), accept_retry(io),
        table(options.max_store_bytes) {}
  void accept();

  asio::io_context& io;
  ServerOptions options;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;  // after EMFILE, wait before accepting again
  Table table;
  std::list<std::shared_ptr<Conn>> conns;
  bool closed = false;
};

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(std::shared_ptr<Server::Impl> srv, tcp::socket s)
      : srv(std::move(srv)), sock(std::move(s)), wait_timer(sock.get_executor()),
        frame_timer(sock.get_executor()), handshake_timer(sock.get_executor()),
        write_timer(sock.get_executor()) {}

  void start();
  void read_more();
  void process();
  void handle(wire::Request request);
  void flush();
  void close();
  void update_frame_timer();
  void finish_wait(bool timed_out);

  std::shared_ptr<Server::Impl> srv;
  tcp::socket sock;
  std::string peer;
  std::list<std::shared_ptr<Conn>>::iterator self_it;
  Bytes in;    // received, not yet parsed from in_pos on
  Bytes rbuf;  // read target, reused
  size_t in_pos = 0;
  Bytes out, sending;
  bool reading = false, writing = false;
  bool closing = false;  // close once the output is flushed
  bool closed = false;
  bool authed = false;
  Bytes nonce;
  // kOnClose writes to run when the client goes away (wire.h).
  std::unique_ptr<wire::Request> on_close;
  // The blocked request, if any; later requests wait behind it.
  std::unique_ptr<wire::Request> pending;
  Table::Waiter waiter;
  uint64_t wait_gen = 0;
  asio::steady_timer wait_timer, frame_timer, handshake_timer, write_timer;
  bool frame_timer_armed = false;
};

void Conn::start() {
  boost::system::error_code ec;
  sock.set_option(tcp::no_delay(true), ec);
  sock.non_blocking(true, ec);
  auto ep = sock.remote_endpoint(ec);
  peer = ec ? "unknown peer" : ep.address().to_string() + ":" + std::to_string(ep.port());
  wire::Greeting g;
  g.auth_required = !srv->options.token.empty();
  authed = !g.auth_required;
  if (g.auth_required) {
    nonce = random_nonce();
    g.nonce = nonce;
    handshake_timer.expires_after(srv->options.handshake_timeout);
    handshake_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->closed || self->authed) return;
      spdlog::warn("store: closing {}: no authentication within {} ms", self->peer,
                   self->srv->options.handshake_timeout.count());
      self->close();
    });
  }
  out = wire::encode_greeting(g);
  flush();
  read_more();
}

void Conn::read_more() {
  if (reading || closed || closing) return;
  // Read directly until the socket is drained, then wait for readiness.
  // asio's epoll reactor is edge-triggered and its async_wait does not read
  // speculatively, so waiting is only safe once a read came back short:
  // data that arrives after that read raises a fresh edge. This saves the
  // EAGAIN read async_read_some would make on every request.
  for (;;) {
    size_t buffered = in.size() - in_pos;
    if (buffered > wire::kMaxFrameSize + wire::kHeaderSize) return;  // resumed after process()
    rbuf.resize(buffered == 0 ? kIdleChunk : kReadChunk);
    boost::system::error_code ec;
    size_t n = sock.read_some(asio::buffer(rbuf), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) break;
    if (ec) return close();  // EOF or reset: the client is gone
    in.insert(in.end(), rbuf.begin(), rbuf.begin() + static_cast<std::ptrdiff_t>(n));
    process();
    if (closed || closing) return;
    if (n < rbuf.size()) break;
  }
  reading = true;
  sock.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
    self->reading = false;
    if (self->closed) return;
    if (ec) return self->close();
    self->read_more();
  });
}

void Conn::process() {
  while (!pending && !closing && !closed && out.size() < kMaxOutBuffered) {
    wire::ParseResult r = wire::parse_request(in.data() + in_pos, in.size() - in_pos);
    if (r.kind == wire::ParseResult::kNeedMore) break;
    if (r.kind == wire::ParseResult::kError) {
      spdlog::warn("store: closing {}: bad frame: {}", peer, r.error);
      write_error(out, "bad frame: " + r.error);
      closing = true;
      break;
    }
    in_pos += r.consumed;
    handle(std::move(r.request));
  }
  if (in_pos == in.size()) {
    in.clear();
    in_pos = 0;
  } else if (in_pos > kReadChunk) {
    in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(in_pos));
    in_pos = 0;
  }
  update_frame_timer();
  flush();
}

void Conn::update_frame_timer() {
  bool partial = !pending && !closing && in_pos < in.size();
  if (!partial) {
    if (frame_timer_armed) frame_timer.cancel();
    frame_timer_armed = false;
    return;
  }
  if (frame_timer_armed) return;  // the clock runs from the first partial byte
  frame_timer_armed = true;
  frame_timer.expires_after(srv->options.partial_frame_timeout);
  frame_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closed || !self->frame_timer_armed) return;
    spdlog::warn("store: closing {}: partial frame not completed within {} ms", self->peer,
                 self->srv->options.partial_frame_timeout.count());
    self->close();
  });
}

void Conn::handle(wire::Request q) {
  if (!authed) {
    if (q.op != wire::Op::kAuth) {
      spdlog::warn("store: refused {}: {} before authentication", peer, wire::op_name(q.op));
      write_error(out, "authentication required: this store needs a token (DDPRUN_STORE_TOKEN)");
      closing = true;
      return;
    }
    if (!auth_verify(srv->options.token, nonce, q.values.at(0))) {
      spdlog::warn("store: refused {}: wrong token", peer);
      write_error(out, "authentication failed: wrong token");
      closing = true;
      return;
    }
    authed = true;
    handshake_timer.cancel();
    wire::Writer w(out);
    w.u8(static_cast<uint8_t>(wire::Status::kOk));
    return;
  }
  if (q.op == wire::Op::kOnClose) {
    on_close = q.keys.empty() ? nullptr : std::make_unique<wire::Request>(std::move(q));
    wire::Writer w(out);
    w.u8(static_cast<uint8_t>(wire::Status::kOk));
    return;
  }
  pending = std::make_unique<wire::Request>(std::move(q));
  if (srv->table.execute(*pending, out, waiter)) {
    pending.reset();
    return;
  }
  uint64_t gen = ++wait_gen;
  std::weak_ptr<Conn> weak = shared_from_this();
  waiter.on_ready = [weak, gen] {
    auto self = weak.lock();
    if (!self) return;
    // Posted so the table's notify loop finishes before this client's next
    // requests run.
    asio::post(self->sock.get_executor(), [self, gen] {
      if (self->closed || !self->pending || gen != self->wait_gen) return;
      self->finish_wait(false);
    });
  };
  wait_timer.expires_after(std::chrono::milliseconds(pending->timeout_ms));
  wait_timer.async_wait([self = shared_from_this(), gen](boost::system::error_code ec) {
    if (ec || self->closed || !self->pending || gen != self->wait_gen) return;
    self->finish_wait(true);
  });
}

void Conn::finish_wait(bool timed_out) {
  ++wait_gen;  // retire the other of timer / wake-up
  if (timed_out) {
    srv->table.cancel(waiter);
    wire::Writer w(out);
    w.u8(static_cast<uint8_t>(wire::Status::kTimeout));
  } else {
    wait_timer.cancel();
    srv->table.answer_ready(*pending, out);
  }
  pending.reset();
  process();
  read_more();
}

void Conn::flush() {
  if (writing || closed) return;
  if (out.empty()) {
    if (closing) close();
    return;
  }
  // Try a direct write first: the common reply fits the socket buffer and
  // needs no trip through the reactor.
  boost::system::error_code ec;
  size_t n = sock.write_some(asio::buffer(out), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) return close();
  if (n == out.size()) {
    out.clear();
    if (closing) close();
    return;
  }
  sending.assign(out.begin() + static_cast<std::ptrdiff_t>(n), out.end());
  out.clear();
  writing = true;
  // A client that stops reading its replies must not pin them forever.
  write_timer.expires_after(srv->options.partial_frame_timeout);
  write_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closed || !self->writing) return;
    spdlog::warn("store: closing {}: replies not read within {} ms", self->peer,
                 self->srv->options.partial_frame_timeout.count());
    self->close();
  });
  asio::async_write(sock, asio::buffer(sending),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      self->writing = false;
                      self->sending.clear();
                      self->write_timer.cancel();
                      if (self->closed) return;
                      if (ec) return self->close();
                      self->process();  // may resume parsing held back by output
                      self->read_more();
                    });
}

void Conn::close() {
  if (closed) return;
  closed = true;
  if (pending) srv->table.cancel(waiter);
  pending.reset();
  // The server's own shutdown is no sign of the client's death.
  if (on_close && !srv->closed) srv->table.run_on_close(*on_close);
  on_close.reset();
  boost::system::error_code ec;
  wait_timer.cancel();
  frame_timer.cancel();
  handshake_timer.cancel();
  write_timer.cancel();
  sock.shutdown(tcp::socket::shutdown_both, ec);
  sock.close(ec);
  if (!srv->closed) srv->conns.erase(self_it);
}

void Server::Impl::accept() {
  if (closed) return;
  acceptor.async_accept([self = shared_from_this()](boost::system::error_code ec, tcp::socket s) {
    if (self->closed) return;
    if (ec) {
      // Out of descriptors (or similar): back off instead of spinning.
      spdlog::warn("store: accept failed: {}", ec.message());
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](boost::system::error_code e) {
        if (!e) self->accept();
      });
      return;
    }
    if (self->conns.size() >= self->options.max_connections) {
      boost::system::error_code ignored;
      auto ep = s.remote_endpoint(ignored);
      spdlog::warn("store: refusing {}: {} connections is the limit",
                   ep.address().to_string(), self->options.max_connections);
      s.close(ignored);
    } else {
      auto c = std::make_shared<Conn>(self, std::move(s));
      c->self_it = self->conns.insert(self->conns.end(), c);
      c->start();
    }
    self->accept();
  });
}

Server::Server(asio::io_context& io, ServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  const auto& o = impl_->options;
  std::string where = o.host + ":" + std::to_string(o.port);
  try {
    tcp::endpoint ep(asio::ip::make_address(o.host), o.port);
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(o.backlog);
  } catch (const boost::system::system_error& e) {
    throw StoreError("store server: cannot listen on " + where + ": " + e.code().message());
  }
  impl_->accept();
}

Server::~Server() { close(); }

tcp::endpoint Server::endpoint() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec);
}

void Server::close() {
  if (impl_->closed) return;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  impl_->accept_retry.cancel();
  impl_->closed = true;
  auto conns = std::move(impl_->conns);
  impl_->conns.clear();
  for (auto& c : conns) c->close();
}

size_t Server::num_connections() const { return impl_->conns.size(); }
size_t Server::num_keys() const { return impl_->table.num_keys(); }
size_t Server::num_waiters() const { return impl_->table.num_waiters(); }

uint64_t raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace ddprun::rendezvous
