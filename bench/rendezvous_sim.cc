#include "bench/rendezvous_sim.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "base/fd_limit.h"
#include "rendezvous/canceller.h"
#include "rendezvous/client.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/server.h"

namespace ddprun::bench {

namespace {
using namespace ddprun::rendezvous;
using Clock = std::chrono::steady_clock;

struct Counters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> bytes{0};
};

size_t size_of(const std::vector<std::string>& keys) {
  size_t n = 0;
  for (const auto& k : keys) n += k.size();
  return n;
}

// Counts a node's requests and their payload at the Store interface: every
// call of the TCP client is one round trip (client.h), etcd's may be more.
class CountingStore : public Store {
 public:
  // `first_get` runs once, before the first get (a KeepAlive's first wait
  // for the round's end, after its first beat).
  CountingStore(std::unique_ptr<Store> inner, Counters& c, std::function<void()> first_get)
      : inner_(std::move(inner)), c_(c), first_get_(std::move(first_get)) {}
  void set(const std::string& k, const Bytes& v) override {
    count(k.size() + v.size());
    inner_->set(k, v);
  }
  Bytes get(const std::string& k, Duration t) override {
    if (first_get_) std::exchange(first_get_, nullptr)();
    count(k.size());
    auto v = inner_->get(k, t);
    c_.bytes += v.size();
    return v;
  }
  int64_t add(const std::string& k, int64_t d) override {
    count(k.size() + 8);
    return inner_->add(k, d);
  }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    count(k.size() + e.size() + d.size());
    auto v = inner_->compare_set(k, e, d);
    c_.bytes += v.size();
    return v;
  }
  void wait(const std::vector<std::string>& keys, Duration t) override {
    count(size_of(keys));
    inner_->wait(keys, t);
  }
  bool check(const std::vector<std::string>& keys) override {
    count(size_of(keys));
    return inner_->check(keys);
  }
  bool remove(const std::string& k) override {
    count(k.size());
    return inner_->remove(k);
  }
  int64_t num_keys() override {
    count(0);
    return inner_->num_keys();
  }
  void append(const std::string& k, const Bytes& v) override {
    count(k.size() + v.size());
    inner_->append(k, v);
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys, Duration t) override {
    count(size_of(keys));
    auto values = inner_->multi_get(keys, t);
    for (const auto& v : values) c_.bytes += v.size();
    return values;
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    size_t n = size_of(keys);
    for (const auto& v : values) n += v.size();
    count(n);
    inner_->multi_set(keys, values);
  }
  void ping() override {
    count(0);
    inner_->ping();
  }
  bool set_on_close(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                    const std::string& counter) override {
    count(size_of(keys) + counter.size());
    return inner_->set_on_close(keys, values, counter);
  }
  bool settle_closed(const std::string& dir) override { return inner_->settle_closed(dir); }
  void set_reply_window(Duration w) override { inner_->set_reply_window(w); }

 private:
  void count(size_t bytes) {
    ++c_.requests;
    c_.bytes += static_cast<int64_t>(bytes);
  }
  std::unique_ptr<Store> inner_;
  Counters& c_;
  std::function<void()> first_get_;
};

// Threads meet here: start together, and the death only once all watch.
class Gate {
 public:
  explicit Gate(int n) : left_(n) {}
  void arrive() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  bool wait_all(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return left_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

struct Node {
  Counters round;      // the rendezvous connection, formation
  Counters reform;     // the same, from the death to the next round
  Counters keep_alive; // both keep-alive connections
  // The re-formation: this node's KeepAlive reported the end, the node
  // had it torn down, the node had the next round.
  Clock::time_point released, formed, ended, left, reformed;
  std::string error;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU seconds a thread has used (the store's event loop: what the store
// itself costs, apart from the simulated nodes sharing this machine).
// CPU seconds this whole process has used (the nodes and the store): what
// a phase costs the machine, whatever else shares its cores.
double process_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

double cpu_seconds(std::thread& t) {
  clockid_t id;
  timespec ts{};
  if (pthread_getcpuclockid(t.native_handle(), &id) != 0 || clock_gettime(id, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}
}  // namespace

SimResult simulate(const SimOptions& o) {
  SimResult result;
  result.nodes = o.nodes;
  base::raise_fd_limit();
  const size_t n = static_cast<size_t>(o.nodes);

  // The store: in this process, its per-peer limits raised (every node
  // connects from 127.0.0.1; a real job's nodes come from N addresses).
  boost::asio::io_context io;
  std::unique_ptr<Server> server;
  std::thread loop;
  uint16_t port = 0;
  if (o.backend == "store") {
    ServerOptions so;
    so.host = "127.0.0.1";
    so.max_connections = 4 * n + 64;
    so.max_connections_per_peer = 4 * n + 64;
    server = std::make_unique<Server>(io, so);
    port = server->endpoint().port();
    loop = std::thread([&] { io.run(); });
  } else if (o.backend != "etcd") {
    result.error = "unknown backend '" + o.backend + "' (store or etcd)";
    return result;
  }

  std::vector<Node> nodes(n);
  std::shared_ptr<Canceller> cut = std::make_shared<Canceller>();  // node 0's keep-alive
  auto connect = [&](Counters& c, std::shared_ptr<Canceller> canceller,
                     std::function<void()> first_get = nullptr) -> std::unique_ptr<Store> {
    std::unique_ptr<Store> inner;
    if (o.backend == "store") {
      ClientOptions co;
      co.host = "127.0.0.1";
      co.port = port;
      co.connect_timeout = o.join_timeout;
      // The clients share this machine's cores with the store: a reply may
      // come long after a call's own timeout without the store being gone.
      co.reply_grace = std::chrono::seconds(60);
      co.canceller = std::move(canceller);
      inner = std::make_unique<Client>(co);
    } else {
      EtcdOptions eo;
      eo.endpoints = o.etcd_endpoints;
      eo.canceller = std::move(canceller);
      inner = std::make_unique<EtcdStore>(eo);
    }
    return std::make_unique<CountingStore>(std::move(inner), c, std::move(first_get));
  };

  Gate ready(o.nodes), formed(o.nodes), watching(o.nodes);
  std::atomic<bool> go{false};
  std::mutex mu;
  std::condition_variable cv;
  Clock::time_point start, death;
  const auto begin = Clock::now();
  const auto deadline = begin + o.join_timeout * 2;

  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Node& me = nodes[i];
      bool was_formed = false;
      // The death comes once every KeepAlive has beaten and waits for the
      // round's end (its first get), as in a job that runs a while: the
      // first beats are no part of the re-formation.
      std::atomic<bool> watching_now{false};
      auto watches = [&] {
        if (!watching_now.exchange(true)) watching.arrive();
      };
      try {
        RendezvousOptions ro;
        ro.run_id = "scale";
        ro.node_id = "node" + std::to_string(i);
        ro.local_addr = "10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256);
        ro.min_nodes = o.reform ? o.nodes - 1 : o.nodes;
        ro.max_nodes = o.nodes;
        ro.join_timeout = o.join_timeout;
        ro.last_call_timeout = o.join_timeout;  // the round closes at max_nodes
        Rendezvous rdzv([&] { return connect(me.round, nullptr); }, ro,
                        [&] { return connect(me.keep_alive, i == 0 ? cut : nullptr, watches); });
        ready.arrive();
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait_until(lock, deadline, [&] { return go.load(); });
        }
        me.released = Clock::now();
        rdzv.next_round();
        me.formed = Clock::now();
        formed.arrive();
        was_formed = true;
        if (!o.reform) return;
        std::atomic<bool> ended{false};
        std::mutex emu;
        std::condition_variable ecv;
        auto keep_alive = rdzv.watch([&](const RoundEnd&) {
          me.ended = Clock::now();
          std::lock_guard<std::mutex> lock(emu);
          ended = true;
          ecv.notify_all();
        });
        // Node 0's keep-alive connection is cut from outside (its round ends
        // as a lost store); the others see the round ended by its death.
        {
          std::unique_lock<std::mutex> lock(emu);
          if (!ecv.wait_until(lock, deadline, [&] { return ended.load(); }))
            throw std::runtime_error("the round never ended after node 0 died");
        }
        keep_alive.reset();
        me.left = Clock::now();
        if (i == 0) return;
        // Requests from here on are the re-formation's.
        const int64_t r0 = me.round.requests, b0 = me.round.bytes;
        rdzv.next_round();
        me.reformed = Clock::now();
        me.reform.requests = me.round.requests - r0;
        me.reform.bytes = me.round.bytes - b0;
      } catch (const std::exception& e) {
        me.error = "node" + std::to_string(i) + ": " + e.what();
        if (!was_formed) formed.arrive();
        watches();
      }
    });
  }
  if (ready.wait_all(deadline)) {
    std::lock_guard<std::mutex> lock(mu);
    start = Clock::now();
    go = true;
  }
  const double cpu_at_start = server ? cpu_seconds(loop) : 0;
  const double process_at_start = process_cpu_seconds();
  result.setup_s = seconds(start - begin);
  result.store_cpu_setup_s = cpu_at_start;
  cv.notify_all();
  double cpu_formed = cpu_at_start;
  if (formed.wait_all(deadline) && server) cpu_formed = cpu_seconds(loop);
  result.store_cpu_formation_s = cpu_formed - cpu_at_start;
  result.cpu_formation_s = process_cpu_seconds() - process_at_start;
  double cpu_at_death = cpu_formed, process_at_death = 0;
  if (o.reform && watching.wait_all(deadline)) {
    if (server) cpu_at_death = cpu_seconds(loop);
    process_at_death = process_cpu_seconds();
    death = Clock::now();
    cut->cancel();  // node 0's agent "died": its keep-alive socket goes down
  }
  for (auto& t : threads) t.join();
  if (o.reform && process_at_death > 0) result.cpu_reformation_s = process_cpu_seconds() - process_at_death;
  if (server) {
    if (o.reform) result.store_cpu_reformation_s = cpu_seconds(loop) - cpu_at_death;
    boost::asio::post(io, [&] { server->close(); io.stop(); });
    loop.join();
    server.reset();
  }

  int64_t reqs = 0, bytes = 0, rreqs = 0, rbytes = 0;
  Clock::time_point last = start, rlast = death, released = start, rended = death, rleft = death;
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = nodes[i];
    if (!nd.error.empty() && result.error.empty()) result.error = nd.error;
    int64_t formation_requests = nd.round.requests - nd.reform.requests;
    reqs += formation_requests;
    bytes += nd.round.bytes - nd.reform.bytes;
    result.max_requests = std::max(result.max_requests, formation_requests);
    last = std::max(last, nd.formed);
    released = std::max(released, nd.released);
    if (i == 0) continue;
    rreqs += nd.reform.requests;
    rbytes += nd.reform.bytes;
    result.reform_max_requests = std::max<int64_t>(result.reform_max_requests, nd.reform.requests);
    rlast = std::max(rlast, nd.reformed);
    rended = std::max(rended, nd.ended);
    rleft = std::max(rleft, nd.left);
  }
  result.formation_s = seconds(last - start);
  result.release_s = seconds(released - start);
  result.requests_per_node = static_cast<double>(reqs) / n;
  result.bytes_per_node = static_cast<double>(bytes) / n;
  if (o.reform && n > 1) {
    result.reformation_s = seconds(rlast - death);
    result.reform_ended_s = seconds(rended - death);
    result.reform_left_s = seconds(rleft - death);
    result.reform_requests_per_node = static_cast<double>(rreqs) / (n - 1);
    result.reform_bytes_per_node = static_cast<double>(rbytes) / (n - 1);
  }
  return result;
}

std::string to_json(const SimOptions& o, const SimResult& r) {
  std::ostringstream s;
  s.precision(4);
  s << "{\"backend\": \"" << o.backend << "\", \"nodes\": " << r.nodes
    << ", \"setup_s\": " << r.setup_s << ", \"release_s\": " << r.release_s
    << ", \"formation_s\": " << r.formation_s << ", \"reformation_s\": " << r.reformation_s
    << ", \"reform_ended_s\": " << r.reform_ended_s << ", \"reform_left_s\": " << r.reform_left_s
    << ", \"requests_per_node\": " << r.requests_per_node << ", \"max_requests\": " << r.max_requests
    << ", \"bytes_per_node\": " << static_cast<int64_t>(r.bytes_per_node)
    << ", \"reform_requests_per_node\": " << r.reform_requests_per_node
    << ", \"reform_max_requests\": " << r.reform_max_requests
    << ", \"reform_bytes_per_node\": " << static_cast<int64_t>(r.reform_bytes_per_node)
    << ", \"cpu_formation_s\": " << r.cpu_formation_s
    << ", \"cpu_reformation_s\": " << r.cpu_reformation_s
    << ", \"store_cpu_setup_s\": " << r.store_cpu_setup_s
    << ", \"store_cpu_formation_s\": " << r.store_cpu_formation_s
    << ", \"store_cpu_reformation_s\": " << r.store_cpu_reformation_s;
  if (!r.error.empty()) {
    std::string e;
    for (char c : r.error) {
      if (c == '"' || c == '\\') e += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) e += c;
    }
    s << ", \"error\": \"" << e << "\"";
  }
  s << "}";
  return s.str();
}

}  // namespace ddprun::bench
