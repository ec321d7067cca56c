#include "rendezvous/tcpstore_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <deque>
#include <list>
#include <stdexcept>
#include <unordered_map>

#include "base/scoped_fd.h"
#include "rendezvous/server_io.h"
#include "rendezvous/server_limits.h"
#include "rendezvous/tcpstore_codec.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using tcpstore::Bytes;
using tcpstore::Op;

namespace {
// Reads go through one buffer of this size shared by every connection; a
// connection reads at most one chunk a turn of the loop.
constexpr size_t kReadChunk = 64 * 1024;
// A connection answers at most this many queries a turn, then yields.
constexpr size_t kQueriesPerTurn = 64;
// Parsing pauses while this much output waits for a client that does not
// read its replies.
constexpr size_t kMaxOutBuffered = 1 << 20;
// What an entry costs beyond its key and value bytes (node, hash slot).
constexpr size_t kEntryOverhead = 64;
// Empty buffers keep at most this capacity (an idle connection that once
// carried a big value does not keep holding it).
constexpr size_t kKeepCapacity = 4096;
void release(Bytes& b) {
  if (b.empty() && b.capacity() > kKeepCapacity) Bytes().swap(b);
}
constexpr uint8_t kReady = 0, kNotReady = 1;           // CheckResponseType
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WaitResponseType
}  // namespace

struct TConn;

struct TcpStoreServer::Impl : std::enable_shared_from_this<TcpStoreServer::Impl> {
  Impl(asio::io_context& io, TcpStoreServerOptions o)
      : io(io), options(std::move(o)), acceptor(io), accept_retry(io), log(io.get_executor()) {}
  void admit(tcp::socket s);
  // Table operations; `by` is closed (false returned) when the table is full.
  // Waiters of `key` are woken unless `wake_waiters` is false (a barrier
  // not yet complete).
  bool put(TConn& by, const std::string& key, Bytes value, bool wake_waiters = true);
  bool present(const std::string& key) const;
  // Wakes the waiters of `key` whose every key now exists.
  void wake(const std::string& key);
  // Wakes one waiter of queue `key`.
  void wake_one(const std::string& key);
  void notify(const std::shared_ptr<TConn>& c);

  asio::io_context& io;
  TcpStoreServerOptions options;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  RateLimitedLog log;
  Bytes scratch;
  std::unordered_map<std::string, Bytes> data;
  std::unordered_map<std::string, std::deque<Bytes>> queues;
  size_t store_bytes = 0;
  // Per key, the connections blocked on it (a connection once per time it
  // named the key, as torch counts).
  std::unordered_map<std::string, std::vector<std::weak_ptr<TConn>>> waiting;
  size_t waiters = 0;
  std::list<std::shared_ptr<TConn>> conns;
  size_t buffered = 0;
  bool closed = false;
};

struct TConn : std::enable_shared_from_this<TConn> {
  TConn(std::shared_ptr<TcpStoreServer::Impl> s, tcp::socket sk)
      : srv(std::move(s)), sock(std::move(sk)), frame_timer(sock.get_executor()),
        write_timer(sock.get_executor()) {}

  void start();
  void read_more();
  bool read_paused() const { return closed; }  // read_more checks the rest
  void process();
  // Answers one query; false when it closed the connection.
  bool handle(tcpstore::Request& q);
  void flush();
  void account();
  void update_frame_timer();
  // Drops this connection's registrations as a waiter.
  void cancel_wait();
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
  // While blocked in WAIT/BARRIER: keys not there yet, and the keys named.
  size_t awaited = 0;
  std::vector<std::string> waiting_on;
  size_t charged = 0;
  asio::steady_timer frame_timer, write_timer;
  bool frame_timer_armed = false;
};

void TConn::start() {
  boost::system::error_code ec;
  sock.set_option(tcp::no_delay(true), ec);
  sock.non_blocking(true, ec);
  read_more();
}

void TConn::read_more() {
  if (reading || closed || resume_posted || writing || out.size() >= kMaxOutBuffered) return;
  if (in.size() >= tcpstore::kMaxFrameSize) return;  // the codec refuses such a frame first
  read_some_into(*this, kReadChunk);
}

void TConn::process() {
  size_t pos = 0, handled = 0;
  while (!closed) {
    if (out.size() >= kMaxOutBuffered) {
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
    if (handled == kQueriesPerTurn) {
      // Yield; the rest is parsed behind the other connections' handlers.
      resume_posted = true;
      asio::post(sock.get_executor(), [self = shared_from_this()] {
        self->resume_posted = false;
        if (self->closed) return;
        self->process();
        self->read_more();
      });
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
  release(in);
  update_frame_timer();
  account();
  flush();
}

bool TConn::handle(tcpstore::Request& q) {
  auto& s = *srv;
  const std::string* key = q.keys.empty() ? nullptr : &q.keys[0];
  switch (q.op) {
    case Op::kValidate:
      if (q.u32 != tcpstore::kValidateMagic) {
        fail("VALIDATE with magic " + std::to_string(q.u32) + ", not torch's");
        return false;
      }
      return true;
    case Op::kPing:
      tcpstore::put_u32(out, q.u32);
      return true;
    case Op::kSet:
      return s.put(*this, *key, std::move(q.values[0]));
    case Op::kCompareSet: {
      auto it = s.data.find(*key);
      const Bytes& expected = q.values[0];
      if (it == s.data.end() && !expected.empty()) {
        // torch answers the expected value when the key is absent.
        tcpstore::put_string(out, expected);
        s.wake(*key);
        return true;
      }
      if (it == s.data.end() || it->second == expected) {
        Bytes desired = q.values[1];
        if (!s.put(*this, *key, std::move(desired))) return false;
      }
      tcpstore::put_string(out, s.data[*key]);
      return true;
    }
    case Op::kGet: {
      auto it = s.data.find(*key);
      tcpstore::put_string(out, it == s.data.end() ? Bytes{} : it->second);
      return true;
    }
    case Op::kAdd: {
      int64_t v = 0;
      auto it = s.data.find(*key);
      if (it != s.data.end()) {
        const char* b = reinterpret_cast<const char*>(it->second.data());
        auto [p, ec] = std::from_chars(b, b + it->second.size(), v);
        if (ec != std::errc() || p != b + it->second.size()) {
          fail("ADD on '" + *key + "', whose value is not an integer");
          return false;
        }
      }
      if (__builtin_add_overflow(v, q.number, &v)) {
        fail("ADD overflows the integer at '" + *key + "'");
        return false;
      }
      std::string text = std::to_string(v);
      if (!s.put(*this, *key, Bytes(text.begin(), text.end()))) return false;
      tcpstore::put_i64(out, v);
      return true;
    }
    case Op::kCheck: {
      bool all = true;
      for (const auto& k : q.keys) all = all && s.present(k);
      tcpstore::put_u8(out, all ? kReady : kNotReady);
      return true;
    }
    case Op::kWait: {
      cancel_wait();  // torch's client never overlaps waits; a new one replaces
      size_t missing = 0;
      for (const auto& k : q.keys) missing += s.present(k) ? 0 : 1;
      if (missing == 0) {
        tcpstore::put_u8(out, kStopWaiting);
        return true;
      }
      for (const auto& k : q.keys) {
        if (s.present(k)) continue;
        s.waiting[k].push_back(weak_from_this());
        waiting_on.push_back(k);
      }
      awaited = missing;
      ++s.waiters;
      return true;
    }
    case Op::kGetNumKeys:
      tcpstore::put_i64(out, static_cast<int64_t>(s.data.size()));
      return true;
    case Op::kDeleteKey: {
      auto it = s.data.find(*key);
      int64_t n = it == s.data.end() ? 0 : 1;
      if (n) {
        s.store_bytes -= it->first.size() + it->second.size() + kEntryOverhead;
        s.data.erase(it);
      }
      tcpstore::put_i64(out, n);
      return true;
    }
    case Op::kAppend: {
      auto it = s.data.find(*key);
      Bytes v = it == s.data.end() ? Bytes{} : it->second;
      v.insert(v.end(), q.values[0].begin(), q.values[0].end());
      return s.put(*this, *key, std::move(v));
    }
    case Op::kMultiGet:
      for (const auto& k : q.keys) {
        auto it = s.data.find(k);
        tcpstore::put_string(out, it == s.data.end() ? Bytes{} : it->second);
      }
      return true;
    case Op::kMultiSet:
      for (size_t i = 0; i < q.keys.size(); ++i)
        if (!s.put(*this, q.keys[i], std::move(q.values[i]))) return false;
      return true;
    case Op::kCancelWait:
      cancel_wait();
      tcpstore::put_u8(out, kWaitCanceled);
      return true;
    case Op::kQueuePush: {
      size_t cost = key->size() + q.values[0].size() + kEntryOverhead;
      if (s.store_bytes + cost > s.options.max_store_bytes) {
        fail("the store is full (" + std::to_string(s.options.max_store_bytes) + " bytes)");
        return false;
      }
      s.store_bytes += cost;
      s.queues[*key].push_back(std::move(q.values[0]));
      s.wake_one(*key);
      return true;
    }
    case Op::kQueuePop: {
      auto& queue = s.queues[*key];
      tcpstore::put_i64(out, static_cast<int64_t>(queue.size()));
      if (!queue.empty()) {
        tcpstore::put_string(out, queue.front());
        s.store_bytes -= key->size() + queue.front().size() + kEntryOverhead;
        queue.pop_front();
      }
      if (queue.empty()) s.queues.erase(*key);
      return true;
    }
    case Op::kQueueLen: {
      auto it = s.queues.find(*key);
      tcpstore::put_i64(out, it == s.queues.end() ? 0 : static_cast<int64_t>(it->second.size()));
      return true;
    }
    case Op::kListKeys:
      tcpstore::put_i64(out, static_cast<int64_t>(s.data.size()));
      for (const auto& [k, v] : s.data) tcpstore::put_string(out, k);
      return true;
    case Op::kBarrier: {
      // As torch's libuv server: count arrivals in the key, answer every
      // arrival once `world` have come.
      int64_t count = 1;
      auto it = s.data.find(*key);
      if (it != s.data.end()) {
        const char* b = reinterpret_cast<const char*>(it->second.data());
        int64_t before = 0;
        auto [p, ec] = std::from_chars(b, b + it->second.size(), before);
        if (ec != std::errc() || p != b + it->second.size() || before == INT64_MAX) {
          fail("BARRIER on '" + *key + "', whose value is not a count");
          return false;
        }
        count = before + 1;
      }
      std::string text = std::to_string(count);
      cancel_wait();
      // Registered before the count is stored, so that the arrival that
      // completes the barrier is woken with the others by its own put.
      s.waiting[*key].push_back(weak_from_this());
      waiting_on.push_back(*key);
      awaited = 1;
      ++s.waiters;
      return s.put(*this, *key, Bytes(text.begin(), text.end()), count >= q.number);
    }
    case Op::kWatchKey:
      fail("WATCH_KEY (torch 1.13's watch_key callbacks) is not supported by this store");
      return false;
  }
  return true;
}

void TConn::cancel_wait() {
  if (awaited == 0) {
    waiting_on.clear();
    return;
  }
  for (const auto& k : waiting_on) {
    auto it = srv->waiting.find(k);
    if (it == srv->waiting.end()) continue;
    auto& v = it->second;
    for (size_t i = 0; i < v.size();) {
      auto c = v[i].lock();
      if (!c || c.get() == this) {
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (v.empty()) srv->waiting.erase(it);
  }
  waiting_on.clear();
  awaited = 0;
  --srv->waiters;
}

bool TcpStoreServer::Impl::put(TConn& by, const std::string& key, Bytes value, bool wake_waiters) {
  auto it = data.find(key);
  size_t old = it == data.end() ? 0 : key.size() + it->second.size() + kEntryOverhead;
  size_t now = key.size() + value.size() + kEntryOverhead;
  if (now > old && store_bytes - old + now > options.max_store_bytes) {
    by.fail("the store is full (" + std::to_string(options.max_store_bytes) + " bytes)");
    return false;
  }
  store_bytes = store_bytes - old + now;
  data[key] = std::move(value);
  if (wake_waiters) wake(key);
  return !by.closed;
}

bool TcpStoreServer::Impl::present(const std::string& key) const {
  if (data.count(key)) return true;
  auto it = queues.find(key);
  return it != queues.end() && !it->second.empty();
}

void TcpStoreServer::Impl::notify(const std::shared_ptr<TConn>& c) {
  c->waiting_on.clear();
  c->awaited = 0;
  --waiters;
  tcpstore::put_u8(c->out, kStopWaiting);
  c->flush();
}

void TcpStoreServer::Impl::wake(const std::string& key) {
  auto it = waiting.find(key);
  if (it == waiting.end()) return;
  auto list = std::move(it->second);
  waiting.erase(it);
  std::vector<std::shared_ptr<TConn>> ready;
  for (auto& w : list) {
    auto c = w.lock();
    if (c && !c->closed && c->awaited > 0 && --c->awaited == 0) ready.push_back(std::move(c));
  }
  for (auto& c : ready) notify(c);
}

void TcpStoreServer::Impl::wake_one(const std::string& key) {
  auto it = waiting.find(key);
  if (it == waiting.end()) return;
  auto& list = it->second;
  std::shared_ptr<TConn> ready;
  while (!list.empty() && !ready) {
    auto c = list.front().lock();
    list.erase(list.begin());
    if (c && !c->closed && c->awaited > 0 && --c->awaited == 0) ready = std::move(c);
  }
  if (list.empty()) waiting.erase(it);
  if (ready) notify(ready);
}

void TConn::update_frame_timer() {
  if (in.empty() || closed) {
    if (frame_timer_armed) frame_timer.cancel();
    frame_timer_armed = false;
    return;
  }
  if (frame_timer_armed) return;  // the clock runs from the first partial byte
  frame_timer_armed = true;
  frame_timer.expires_after(srv->options.partial_frame_timeout);
  frame_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closed || !self->frame_timer_armed) return;
    self->fail("partial query not completed within " +
               std::to_string(self->srv->options.partial_frame_timeout.count()) + " ms");
  });
}

void TConn::account() {
  if (closed) return;
  size_t now = in.capacity() + out.capacity() + sending.capacity();
  srv->buffered = srv->buffered - charged + now;
  charged = now;
  if (srv->buffered > srv->options.max_buffered_bytes)
    fail("the connections buffer more than " + std::to_string(srv->options.max_buffered_bytes) +
         " bytes; this one holds " + std::to_string(now));
}

void TConn::flush() {
  if (writing || closed || out.empty()) return;
  // A direct write first: the common reply fits the socket buffer.
  boost::system::error_code ec;
  size_t n = sock.write_some(asio::buffer(out), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) return close();
  if (n == out.size()) {
    out.clear();
    release(out);
    return account();
  }
  sending.assign(out.begin() + static_cast<std::ptrdiff_t>(n), out.end());
  out.clear();
  release(out);
  account();
  if (closed) return;
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
                      release(self->sending);
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
  cancel_wait();
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
    } else {
      tcp::endpoint ep(asio::ip::make_address(o.host), o.port);
      impl_->acceptor.open(ep.protocol());
      impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
      impl_->acceptor.bind(ep);
      impl_->acceptor.listen(o.backlog);
    }
    impl_->acceptor.non_blocking(true);  // the accept loop drains the queue without blocking
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

void TcpStoreServer::clear() {
  impl_->data.clear();
  impl_->queues.clear();
  impl_->store_bytes = 0;
}

size_t TcpStoreServer::num_connections() const { return impl_->conns.size(); }
size_t TcpStoreServer::num_keys() const { return impl_->data.size(); }
size_t TcpStoreServer::num_waiters() const { return impl_->waiters; }

}  // namespace ddprun::rendezvous
