// The c10d TCPStore server (rendezvous/tcpstore_server.h) against raw
// sockets sending the bytes torch's C++ client sends, in both numberings
// (torch 2.x, torch 1.13); and malformed queries, which close only their
// own connection, with one log line, while others are served.
#include <doctest/doctest.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "rendezvous/tcpstore_codec.h"
#include "rendezvous/tcpstore_server.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
namespace ts = ddprun::rendezvous::tcpstore;

namespace {

// A TcpStoreServer on a private io_context thread.
class TcpStoreThread {
 public:
  explicit TcpStoreThread(TcpStoreServerOptions o = {}) {
    o.host = "127.0.0.1";
    server_ = std::make_unique<TcpStoreServer>(io_, o);
    port_ = server_->port();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~TcpStoreThread() {
    boost::asio::post(io_, [this] {
      server_->close();
      io_.stop();
    });
    thread_.join();
  }
  uint16_t port() const { return port_; }
  void clear() {
    std::promise<void> p;
    boost::asio::post(io_, [&] {
      server_->clear();
      p.set_value();
    });
    p.get_future().get();
  }
  size_t waiters() {
    std::promise<size_t> p;
    boost::asio::post(io_, [&] { p.set_value(server_->num_waiters()); });
    return p.get_future().get();
  }
  // Bounded wait until `n` connections block in WAIT/BARRIER.
  bool wait_waiters(size_t n) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waiters() == n) return true;
      std::this_thread::yield();
    }
    return false;
  }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<TcpStoreServer> server_;
  std::thread thread_;
  uint16_t port_ = 0;
};

// One client connection speaking dialect `d`; every receive has a 10 s
// deadline (RawConn's poll) and EOF shows as nullopt.
class Peer {
 public:
  Peer(uint16_t port, ts::Dialect d) : raw_(port), d_(d) {
    if (d == ts::Dialect::kV2) {
      ts::Bytes b{0};
      ts::put_u32(b, ts::kValidateMagic);
      raw_.send(b);
    }
  }
  ts::Bytes q(ts::Op op) { return ts::Bytes{ts::opcode(d_, op)}; }
  void send(const ts::Bytes& b) { raw_.send(b); }
  std::optional<ts::Bytes> recv(size_t n) {
    while (buf_.size() < n) {
      pollfd p{raw_.fd(), POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) throw std::runtime_error("no reply within 10 s");
      uint8_t tmp[65536];
      ssize_t got = ::recv(raw_.fd(), tmp, sizeof tmp, 0);
      if (got <= 0) return std::nullopt;
      buf_.insert(buf_.end(), tmp, tmp + got);
    }
    ts::Bytes out(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(n));
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(n));
    return out;
  }
  uint8_t u8() { return recv(1).value().at(0); }
  uint64_t u64() {
    auto b = recv(8).value();
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | b[static_cast<size_t>(i)];
    return v;
  }
  std::string str() {
    auto n = u64();
    auto b = recv(n).value();
    return std::string(b.begin(), b.end());
  }
  bool closed_by_server() { return !recv(buf_.size() + 1).has_value(); }

  void set(const std::string& k, const std::string& v) {
    auto b = q(ts::Op::kSet);
    ts::put_string(b, k);
    ts::put_string(b, v);
    send(b);
  }
  std::string get(const std::string& k) {
    auto b = q(ts::Op::kGet);
    ts::put_string(b, k);
    send(b);
    return str();
  }
  int64_t add(const std::string& k, int64_t d) {
    auto b = q(ts::Op::kAdd);
    ts::put_string(b, k);
    ts::put_i64(b, d);
    send(b);
    return static_cast<int64_t>(u64());
  }
  void wait(const std::vector<std::string>& keys) {
    auto b = q(ts::Op::kWait);
    ts::put_u64(b, keys.size());
    for (const auto& k : keys) ts::put_string(b, k);
    send(b);
  }

 private:
  RawConn raw_;
  ts::Dialect d_;
  ts::Bytes buf_;
};

}  // namespace

TEST_CASE("the codec tells torch 2.x's VALIDATE from torch 1.13's first SET") {
  const uint8_t v2[] = {0, 0xCE, 0xF7, 0x85, 0x3C};
  CHECK(ts::detect_dialect(v2, 5) == ts::Dialect::kV2);
  CHECK(ts::detect_dialect(v2, 3) == ts::Dialect::kUnknown);
  const uint8_t legacy_set[] = {0, 3, 0, 0, 0, 0, 0, 0, 0};
  CHECK(ts::detect_dialect(legacy_set, 9) == ts::Dialect::kLegacy);
  const uint8_t legacy_wait[] = {5};
  CHECK(ts::detect_dialect(legacy_wait, 1) == ts::Dialect::kLegacy);
  CHECK(ts::opcode(ts::Dialect::kLegacy, ts::Op::kDeleteKey) == 8);
  CHECK(ts::opcode(ts::Dialect::kV2, ts::Op::kDeleteKey) == 8);
  CHECK(ts::opcode(ts::Dialect::kLegacy, ts::Op::kWait) == 5);
  CHECK(ts::opcode(ts::Dialect::kV2, ts::Op::kWait) == 6);
  // A partial frame asks for more, naming how much at least.
  ts::Bytes b{ts::opcode(ts::Dialect::kV2, ts::Op::kSet)};
  ts::put_string(b, std::string("key"));
  ts::put_u64(b, 100);
  auto r = ts::parse_request(ts::Dialect::kV2, b.data(), b.size());
  CHECK(r.kind == ts::ParseResult::kNeedMore);
  CHECK(r.need == b.size() + 100);
}

TEST_CASE("torch 2.x queries: ping, set/get, add, check, compare_set, delete, append, multi, list") {
  TcpStoreThread server;
  Peer c(server.port(), ts::Dialect::kV2);
  auto ping = c.q(ts::Op::kPing);
  ts::put_u32(ping, 4242);
  c.send(ping);
  auto nonce = c.recv(4).value();
  CHECK(nonce == ts::Bytes{0x92, 0x10, 0, 0});
  c.set("/a", "1");
  CHECK(c.get("/a") == "1");
  CHECK(c.get("/missing").empty());
  CHECK(c.add("/n", 5) == 5);
  CHECK(c.add("/n", -2) == 3);
  CHECK(c.get("/n") == "3");

  auto check = c.q(ts::Op::kCheck);
  ts::put_u64(check, 2);
  ts::put_string(check, std::string("/a"));
  ts::put_string(check, std::string("/nope"));
  c.send(check);
  CHECK(c.u8() == 1);  // NOT_READY

  auto cas = [&](const std::string& k, const std::string& expected, const std::string& desired) {
    auto b = c.q(ts::Op::kCompareSet);
    ts::put_string(b, k);
    ts::put_string(b, expected);
    ts::put_string(b, desired);
    c.send(b);
    return c.str();
  };
  CHECK(cas("/c", "", "first") == "first");      // absent, expected empty: set
  CHECK(cas("/c", "wrong", "second") == "first");  // mismatch: the value now
  CHECK(cas("/c", "first", "third") == "third");
  CHECK(cas("/absent", "x", "y") == "x");  // torch answers the expected value

  auto numkeys = c.q(ts::Op::kGetNumKeys);
  c.send(numkeys);
  CHECK(c.u64() == 3);  // /a /n /c
  auto del = c.q(ts::Op::kDeleteKey);
  ts::put_string(del, std::string("/c"));
  c.send(del);
  CHECK(c.u64() == 1);
  c.send(del);
  CHECK(c.u64() == 0);

  auto app = c.q(ts::Op::kAppend);
  ts::put_string(app, std::string("/a"));
  ts::put_string(app, std::string("23"));
  c.send(app);
  CHECK(c.get("/a") == "123");

  auto mset = c.q(ts::Op::kMultiSet);
  ts::put_u64(mset, 2);
  for (auto kv : {"/m0", "/m1"}) {
    ts::put_string(mset, std::string(kv));
    ts::put_string(mset, std::string(kv) + "v");
  }
  c.send(mset);
  auto mget = c.q(ts::Op::kMultiGet);
  ts::put_u64(mget, 2);
  ts::put_string(mget, std::string("/m1"));
  ts::put_string(mget, std::string("/m0"));
  c.send(mget);
  CHECK(c.str() == "/m1v");
  CHECK(c.str() == "/m0v");

  c.send(c.q(ts::Op::kListKeys));
  auto n = c.u64();
  std::set<std::string> keys;
  for (uint64_t i = 0; i < n; ++i) keys.insert(c.str());
  CHECK(keys == std::set<std::string>{"/a", "/n", "/m0", "/m1"});
}

TEST_CASE("a wait is answered when another client sets the key; a cancelled wait says so") {
  TcpStoreThread server;
  Peer waiter(server.port(), ts::Dialect::kV2);
  Peer setter(server.port(), ts::Dialect::kV2);
  waiter.wait({"/k1", "/k2"});
  REQUIRE(server.wait_waiters(1));
  setter.set("/k1", "x");
  setter.add("/k2", 1);  // a reply to wait for: both writes are in
  CHECK(waiter.u8() == 0);  // STOP_WAITING
  CHECK(server.waiters() == 0);

  // torch's client after its timeout: CANCEL_WAIT, answered WAIT_CANCELED.
  waiter.wait({"/never"});
  REQUIRE(server.wait_waiters(1));
  waiter.send(waiter.q(ts::Op::kCancelWait));
  CHECK(waiter.u8() == 1);
  CHECK(server.waiters() == 0);
  setter.set("/never", "late");  // wakes nobody: the next reply is the GET's
  CHECK(waiter.get("/never") == "late");
}

TEST_CASE("barrier answers every arrival once world_size arrived; queues push, pop and count") {
  TcpStoreThread server;
  Peer a(server.port(), ts::Dialect::kV2);
  Peer b(server.port(), ts::Dialect::kV2);
  auto barrier = a.q(ts::Op::kBarrier);
  ts::put_string(barrier, std::string("/bar"));
  ts::put_i64(barrier, 2);
  a.send(barrier);
  REQUIRE(server.wait_waiters(1));
  b.send(barrier);
  CHECK(a.u8() == 0);
  CHECK(b.u8() == 0);

  auto push = a.q(ts::Op::kQueuePush);
  ts::put_string(push, std::string("/q"));
  ts::put_string(push, std::string("item"));
  a.send(push);
  auto len = a.q(ts::Op::kQueueLen);
  ts::put_string(len, std::string("/q"));
  a.send(len);
  CHECK(a.u64() == 1);
  auto pop = a.q(ts::Op::kQueuePop);
  ts::put_string(pop, std::string("/q"));
  a.send(pop);
  CHECK(a.u64() == 1);
  CHECK(a.str() == "item");
  a.send(pop);
  CHECK(a.u64() == 0);  // empty: no value follows
  // A blocking pop waits on the queue's key first; a push wakes it.
  b.wait({"/q"});
  REQUIRE(server.wait_waiters(1));
  a.send(push);
  CHECK(b.u8() == 0);
}

TEST_CASE("torch 1.13's numbering: set, get, add, wait without VALIDATE") {
  TcpStoreThread server;
  Peer old(server.port(), ts::Dialect::kLegacy);
  Peer v2(server.port(), ts::Dialect::kV2);
  old.set("/init/", "x");
  CHECK(old.get("/init/") == "x");
  CHECK(old.add("/count", 1) == 1);
  CHECK(v2.add("/count", 1) == 2);  // both dialects share one table
  old.wait({"/late"});
  REQUIRE(server.wait_waiters(1));
  v2.set("/late", "1");
  CHECK(old.u8() == 0);
}

TEST_CASE("malformed queries close their connection with one log line; others are served") {
  struct Case {
    const char* name;
    ts::Dialect dialect;
    std::function<ts::Bytes(Peer&)> bytes;
    const char* logged;
  };
  std::vector<Case> cases = {
      {"no such query", ts::Dialect::kV2, [](Peer&) { return ts::Bytes{0xEE}; },
       "bad query: unknown query 238"},
      {"a 1 TiB key, refused before it arrives", ts::Dialect::kV2,
       [](Peer& p) {
         auto b = p.q(ts::Op::kSet);
         ts::put_u64(b, uint64_t{1} << 40);
         return b;
       },
       "key of 1099511627776 bytes exceeds the limit"},
      {"VALIDATE with another magic", ts::Dialect::kV2,
       [](Peer& p) {
         auto b = p.q(ts::Op::kValidate);
         ts::put_u32(b, 0xDEADBEEF);
         return b;
       },
       "VALIDATE with magic"},
      {"torch 1.13's WATCH_KEY", ts::Dialect::kLegacy,
       [](Peer& p) {
         auto b = p.q(ts::Op::kWatchKey);
         ts::put_string(b, std::string("/w"));
         return b;
       },
       "WATCH_KEY"},
      {"ADD on text", ts::Dialect::kV2,
       [](Peer& p) {
         p.set("/text", "abc");
         auto b = p.q(ts::Op::kAdd);
         ts::put_string(b, std::string("/text"));
         ts::put_i64(b, 1);
         return b;
       },
       "whose value is not an integer"},
  };
  for (auto& c : cases) {
    CAPTURE(c.name);
    LogCapture log;
    TcpStoreThread server;
    Peer good(server.port(), ts::Dialect::kV2);
    good.set("/alive", "yes");
    {
      Peer bad(server.port(), c.dialect);
      bad.send(c.bytes(bad));
      CHECK(bad.closed_by_server());
    }
    CHECK(good.get("/alive") == "yes");
    std::string text = log.str();
    INFO(text);
    CHECK(text.find(c.logged) != std::string::npos);
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  }
}

TEST_CASE("a partial query is closed after the frame timeout; a stalled client stalls no one") {
  LogCapture log;
  TcpStoreServerOptions o;
  o.partial_frame_timeout = std::chrono::milliseconds(300);
  TcpStoreThread server(o);
  Peer stalled(server.port(), ts::Dialect::kV2);
  auto b = stalled.q(ts::Op::kSet);
  ts::put_u64(b, 1000);  // announces a 1000-byte key, sends none of it
  stalled.send(b);
  Peer good(server.port(), ts::Dialect::kV2);
  good.set("/k", "v");
  CHECK(good.get("/k") == "v");  // served while the other's frame is partial
  CHECK(stalled.closed_by_server());
  CHECK(log.str().find("partial query not completed") != std::string::npos);
}

TEST_CASE("random bytes in either dialect never crash the server nor leave a waiter behind") {
  LogCapture log;  // the closes' lines stay out of the test's output
  TcpStoreThread server;
  std::mt19937 rng(21);
  for (int round = 0; round < 200; ++round) {
    auto d = round % 2 ? ts::Dialect::kV2 : ts::Dialect::kLegacy;
    Peer p(server.port(), d);
    ts::Bytes junk(16 + static_cast<size_t>(rng() % 240));
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    // Small opcodes and lengths, so that many parse as real queries.
    junk[0] = static_cast<uint8_t>(rng() % 20);
    for (size_t i = 1; i < junk.size(); ++i)
      if (rng() % 2) junk[i] = static_cast<uint8_t>(junk[i] % 4);
    p.send(junk);
  }  // every connection closed by its client
  Peer good(server.port(), ts::Dialect::kV2);
  good.set("/alive", "yes");
  CHECK(good.get("/alive") == "yes");
  CHECK(server.wait_waiters(0));
}

TEST_CASE("clear() empties the table for a new attempt; connections stay served") {
  TcpStoreThread server;
  Peer c(server.port(), ts::Dialect::kV2);
  c.set("/old", "x");
  CHECK(c.add("/n", 2) == 2);
  server.clear();
  CHECK(c.get("/old").empty());
  CHECK(c.add("/n", 1) == 1);
}
