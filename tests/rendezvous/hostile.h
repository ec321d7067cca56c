// Attacks on a store at 127.0.0.1:port, and a well-behaved client measured
// before and while they run: shared by the hostile test suite
// (store_hostile_test.cc) and bench/store_attack_bench.cc, which runs the
// same attacks against c10d's TCPStore.
//
// An attacker keeps `connections` sockets from its own loopback address
// (127.0.0.2: every 127/8 address is loopback on Linux, so the store sees
// another host), sends each one its bytes without blocking, and reconnects
// whatever the store closes, until told to stop.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/client.h"
#include "rendezvous/wire.h"

namespace ddprun::rendezvous::hostile {

using Clock = std::chrono::steady_clock;
using wire::Bytes;

struct AttackOptions {
  uint16_t port = 0;
  const char* source = "127.0.0.2";
  // The store's address (an IPv4 literal).
  const char* dest = "127.0.0.1";
  size_t connections = 100;
  // What each connection sends after connecting (the greeting is not
  // waited for); empty: it only holds the slot.
  // (Shared, so a hundred connections sending the same 8 MiB cost one copy.)
  std::function<std::shared_ptr<const Bytes>(size_t conn, uint64_t round)> script;
  // Read and discard what the store sends (false: never read a reply).
  bool drain = true;
  // Send the next round's script once one is out (a flood that never ends).
  bool repeat = false;
};

// Runs until `stop`; counts the connections it made and those closed on it.
class Attacker {
 public:
  explicit Attacker(AttackOptions o) : o_(std::move(o)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Attacker() {
    stop_ = true;
    thread_.join();
  }
  uint64_t connects() const { return connects_; }
  uint64_t closed() const { return closed_; }
  // Every connection was open at once (the attack is in full force).
  bool established() const { return established_; }

 private:
  struct Sock {
    int fd = -1;
    std::shared_ptr<const Bytes> pending;
    size_t off = 0;
    uint64_t round = 0;
  };

  bool open(Sock& s, size_t i) {
    s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, o_.source, &local.sin_addr);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(o_.port);
    ::inet_pton(AF_INET, o_.dest, &a.sin_addr);
    // Each socket binds its own source port, taken in turn from a range
    // below the ephemeral one: left to the kernel, picking 16,384 ports
    // for one address pair takes it tens of seconds on a busy machine.
    int one = 1;
    if (s.fd >= 0) ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool bound = false;
    for (int tries = 0; s.fd >= 0 && !bound && tries < 64; ++tries) {
      local.sin_port = htons(next_source_port());
      bound = ::bind(s.fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0;
    }
    if (!bound ||
        (::connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)) {
      if (s.fd >= 0) ::close(s.fd);
      s.fd = -1;
      return false;
    }
    ++connects_;
    s.pending = o_.script ? o_.script(i, s.round++) : std::make_shared<const Bytes>();
    s.off = 0;
    return true;
  }

  // 10000-28999: below Linux's ephemeral range (32768+) and clear of the
  // ports torch and ddprun listen on by default (29400, 29500).
  static uint16_t next_source_port() {
    static std::atomic<uint32_t> cursor{0};
    return static_cast<uint16_t>(10000 + cursor++ % 19000);
  }

  void run() {
    std::vector<Sock> socks(o_.connections);
    auto next_open = Clock::now();
    while (!stop_) {
      // (Re)open closed sockets, at most every 10 ms so a refused flood
      // does not spin.
      if (Clock::now() >= next_open) {
        // A failed connect (ports used up) stops this round: each one
        // scans the whole ephemeral port range.
        for (size_t i = 0; i < socks.size(); ++i)
          if (socks[i].fd < 0 && !open(socks[i], i)) break;
        if (std::all_of(socks.begin(), socks.end(), [](const Sock& s) { return s.fd >= 0; }))
          established_ = true;
        next_open = Clock::now() + std::chrono::milliseconds(10);
      }
      std::vector<pollfd> fds;
      std::vector<size_t> idx;
      for (size_t i = 0; i < socks.size(); ++i) {
        if (socks[i].fd < 0) continue;
        short ev = POLLRDHUP | (o_.drain ? POLLIN : 0) |
                   (socks[i].off < socks[i].pending->size() ? POLLOUT : 0);
        fds.push_back({socks[i].fd, ev, 0});
        idx.push_back(i);
      }
      if (fds.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // all refused: back off
        continue;
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      for (size_t k = 0; k < fds.size(); ++k) {
        Sock& s = socks[idx[k]];
        bool dead = fds[k].revents & (POLLERR | POLLHUP | POLLRDHUP);
        if (!dead && (fds[k].revents & POLLIN)) {
          char buf[65536];
          ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
          if (n == 0 || (n < 0 && errno != EAGAIN)) dead = true;
        }
        if (!dead && (fds[k].revents & POLLOUT)) {
          ssize_t n = ::send(s.fd, s.pending->data() + s.off, s.pending->size() - s.off, MSG_NOSIGNAL);
          if (n > 0) s.off += static_cast<size_t>(n);
          else if (n < 0 && errno != EAGAIN) dead = true;
          if (!dead && o_.repeat && s.off == s.pending->size()) {
            s.pending = o_.script(idx[k], s.round++);
            s.off = 0;
          }
        }
        if (dead) {
          ::close(s.fd);
          s.fd = -1;
          ++closed_;
        }
      }
    }
    for (auto& s : socks)
      if (s.fd >= 0) ::close(s.fd);
  }

  AttackOptions o_;
  std::atomic<bool> stop_{false}, established_{false};
  std::atomic<uint64_t> connects_{0}, closed_{0};
  std::thread thread_;
};

// A well-behaved client: set then get on its connection in a loop, and a
// fresh connection (connect, handshake, one set/get) every `fresh_every`
// rounds; every latency is kept, the fresh rounds apart.
struct GoodStats {
  std::vector<double> latency_ms;  // one set+get round on an open connection
  std::vector<double> connect_ms;  // a fresh connection: connect, handshake, set+get
  uint64_t failures = 0;
  uint64_t fresh_ok = 0;
  std::string first_error;
  double p(double q) const { return percentile(latency_ms, q); }
  double connect_p(double q) const { return percentile(connect_ms, q); }
  static double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
  }
};

// `connect()` returns a connected client (a unique_ptr to a type with
// set(key, Bytes) and get(key) -> Bytes) or throws.
template <class Connect>
GoodStats good_client_of(Connect connect, std::chrono::milliseconds duration, int fresh_every = 25) {
  GoodStats st;
  auto end = Clock::now() + duration;
  decltype(connect()) c;
  Bytes value(64, 'g');
  for (uint64_t i = 0; Clock::now() < end; ++i) {
    try {
      bool fresh = !c || i % static_cast<uint64_t>(fresh_every) == 0;
      auto t0 = Clock::now();
      if (fresh) c = connect();
      std::string key = "good/" + std::to_string(i % 64);
      c->set(key, value);
      if (c->get(key) != value) throw std::runtime_error("wrong value for " + key);
      (fresh ? st.connect_ms : st.latency_ms)
          .push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      if (fresh) ++st.fresh_ok;
    } catch (const std::exception& e) {
      ++st.failures;
      if (st.first_error.empty()) st.first_error = e.what();
      c.reset();
    }
  }
  return st;
}

// The good client on ddprun's store.
struct GoodDdprunClient {
  explicit GoodDdprunClient(const ClientOptions& co) : c(co) {}
  void set(const std::string& k, const Bytes& v) { c.set(k, v); }
  Bytes get(const std::string& k) { return c.get(k, std::chrono::milliseconds(5000)); }
  Client c;
};
inline GoodStats good_client(const ClientOptions& co, std::chrono::milliseconds duration) {
  return good_client_of([&] { return std::make_unique<GoodDdprunClient>(co); }, duration);
}

// --- One measurement: idle, then under attack. ---

struct Measurement {
  size_t idle_rss = 0, peak_rss = 0;
  GoodStats idle, attack;
  bool established = false;  // the attackers had every connection open
  uint64_t attacker_connects = 0, attacker_closed = 0;
  // The good client's p99 under attack over its idle p99.
  double p99_ratio() const { return idle.p(0.99) > 0 ? attack.p(0.99) / idle.p(0.99) : 0; }
};

using Attackers = std::vector<std::unique_ptr<Attacker>>;

// Warms the store up with the good client, runs it `idle_time` alone, then
// starts `attack()`, waits (up to 30 s) for every attacking connection to
// be open, and runs the good client `attack_time` while sampling `rss()`.
// `during` runs after that, the attack still going (a probe of the store's
// state under attack).
inline Measurement measure(const std::function<size_t()>& rss,
                           const std::function<GoodStats(std::chrono::milliseconds)>& good,
                           const std::function<Attackers()>& attack,
                           std::chrono::milliseconds idle_time, std::chrono::milliseconds attack_time,
                           const std::function<void()>& during = {}) {
  Measurement m;
  good(std::chrono::milliseconds(300));  // the idle RSS includes a client's traces
  m.idle = good(idle_time);
  m.idle_rss = rss();
  m.peak_rss = m.idle_rss;
  {
    Attackers attackers = attack();
    auto all_open = [&] {
      return std::all_of(attackers.begin(), attackers.end(), [](const auto& a) { return a->established(); });
    };
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!all_open() && Clock::now() < deadline) {
      m.peak_rss = std::max(m.peak_rss, rss());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // sampling, not synchronization
    }
    m.established = all_open();
    auto g = std::async(std::launch::async, [&] { return good(attack_time); });
    while (g.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      m.peak_rss = std::max(m.peak_rss, rss());
    }
    m.attack = g.get();
    if (during) during();
    m.peak_rss = std::max(m.peak_rss, rss());
    for (auto& a : attackers) {
      m.attacker_connects += a->connects();
      m.attacker_closed += a->closed();
    }
  }
  m.peak_rss = std::max(m.peak_rss, rss());
  return m;
}

// --- The attacks' bytes. ---

inline Bytes header(uint32_t n) {
  return {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
          static_cast<uint8_t>(n >> 24)};
}

// A 4 MiB frame announced and 1 MiB of it sent: the partial frame a store
// would park for the slow-loris window.
inline std::shared_ptr<const Bytes> partial_big_frame(size_t = 0, uint64_t = 0) {
  static const auto b = [] {
    Bytes f = header(wire::kMaxFrameSize);
    f.push_back(static_cast<uint8_t>(wire::Op::kSet));
    f.resize(4 + (1 << 20), 'p');
    return std::make_shared<const Bytes>(std::move(f));
  }();
  return b;
}

// A ~4 MiB wait on keys that never appear, with another ~4 MiB one
// queued behind it (built once: the attacker's time goes into sending).
inline std::shared_ptr<const Bytes> wait_flood(size_t = 0, uint64_t = 0) {
  static const auto two = [] {
    wire::Request q;
    q.op = wire::Op::kWait;
    q.timeout_ms = 3600 * 1000;
    std::string pad(4000, 'w');
    for (int i = 0; i < 1000; ++i) q.keys.push_back("never/" + std::to_string(i) + pad);
    Bytes f = wire::encode_request(q);
    Bytes b = f;
    b.insert(b.end(), f.begin(), f.end());
    return std::make_shared<const Bytes>(std::move(b));
  }();
  return two;
}

// multi_gets of three 1 MiB values, pipelined, never read.
inline std::shared_ptr<const Bytes> unread_replies(size_t = 0, uint64_t = 0) {
  wire::Request q;
  q.op = wire::Op::kMultiGet;
  q.timeout_ms = 1000;
  q.keys = {"hostile/big", "hostile/big", "hostile/big"};
  Bytes f = wire::encode_request(q), all;
  for (int i = 0; i < 8; ++i) all.insert(all.end(), f.begin(), f.end());
  return std::make_shared<const Bytes>(std::move(all));
}

// Tiny unique keys, as many as the store takes.
inline std::shared_ptr<const Bytes> key_flood(size_t conn, uint64_t round) {
  Bytes all;
  for (int i = 0; i < 4096; ++i) {
    wire::Request q;
    q.op = wire::Op::kSet;
    q.keys = {std::to_string(conn) + "." + std::to_string(round) + "." + std::to_string(i)};
    q.values = {Bytes{'x'}};
    Bytes f = wire::encode_request(q);
    all.insert(all.end(), f.begin(), f.end());
  }
  return std::make_shared<const Bytes>(std::move(all));
}

// The quadratic-notify attack (issue 19): each connection blocks in one
// wait on 8,192 keys, 8,191 of them shared ("q/0".."q/8190") and its own
// last one that never appears, so every wait stays registered...
constexpr size_t kNotifyKeys = 8192;
inline std::shared_ptr<const Bytes> wait_on_many(size_t conn, uint64_t = 0) {
  wire::Request q;
  q.op = wire::Op::kWait;
  q.timeout_ms = 3600 * 1000;
  for (size_t i = 0; i + 1 < kNotifyKeys; ++i) q.keys.push_back("q/" + std::to_string(i));
  q.keys.push_back("q/never/" + std::to_string(conn));
  return std::make_shared<const Bytes>(wire::encode_request(q));
}

// ...while another sets the shared keys one by one and deletes them again,
// round after round: each write makes a key of every wait exist or vanish.
inline std::shared_ptr<const Bytes> set_delete_loop(size_t = 0, uint64_t = 0) {
  static const auto all = [] {
    Bytes b;
    for (int del = 0; del < 2; ++del) {
      for (size_t i = 0; i + 1 < kNotifyKeys; ++i) {
        wire::Request q;
        q.op = del ? wire::Op::kDelete : wire::Op::kSet;
        q.keys = {"q/" + std::to_string(i)};
        if (!del) q.values = {Bytes{'s'}};
        Bytes f = wire::encode_request(q);
        b.insert(b.end(), f.begin(), f.end());
      }
    }
    return std::make_shared<const Bytes>(std::move(b));
  }();
  return all;
}

}  // namespace ddprun::rendezvous::hostile
