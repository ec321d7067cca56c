#include "rendezvous/client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "base/scoped_fd.h"
#include "base/system_error.h"
#include "rendezvous/auth.h"

namespace ddprun::rendezvous {

using wire::Op;
using wire::Request;

namespace {

// The connection broke (EOF, reset): the only failure call() may retry.
class ConnectionLost : public StoreError {
 public:
  using StoreError::StoreError;
};

// The connection broke before its greeting arrived. The server writes the
// greeting when it accepts, before it reads a byte (wire.h), so nothing
// sent on it was served (a refusal at accept: a connection limit): safe to
// send again, whatever the request.
class RefusedBeforeGreeting : public ConnectionLost {
 public:
  using ConnectionLost::ConnectionLost;
};

bool is_blocking(Op op) { return op == Op::kGet || op == Op::kWait || op == Op::kMultiGet; }

uint64_t clamp_ms(Duration d) {
  return static_cast<uint64_t>(std::clamp<int64_t>(d.count(), 0, static_cast<int64_t>(wire::kMaxTimeoutMs)));
}

}  // namespace

int Client::ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
}

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      address_(format_host_port(options_.host, options_.port)) {
  connect();
}

Client::~Client() {
  // Collect the acks owed so the close is a FIN, not a reset that could
  // discard a set still in flight.
  if (fd_ >= 0 && !unacked_.empty()) {
    std::string ignored;
    try {
      read_acks(Clock::now() + std::min(options_.op_timeout, Duration(5000)), ignored);
    } catch (const std::exception&) {
    }
  }
  disconnect();
}

void Client::disconnect() {
  if (fd_ >= 0) close_fd(fd_);
  fd_ = -1;
  rbuf_.clear();
  rpos_ = 0;
}

void Client::close_fd(int fd) {
  if (options_.canceller) options_.canceller->remove(fd);  // before the number can be reused
  const base::ScopedFd closing(fd);
}

void Client::throw_if_cancelled(const std::string& what) const {
  if (options_.canceller && options_.canceller->cancelled())
    throw CancelledError("store at " + address_ + ": " + what + " abandoned (ddprun is stopping)");
}

[[noreturn]] void Client::timeout(const std::string& what, Duration after) {
  throw TimeoutError("store at " + address_ + ": " + what + " timed out after " +
                     std::to_string(after.count()) + " ms");
}

bool Client::handshake(Clock::time_point deadline, Clock::time_point overall,
                       std::string& last_error) {
  try {
    Bytes g = read_frame(deadline, "greeting");
    auto greeting = wire::parse_greeting(g.data(), g.size());
    if (!greeting) {
      disconnect();
      throw StoreError("store at " + address_ + ": not a ddprun store (unexpected greeting)");
    }
    authenticate(*greeting, deadline);
    return true;
  } catch (const ConnectionLost& e) {
    last_error = e.what();  // e.g. over the server's connection limit: retry
    disconnect();
    return false;
  } catch (const TimeoutError&) {
    disconnect();
    throw_if_cancelled("connect");
    if (Clock::now() < overall) {
      // This attempt's window passed (a greeting or auth reply lost or
      // late): another connection may fare better.
      last_error = "no greeting or authentication reply within this attempt's window";
      return false;
    }
    throw TimeoutError("store at " + address_ + ": no greeting within " +
                       std::to_string(options_.connect_timeout.count()) + " ms");
  }
}

void Client::authenticate(const wire::Greeting& greeting, Clock::time_point deadline) {
  if (!greeting.auth_required && options_.token.empty()) return;
  if (!greeting.auth_required) {
    // Whoever listens there cannot prove it knows the token: it may be an
    // impostor that would collect every node's records.
    disconnect();
    throw AuthError("store at " + address_ +
                     " asks for no token, but this node holds one (DDPRUN_RDZV_TOKEN): refusing "
                     "a store that cannot prove it knows the token; start the store with the "
                     "same token");
  }
  if (options_.token.empty()) {
    disconnect();
    throw AuthError("store at " + address_ +
                     " requires a token: set DDPRUN_RDZV_TOKEN or --rdzv-conf token=...");
  }
  Request q;
  q.op = Op::kAuth;
  Bytes my_nonce = random_nonce();
  q.values.push_back(auth_mac(options_.token, wire::kClientAuthLabel, greeting.nonce, my_nonce));
  q.values.push_back(my_nonce);
  send_all(wire::encode_request(q), deadline, "auth");
  Bytes payload = read_frame(deadline, "auth");
  wire::Reply reply = wire::parse_reply(Op::kAuth, payload.data(), payload.size());
  if (reply.status != wire::Status::kOk) {
    disconnect();
    throw AuthError("store at " + address_ + " refused the token: " +
                     (reply.error.empty() ? reply.message : reply.error));
  }
  if (!auth_verify(options_.token, wire::kServerAuthLabel, my_nonce, greeting.nonce, reply.value)) {
    disconnect();
    throw AuthError("store at " + address_ +
                     " failed to prove it knows the token: an impostor, or a store started "
                     "with another token");
  }
}

bool Client::arm(Clock::time_point deadline) {
  int left = ms_left(deadline);
  if (left <= 0) return false;
  // Only shorten the socket timeouts when they would overshoot this
  // deadline; a timeout that fires early just loops back here. So the
  // setsockopt calls are rare, not one per call.
  if (armed_ms_ == 0 || armed_ms_ > left) {
    timeval tv{left / 1000, (left % 1000) * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    armed_ms_ = left;
  }
  return true;
}

void Client::send_all(const Bytes& frame, Clock::time_point deadline, const std::string& what) {
  size_t off = 0;
  while (off < frame.size()) {
    if (!arm(deadline)) throw TimeoutError(what);
    ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      armed_ms_ = 0;  // the timeout fired: re-arm from the true time left
      continue;
    }
    const std::string lost = "store at " + address_ + ": connection lost during " + what + ": " +
                             base::errno_text(errno);
    // Before the greeting, only these bytes (not taken) and sets (safe to
    // repeat) went out on this connection.
    if (!greeted_) throw RefusedBeforeGreeting(lost);
    throw ConnectionLost(lost);
  }
}

Bytes Client::read_frame(Clock::time_point deadline, const std::string& what) {
  auto fill = [&](size_t need) {
    while (rbuf_.size() - rpos_ < need) {
      uint8_t tmp[65536];
      // Past the deadline, what already came still counts: this process
      // may have been stopped (SIGSTOP, a frozen container) while the reply
      // arrived on time, and the server is not to blame for that.
      const bool in_time = arm(deadline);
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), in_time ? 0 : MSG_DONTWAIT);
      if (!in_time && n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) throw TimeoutError(what);
      if (n > 0) {
        rbuf_.insert(rbuf_.end(), tmp, tmp + n);
      } else if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
        armed_ms_ = 0;
        continue;
      } else {
        throw ConnectionLost("store at " + address_ + ": connection closed by the server during " +
                             what + (n < 0 ? std::string(": ") + base::errno_text(errno) : ""));
      }
    }
  };
  fill(wire::kHeaderSize);
  uint32_t len = *wire::frame_length(rbuf_.data() + rpos_, rbuf_.size() - rpos_);
  if (len == 0 || len > wire::kMaxFrameSize) {
    disconnect();
    throw StoreError("store at " + address_ + ": reply to " + what + " has bad length " +
                     std::to_string(len));
  }
  fill(wire::kHeaderSize + len);
  Bytes payload(rbuf_.begin() + static_cast<std::ptrdiff_t>(rpos_ + wire::kHeaderSize),
                rbuf_.begin() + static_cast<std::ptrdiff_t>(rpos_ + wire::kHeaderSize + len));
  rpos_ += wire::kHeaderSize + len;
  if (rpos_ == rbuf_.size()) {
    rbuf_.clear();
    rpos_ = 0;
  }
  return payload;
}

void Client::read_greeting(Clock::time_point deadline) {
  Bytes g;
  try {
    g = read_frame(deadline, "greeting");
  } catch (const ConnectionLost& e) {
    throw RefusedBeforeGreeting(e.what());
  }
  auto greeting = wire::parse_greeting(g.data(), g.size());
  if (!greeting) {
    disconnect();
    throw StoreError("store at " + address_ + ": not a ddprun store (unexpected greeting)");
  }
  if (greeting->auth_required) {
    // Our request was refused unread (the store serves nothing before
    // authentication), so the greeting says all there is to say.
    disconnect();
    throw AuthError("store at " + address_ +
                    " requires a token: set DDPRUN_RDZV_TOKEN or --rdzv-conf token=...");
  }
  greeted_ = true;
  refused_since_ = {};
}

Bytes Client::read_reply(Clock::time_point deadline, const std::string& what) {
  if (!greeted_) read_greeting(deadline);
  return read_frame(deadline, what);
}

void Client::back_off_after_refusal(const std::string& why, Clock::time_point deadline) {
  const auto now = Clock::now();
  if (refused_since_ == Clock::time_point{}) {
    refused_since_ = now;
    refusal_backoff_ = std::chrono::milliseconds(10);
  }
  const auto end = std::min(deadline, refused_since_ + options_.connect_timeout);
  if (now + refusal_backoff_ >= end) {
    const auto spent = std::chrono::duration_cast<Duration>(now - refused_since_).count();
    refused_since_ = {};
    throw StoreError("cannot connect to store at " + address_ + " within " + std::to_string(spent) +
                     " ms: it closed every connection before its greeting (" + why + ")");
  }
  std::this_thread::sleep_for(refusal_backoff_);  // as connect() does: the store may be full
  refusal_backoff_ = std::min(refusal_backoff_ * 2, std::chrono::milliseconds(500));
}

void Client::read_acks(Clock::time_point deadline, std::string& error) {
  while (!unacked_.empty()) {
    const std::string what = "set(" + quoted_key(unacked_.front().key) + ")";
    Bytes payload = read_reply(deadline, what);
    wire::Reply reply = wire::parse_reply(Op::kSet, payload.data(), payload.size());
    if (reply.status != wire::Status::kOk && error.empty()) {
      error = "store at " + address_ + ": " + what + ": " +
              (reply.error.empty() ? reply.message : reply.error);
    }
    unacked_.pop_front();
  }
}

void Client::reconnect(Clock::time_point deadline) {
  disconnect();
  // Bounded by the call: a store that has gone (its host agent exited)
  // fails a 1 s call after 1 s, not after connect_timeout (a finished
  // agent's exit barrier sat 20 s in here, past its own slices).
  connect(deadline);
  // Sets whose acknowledgement was lost are repeated: harmless, and the
  // caller was told they succeeded.
  for (const auto& u : unacked_) send_all(u.frame, deadline, "set(" + quoted_key(u.key) + ")");
}

[[noreturn]] void Client::no_answer(const std::string& what, Duration waited) {
  // No reply at all: the store or the path to it is gone. A late reply
  // would be taken for the next call's, so drop the connection.
  disconnect();
  unacked_.clear();
  throw StoreError("store at " + address_ + " did not answer " + what + " within " +
                   std::to_string(waited.count()) + " ms");
}

wire::Reply Client::call(const Request& q, bool retry_safe, const std::string& what) {
  Bytes frame = wire::encode_request(q);
  const Duration waited = is_blocking(q.op) ? Duration(q.timeout_ms) + options_.reply_grace
                                            : options_.op_timeout;
  const auto deadline = Clock::now() + waited;
  std::string ack_error;
  for (int attempt = 0;; ++attempt) {
    throw_if_cancelled(what);
    try {
      if (fd_ < 0) reconnect(deadline);
      if (!retry_safe) {
        // A request that cannot be repeated must not go out on a dead
        // connection: collect the acks owed first, then anything readable
        // is an EOF (server restarted, or closed us after a bad frame).
        try {
          read_acks(deadline, ack_error);
          pollfd p{fd_, POLLIN, 0};
          // Before its greeting a connection has served nothing: what is
          // readable there is the greeting, and an EOF is a refusal, which
          // RefusedBeforeGreeting below sends again safely.
          if (greeted_ && ::poll(&p, 1, 0) > 0) reconnect(deadline);
        } catch (const ConnectionLost&) {
          // The connection died before the acks came (the server restarted
          // before reading those sets). This request has not gone out yet:
          // reconnect, which repeats the unacknowledged sets, and send it there.
          reconnect(deadline);
        }
      }
      // Pipelined: the request goes out before the acks of earlier sets are
      // read, so a set and the next call share one round trip.
      send_all(frame, deadline, what);
      read_acks(deadline, ack_error);
      Bytes payload = read_reply(deadline, what);
      if (!ack_error.empty()) throw StoreError(ack_error);
      wire::Reply reply = wire::parse_reply(q.op, payload.data(), payload.size(),
                                            q.op == Op::kMultiGet ? q.keys.size() : 0);
      if (!reply.error.empty()) {
        disconnect();  // not our store's bytes: nothing after them can be trusted
        throw StoreError("store at " + address_ + ": " + reply.error + " " + what);
      }
      if (reply.status == wire::Status::kError) {
        throw StoreError("store at " + address_ + ": " + what + ": " + reply.message);
      }
      return reply;
    } catch (const RefusedBeforeGreeting& e) {
      disconnect();
      throw_if_cancelled(what);
      back_off_after_refusal(e.what(), deadline);
      --attempt;  // nothing was served: this is still the first attempt
    } catch (const ConnectionLost& e) {
      disconnect();
      throw_if_cancelled(what);
      if (!retry_safe || attempt > 0) throw StoreError(e.what());
    } catch (const TimeoutError&) {
      throw_if_cancelled(what);
      no_answer(what, waited);
    }
  }
}

namespace {
Request make(Op op, std::vector<std::string> keys = {}, std::vector<Bytes> values = {}) {
  Request q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  return q;
}

}  // namespace

void Client::set(const std::string& key, const Bytes& value) {
  // Acknowledged lazily, as TCPStore's set is never acknowledged at all:
  // the ack is read with the next call's reply (or by the destructor), and
  // a failed set is reported by that call. Limits are checked here so the
  // server never has to close the connection over a set.
  const std::string what = "set(" + quoted_key(key) + ")";
  if (key.size() > wire::kMaxKeySize) {
    throw StoreError("store at " + address_ + ": " + what.substr(0, 40) + "...: key longer than " +
                     std::to_string(wire::kMaxKeySize) + " bytes");
  }
  if (value.size() > wire::kMaxValueSize) {
    throw StoreError("store at " + address_ + ": " + what + ": value longer than " +
                     std::to_string(wire::kMaxValueSize) + " bytes");
  }
  const auto deadline = Clock::now() + options_.op_timeout;
  try {
    if (unacked_.size() >= kMaxUnacked) {
      std::string error;
      read_acks(deadline, error);
      if (!error.empty()) throw StoreError(error);
    }
    Unacked u{key, wire::encode_request(make(Op::kSet, {key}, {value}))};
    for (int attempt = 0;; ++attempt) {
      throw_if_cancelled(what);
      try {
        if (fd_ < 0) reconnect(deadline);
        send_all(u.frame, deadline, what);
        unacked_.push_back(std::move(u));
        return;
      } catch (const ConnectionLost& e) {
        disconnect();
        if (attempt > 0) throw StoreError(e.what());
      }
    }
  } catch (const ConnectionLost& e) {
    disconnect();
    throw StoreError(e.what());
  } catch (const TimeoutError&) {
    no_answer(what, options_.op_timeout);
  }
}

Bytes Client::get(const std::string& key, Duration t) {
  Request q = make(Op::kGet, {key});
  q.timeout_ms = clamp_ms(t);
  std::string what = "get(" + quoted_key(key) + ")";
  wire::Reply r = call(q, true, what);
  if (r.status == wire::Status::kTimeout) timeout(what, t);
  return std::move(r.value);
}

int64_t Client::add(const std::string& key, int64_t delta) {
  Request q = make(Op::kAdd, {key});
  q.delta = delta;
  return call(q, false, "add(" + quoted_key(key) + ")").number;
}

Bytes Client::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::string what = "compare_set(" + quoted_key(key) + ")";
  return call(make(Op::kCompareSet, {key}, {expected, desired}), false, what).value;
}

void Client::wait(const std::vector<std::string>& keys, Duration t) {
  Request q = make(Op::kWait, keys);
  q.timeout_ms = clamp_ms(t);
  std::string what = "wait(" + describe_keys(keys) + ")";
  if (call(q, true, what).status == wire::Status::kTimeout) timeout(what, t);
}

bool Client::check(const std::vector<std::string>& keys) {
  return call(make(Op::kCheck, keys), true, "check(" + describe_keys(keys) + ")").flag;
}

bool Client::remove(const std::string& key) {
  return call(make(Op::kDelete, {key}), false, "remove(" + quoted_key(key) + ")").flag;
}

int64_t Client::num_keys() { return call(make(Op::kNumKeys), true, "num_keys").number; }

void Client::append(const std::string& key, const Bytes& value) {
  call(make(Op::kAppend, {key}, {value}), false, "append(" + quoted_key(key) + ")");
}

std::vector<Bytes> Client::multi_get(const std::vector<std::string>& keys, Duration t) {
  Request q = make(Op::kMultiGet, keys);
  q.timeout_ms = clamp_ms(t);
  std::string what = "multi_get(" + describe_keys(keys) + ")";
  wire::Reply r = call(q, true, what);
  if (r.status == wire::Status::kTimeout) timeout(what, t);
  return std::move(r.values);
}

void Client::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("multi_set: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  call(make(Op::kMultiSet, keys, values), true, "multi_set(" + describe_keys(keys) + ")");
}

void Client::ping() { call(make(Op::kPing), true, "ping"); }

bool Client::set_on_close(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                          const std::string& counter) {
  if (keys.size() != values.size()) {
    throw StoreError("set_on_close: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  Request q = make(Op::kOnClose, keys, values);
  q.counter = counter;
  // Not retry-safe: on a fresh connection it would arm writes that the
  // caller believes belong to the connection that just broke.
  call(q, false, keys.empty() ? "set_on_close(cancel)" : "set_on_close(" + describe_keys(keys) + ")");
  return true;
}

std::string Client::local_address() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

}  // namespace ddprun::rendezvous
