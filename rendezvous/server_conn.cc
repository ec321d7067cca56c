#include "rendezvous/server_conn.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "rendezvous/auth.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Bytes;

namespace {
// A connection stops parsing while this much output waits to be sent: a
// client that pipelines requests for big replies it does not read gets one
// built, not a queue of them (each costs the loop a copy of the value).
constexpr size_t kMaxConnOutBuffered = 64 * 1024;
// Behind a blocked request a connection buffers at most this much; the rest
// stays in the kernel (TCP pushes back on the client).
constexpr size_t kMaxBufferedBehindWait = kReadChunk;
// Estimated heap a blocked request costs its connection: the parsed
// request, the waiter and its place in the table (its keys are the
// table's to count, once for all asking the same).
constexpr size_t kWaiterBytes = 256;

}  // namespace

void Conn::start() {
  boost::system::error_code ec;
  sock.set_option(tcp::no_delay(true), ec);
  sock.non_blocking(true, ec);
  wire::Greeting g;
  g.auth_required = !srv->options.token.empty();
  if (g.auth_required) {
    nonce = random_nonce();
    g.nonce = nonce;
    handshake_timer.expires_after(srv->options.handshake_timeout);
    handshake_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->closed || self->authed) return;
      self->srv->log.warn("store: closing " + self->peer + ": no authentication within " +
                          std::to_string(self->srv->options.handshake_timeout.count()) + " ms");
      self->close();
    });
  }
  out = wire::encode_greeting(g);
  // A client without a token sends its first request without waiting for
  // the greeting (wire.h), so by the time a connect burst is accepted it is
  // usually here: the greeting then leaves with its reply, one segment and
  // one wake-up of the client instead of two. The wait for input's own
  // peek is done here, so it costs no syscall more.
  if (!g.auth_required) {
    boost::system::error_code peek_ec;
    size_t n = sock.receive(asio::buffer(ahead.buf), tcp::socket::message_peek, peek_ec);
    if (!peek_ec && n > 0) {
      ahead.n = n;
      greeting_held = true;
    }
  }
  if (!greeting_held) flush();
  read_more();
  if (greeting_held) flush();  // nothing was answered (the request blocks, or is partial)
}

size_t Conn::read_allowance() const {
  // Requests already read wait to be answered: read more once they are
  // (a pipelining client would otherwise fill its buffer faster than
  // kRequestsPerTurn drains it).
  if (resume_posted) return 0;
  size_t buffered = in.size() - in_pos;
  // Before authentication only one small frame is legal.
  size_t limit = !authed ? wire::kHeaderSize + wire::kMaxPreAuthFrameSize
                 : pending ? kMaxBufferedBehindWait
                           : wire::kHeaderSize + wire::kMaxFrameSize;
  return buffered >= limit ? 0 : std::min(limit - buffered, kReadChunk);
}

void Conn::read_more() {
  if (reading || closed || closing) return;
  const size_t allowed = read_allowance();
  if (allowed == 0) return;  // resumed after process() or the blocked request
  read_some_into(*this, allowed);
}

void Conn::process() {
  size_t handled = 0;
  while (!pending && !closing && !closed && !shared && out.size() < kMaxConnOutBuffered) {
    if (handled == kRequestsPerTurn) {
      resume_next_turn(*this);
      break;
    }
    const uint8_t* front = in.data() + in_pos;
    size_t avail = in.size() - in_pos;
    auto len = wire::frame_length(front, avail);
    if (!framed && wire::is_tcpstore_hello(front, avail)) {
      // torchrun's agent pointed at a ddprun rendezvous: say so, once.
      if (!srv->tcpstore_noted)
        srv->log.warn("store: closing " + peer + ": " + wire::kNotTcpStore +
                      " (later TCPStore connections are closed without a line)");
      srv->tcpstore_noted = true;
      write_error(out, wire::kNotTcpStore);
      closing = true;
      break;
    }
    framed = framed || len.has_value();
    if (!authed && len && *len > wire::kMaxPreAuthFrameSize) {
      srv->log.warn("store: closing " + peer + ": frame of " + std::to_string(*len) +
                    " bytes before authentication");
      write_error(out, "authentication required first: frame of " + std::to_string(*len) +
                           " bytes exceeds the pre-authentication limit of " +
                           std::to_string(wire::kMaxPreAuthFrameSize));
      closing = true;
      break;
    }
    wire::ParseResult r = wire::parse_request(front, avail);
    if (r.kind == wire::ParseResult::kNeedMore) {
      // Reserve the whole frame once, instead of doubling towards it.
      if (len && *len <= wire::kMaxFrameSize) in.reserve(in_pos + wire::kHeaderSize + *len);
      break;
    }
    if (r.kind == wire::ParseResult::kError) {
      srv->log.warn("store: closing " + peer + ": bad frame: " + r.error);
      write_error(out, "bad frame: " + r.error);
      closing = true;
      break;
    }
    in_pos += r.consumed;
    handle(std::move(r.request));
    ++handled;
  }
  if (in_pos == in.size()) {
    in.clear();
    in_pos = 0;
    release_if_empty(in);
  } else if (in_pos > kReadChunk) {
    in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(in_pos));
    in_pos = 0;
  }
  run_frame_timer(*this, !pending && !closing && in_pos < in.size(), "partial frame");
  account();
  flush();
}

void Conn::fail(const std::string& why) {
  if (closed) return;
  srv->log.warn("store: closing " + peer + ": " + why);
  close();
}

void Conn::authenticate(const wire::Request& q) {
  if (q.op != wire::Op::kAuth) {
    srv->log.warn("store: refused " + peer + ": " + wire::op_name(q.op) + " before authentication");
    write_error(out, "authentication required: this store needs a token (DDPRUN_RDZV_TOKEN)");
    closing = true;
    return;
  }
  const std::string& token = srv->options.token;
  if (!auth_verify(token, wire::kClientAuthLabel, nonce, q.values.at(1), q.values.at(0))) {
    srv->log.warn("store: refused " + peer + ": wrong token");
    write_error(out, "authentication failed: wrong token");
    closing = true;
    return;
  }
  authed = true;
  srv->slots.authenticated(peer_addr);
  srv->unlisted(*this);
  handshake_timer.cancel();
  // The store's half of the proof, over the client's own nonce.
  wire::Writer w(out);
  w.u8(static_cast<uint8_t>(wire::Status::kOk));
  w.str(auth_mac(token, wire::kServerAuthLabel, q.values.at(1), nonce));
}

void Conn::handle(wire::Request q) {
  if (!authed) return authenticate(q);
  if (q.op == wire::Op::kOnClose) {
    on_close_bytes = sizeof(wire::Request) + q.counter.size();
    for (size_t i = 0; i < q.keys.size(); ++i) {
      on_close_bytes += q.keys[i].size() + q.values[i].size() + 2 * sizeof(std::string);
    }
    if (q.keys.empty()) on_close_bytes = 0;
    on_close = q.keys.empty() ? nullptr : std::make_unique<wire::Request>(std::move(q));
    wire::Writer w(out);
    w.u8(static_cast<uint8_t>(wire::Status::kOk));
    return;
  }
  // Kept on the heap only when it blocks (most requests are answered at
  // once; the table keeps no reference to the request itself).
  if (srv->table.execute(q, out, waiter)) return;
  pending = std::make_unique<wire::Request>(std::move(q));
  // Blocked: its memory counts against the buffer limit until it is
  // answered or its timer fires. The keys went to the table, which counts
  // them once for every waiter asking the same (Table::waiting_bytes).
  pending_bytes = kWaiterBytes;
  uint64_t gen = ++wait_gen;
  std::weak_ptr<Conn> weak = shared_from_this();
  waiter.on_ready = [weak, gen](const Table::Answer& answer) {
    auto self = weak.lock();
    if (!self) return;
    // Posted so the table's wake-up loop finishes before this client's
    // next requests run.
    asio::post(self->sock.get_executor(), [self, gen, answer] {
      if (self->closed || !self->pending || gen != self->wait_gen) return;
      self->finish_wait(answer);
    });
  };
  wait_timer.expires_after(std::chrono::milliseconds(pending->timeout_ms));
  wait_timer.async_wait([self = shared_from_this(), gen](boost::system::error_code ec) {
    if (ec || self->closed || !self->pending || gen != self->wait_gen) return;
    self->finish_wait(nullptr);
  });
}

void Conn::finish_wait(const Table::Answer& answer) {
  ++wait_gen;  // retire the other of timer / wake-up
  if (answer == nullptr) {
    srv->table.cancel(waiter);
    wire::Writer w(out);
    w.u8(static_cast<uint8_t>(wire::Status::kTimeout));
  } else {
    wait_timer.cancel();
    if (out.empty() && !writing && answer->size() > kKeepCapacity) {
      shared = answer;
      shared_sent = 0;
    } else {
      out.insert(out.end(), answer->begin(), answer->end());
    }
  }
  pending.reset();
  pending_bytes = 0;
  process();
  read_more();
}

void Conn::account() {
  if (closed) return;
  // The shared answer is charged in shares: N waiters of one all-gather
  // hold one copy between them.
  size_t now = buffer_charge(in) + buffer_charge(out) + buffer_charge(sending) + pending_bytes +
               on_close_bytes + (shared ? shared->size() / static_cast<size_t>(shared.use_count()) : 0);
  srv->buffered = srv->buffered - charged + now;
  charged = now;
  if (srv->used() > srv->options.max_buffered_bytes) srv->enforce_buffer_limit();
}

void Conn::flush() {
  if (writing || closed) return;
  if (shared) return flush_shared();
  if (out.empty()) {
    if (closing) close();
    return;
  }
  // Try a direct write first: the common reply fits the socket buffer and
  // needs no trip through the reactor.
  greeting_held = false;  // `out` starts with it
  if (write_directly(*this)) {
    if (closing) close();
    return;
  }
  if (closed) return;
  write_async(asio::buffer(sending));
}

void Conn::flush_shared() {
  boost::system::error_code ec;
  size_t n = sock.write_some(asio::buffer(*shared) + shared_sent, ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) return close();
  shared_sent += n;
  if (shared_sent == shared->size()) {
    shared.reset();
    account();
    if (closed) return;
    process();  // the requests held behind the answer
    read_more();
    return;
  }
  account();
  if (closed) return;
  write_async(asio::buffer(*shared) + shared_sent);
}

void Conn::write_async(asio::const_buffer rest) {
  writing = true;
  // A client that stops reading its replies must not pin them forever.
  write_timer.expires_after(srv->options.partial_frame_timeout);
  write_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closed || !self->writing) return;
    self->srv->log.warn("store: closing " + self->peer + ": replies not read within " +
                        std::to_string(self->srv->options.partial_frame_timeout.count()) + " ms");
    self->close();
  });
  // `rest` lies in `sending` or `shared`, which stay untouched until the
  // completion (the handler keeps the connection, and so them, alive).
  asio::async_write(sock, rest, [self = shared_from_this()](boost::system::error_code ec, size_t) {
    self->writing = false;
    self->sending.clear();
    release_if_empty(self->sending);
    self->shared.reset();
    self->write_timer.cancel();
    if (self->closed) return;
    if (ec) return self->close();
    self->account();
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
  srv->buffered -= charged;
  charged = 0;
  pending_bytes = 0;
  on_close_bytes = 0;
  Bytes().swap(in);
  if (greeting_held) {
    // A request may have been served (a close for the buffer limit inside
    // process()): the greeting must reach the client first, or it would
    // take the close for a refusal and send the request again.
    greeting_held = false;
    ::send(sock.native_handle(), out.data(), wire::encode_greeting({}).size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  Bytes().swap(out);  // `sending` may still be in the kernel's hands: freed on completion
  if (!writing) shared.reset();
  boost::system::error_code ec;
  wait_timer.cancel();
  frame_timer.cancel();
  handshake_timer.cancel();
  write_timer.cancel();
  sock.shutdown(tcp::socket::shutdown_both, ec);
  sock.close(ec);
  if (!srv->closed) {
    srv->unlisted(*this);
    srv->slots.remove(peer_addr, authed);
    srv->conns.erase(self_it);
  }
}

}  // namespace ddprun::rendezvous
