// store_attack_bench: each attack of the hostile suite (tests/rendezvous/
// hostile.h) against ddprun-store and against c10d's TCPStore under the
// same attack, side by side, one run.
//
//   store_attack_bench [--python PY]... [--idle-ms 1000] [--attack-ms 4000]
//                      [--only SUBSTRING]
//
// Each store is a fresh process per attack on 127.0.0.1: ddprun-store
// (default limits), and for every --python interpreter
// bench/tcpstore_server.py (torch 2.x: the libuv server; torch 1.13: its
// classic one). Default interpreters: .venv-torch/bin/python when it
// exists, and /usr/bin/python3. For each attack and store it prints a
// markdown row: the server process's RSS idle and its peak under attack, a
// well-behaved client's set+get latency p50/p99 idle and under attack (the
// same client pattern on both stores), and whether fresh good connections
// were served. Rows where an attack does not apply say so.
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "base/fd_limit.h"
#include "bench/tcpstore_wire.h"
#include "rendezvous/server.h"
#include "tests/rendezvous/hostile.h"
#include "tests/rendezvous/store_process.h"

namespace rdzv = ddprun::rendezvous;
namespace hostile = ddprun::rendezvous::hostile;
namespace tcps = ddprun::bench::tcpstore;
using rdzv::testing::StoreProcess;
using ms = std::chrono::milliseconds;

namespace {

struct Config {
  std::vector<std::string> pythons;
  ms idle{1000}, attack{4000};
  std::string only;
};

// One attack, in both stores' bytes; `tcpstore` empty where it does not apply.
struct Attack {
  std::string name;
  std::string token;  // ddprun-store's (TCPStore has none)
  size_t connections = 100;
  bool drain = true, repeat = false;
  std::function<std::shared_ptr<const rdzv::wire::Bytes>(size_t, uint64_t)> ddprun;
  std::function<tcps::Bytes(tcps::Protocol, size_t, uint64_t)> tcpstore;
  std::string not_applicable;  // why there is no TCPStore row
  bool big_value = false;      // store "hostile/big" (1 MiB) first
  // Source addresses, `connections` from each (default: 127.0.0.2 alone).
  std::vector<std::string> sources;
  // A second attacker from 127.0.0.3: one connection, repeating.
  std::function<std::shared_ptr<const rdzv::wire::Bytes>(size_t, uint64_t)> ddprun_second;
  std::function<tcps::Bytes(tcps::Protocol, size_t, uint64_t)> tcpstore_second;
};

std::vector<Attack> attacks() {
  std::vector<Attack> v;
  auto fixed = [](tcps::Bytes (*f)(tcps::Protocol)) {
    return [f](tcps::Protocol p, size_t, uint64_t) { return f(p); };
  };
  Attack a;
  a = {};
  a.name = "100 conns send a 4 MiB frame before auth (token set)";
  a.token = "s3cret";
  a.ddprun = hostile::partial_big_frame;
  a.not_applicable = "TCPStore has no authentication: see the row below";
  v.push_back(a);
  a = {};
  a.name = "100 conns park 4 MiB partial frames";
  a.ddprun = hostile::partial_big_frame;
  a.tcpstore = fixed(tcps::partial_big_frame);
  v.push_back(a);
  a = {};
  a.name = "100 conns: 4 MiB wait on missing keys + 4 MiB behind";
  a.ddprun = hostile::wait_flood;
  a.tcpstore = fixed(tcps::wait_flood);
  v.push_back(a);
  a = {};
  a.name = "100 conns never read 24 MiB of replies each";
  a.drain = false;
  a.big_value = true;
  a.ddprun = hostile::unread_replies;
  a.tcpstore = fixed(tcps::unread_replies);
  v.push_back(a);
  for (std::string token : {"", "s3cret"}) {
    a = {};
    a.name = std::string("one peer, 16,384 idle conns") + (token.empty() ? "" : " (token set)");
    a.token = token;
    a.connections = 16384;
    a.ddprun = [](size_t, uint64_t) { return std::make_shared<const rdzv::wire::Bytes>(); };
    if (token.empty()) {
      a.tcpstore = [](tcps::Protocol, size_t, uint64_t) { return tcps::Bytes{}; };
    } else {
      a.not_applicable = "TCPStore has no authentication";
    }
    v.push_back(a);
  }
  a = {};
  a.name = "4 conns flood tiny unique keys";
  a.connections = 4;
  a.repeat = true;
  a.ddprun = hostile::key_flood;
  a.tcpstore = tcps::key_flood;
  v.push_back(a);
  // Issue 19's quadratic notify: 16 waits on 8,192 keys while another
  // connection sets and deletes those keys in a loop.
  a = {};
  a.name = "16 waits x 8,192 keys + a set/delete loop";
  a.connections = 16;
  a.ddprun = hostile::wait_on_many;
  a.tcpstore = [](tcps::Protocol p, size_t conn, uint64_t) { return tcps::wait_on_many(p, conn); };
  a.ddprun_second = hostile::set_delete_loop;
  a.tcpstore_second = [](tcps::Protocol p, size_t, uint64_t round) {
    return tcps::set_delete_loop(p, round);
  };
  v.push_back(a);
  // Issue 19's pre-authentication slot flood: 16 addresses in 16 /24s
  // hold all 1,024 unauthenticated slots, reconnecting whatever is closed.
  a = {};
  a.name = "16 addresses x 64 conns hold the pre-auth slots (token set)";
  a.token = "s3cret";
  a.connections = rdzv::wire::kMaxUnauthenticatedPerPeer;
  for (int n = 1; n <= 16; ++n) a.sources.push_back("127.0." + std::to_string(n) + ".2");
  a.ddprun = [](size_t, uint64_t) { return std::make_shared<const rdzv::wire::Bytes>(); };
  a.not_applicable = "TCPStore has no authentication, so no pre-auth slots";
  v.push_back(a);
  return v;
}

std::string torch_version(const std::string& log) {
  auto at = log.find("(torch ");
  return at == std::string::npos ? "?" : log.substr(at + 7, log.find(')', at) - at - 7);
}

double mib(size_t b) { return static_cast<double>(b) / 1048576.0; }

// "p50 / p99 ms", or what happened instead when no round completed.
std::string latency(const hostile::GoodStats& g) {
  if (g.latency_ms.empty()) return "no round completed";
  char b[64];
  std::snprintf(b, sizeof b, "%.3f / %.3f ms", g.p(0.5), g.p(0.99));
  return b;
}

void row(const std::string& attack, const std::string& store, const hostile::Measurement& m) {
  std::string ratio = "-";
  if (!m.attack.latency_ms.empty() && !m.idle.latency_ms.empty()) {
    char b[32];
    std::snprintf(b, sizeof b, "x%.2f", m.p99_ratio());
    ratio = b;
  }
  std::printf("| %s | %s | %.1f -> %.1f MiB (+%.1f) | %s | %s | %s | %llu served, %llu failed%s |\n",
              attack.c_str(), store.c_str(), mib(m.idle_rss), mib(m.peak_rss),
              mib(m.peak_rss - m.idle_rss), latency(m.idle).c_str(), latency(m.attack).c_str(),
              ratio.c_str(), static_cast<unsigned long long>(m.attack.fresh_ok),
              static_cast<unsigned long long>(m.attack.failures),
              m.established ? "" : " (attack not fully connected)");
  if (!m.attack.first_error.empty()) std::printf("|   | first failure: %s |\n", m.attack.first_error.c_str());
  std::fflush(stdout);
}

using Script = std::function<std::shared_ptr<const rdzv::wire::Bytes>(size_t, uint64_t)>;

hostile::Attackers start(const Attack& a, uint16_t port, Script script, Script second = {}) {
  hostile::Attackers v;
  std::vector<const char*> sources;  // read at each connect: `a` outlives the attack
  for (const auto& src : a.sources) sources.push_back(src.c_str());
  if (sources.empty()) sources.push_back("127.0.0.2");
  for (const char* src : sources) {
    hostile::AttackOptions o;
    o.port = port;
    o.source = src;
    o.connections = a.connections;
    o.drain = a.drain;
    o.repeat = a.repeat;
    o.script = script;
    v.push_back(std::make_unique<hostile::Attacker>(std::move(o)));
  }
  if (second) {
    hostile::AttackOptions o;
    o.port = port;
    o.source = "127.0.0.3";
    o.connections = 1;
    o.repeat = true;
    o.script = std::move(second);
    v.push_back(std::make_unique<hostile::Attacker>(std::move(o)));
  }
  return v;
}

void run_ddprun(const Config& cfg, const Attack& a) {
  std::vector<std::string> env = {"DDPRUN_STORE_TOKEN"};
  env.push_back(a.token.empty() ? "DDPRUN_RDZV_TOKEN" : "DDPRUN_RDZV_TOKEN=" + a.token);
  StoreProcess store(DDPRUN_STORE_BIN, {}, env);
  auto port = store.port();
  if (!port) throw std::runtime_error("ddprun-store did not start: " + store.log());
  rdzv::ClientOptions co;
  co.host = "127.0.0.1";
  co.port = *port;
  co.token = a.token;
  co.connect_timeout = ms(10000);
  co.op_timeout = ms(10000);
  if (a.big_value) rdzv::Client(co).set("hostile/big", rdzv::wire::Bytes(1 << 20, 'b'));
  auto m = hostile::measure([&] { return store.rss(); },
                            [&](ms d) { return hostile::good_client(co, d); },
                            [&] { return start(a, *port, a.ddprun, a.ddprun_second); },
                            cfg.idle, cfg.attack);
  row(a.name, "ddprun-store", m);
  store.stop();
}

void run_tcpstore(const Config& cfg, const Attack& a, const std::string& python) {
  StoreProcess store(StoreProcess::Command{{python, BENCH_DIR "/tcpstore_server.py"}});
  auto port = store.port(ms(120000));  // torch 2.x imports in ~20 s on a busy machine
  if (!port) throw std::runtime_error(python + ": TCPStore server did not start: " + store.log());
  std::string version = torch_version(store.log());
  tcps::Protocol proto{version.rfind("1.", 0) != 0};
  if (a.big_value) tcps::Client(*port, proto).set("hostile/big", tcps::Bytes(1 << 20, 'b'));
  auto connect = [&] { return std::make_unique<tcps::Client>(*port, proto); };
  auto script = [&a, proto](size_t conn, uint64_t round) {
    // Fixed attacks are the same bytes for every connection: built once.
    static std::map<std::pair<const Attack*, bool>, std::shared_ptr<const rdzv::wire::Bytes>> cache;
    if (a.repeat) return std::make_shared<const rdzv::wire::Bytes>(a.tcpstore(proto, conn, round));
    auto& c = cache[{&a, proto.v2}];
    if (!c) c = std::make_shared<const rdzv::wire::Bytes>(a.tcpstore(proto, conn, round));
    return c;
  };
  Script second;
  if (a.tcpstore_second)
    second = [&a, proto](size_t conn, uint64_t round) {
      return std::make_shared<const rdzv::wire::Bytes>(a.tcpstore_second(proto, conn, round));
    };
  auto m = hostile::measure([&] { return store.rss(); },
                            [&](ms d) { return hostile::good_client_of(connect, d); },
                            [&] { return start(a, *port, script, second); }, cfg.idle, cfg.attack);
  row(a.name, "TCPStore " + version, m);
  store.stop();
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "store_attack_bench: %s needs a value\n", f.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (f == "--python") cfg.pythons.push_back(v);
    else if (f == "--idle-ms") cfg.idle = ms(std::stoi(v));
    else if (f == "--attack-ms") cfg.attack = ms(std::stoi(v));
    else if (f == "--only") cfg.only = v;
    else {
      std::fprintf(stderr, "store_attack_bench: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (cfg.pythons.empty()) {
    if (::access(SOURCE_DIR "/.venv-torch/bin/python", X_OK) == 0) cfg.pythons.push_back(SOURCE_DIR "/.venv-torch/bin/python");
    cfg.pythons.push_back("/usr/bin/python3");
  }
  ddprun::base::raise_fd_limit();
  std::printf("load average at start: %s\n\n", loadavg().c_str());
  std::printf("| attack | store | server RSS idle -> peak | good p50 / p99 idle | good p50 / p99 under attack | p99 ratio | fresh good connections |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  int rc = 0;
  for (const auto& a : attacks()) {
    if (!cfg.only.empty() && a.name.find(cfg.only) == std::string::npos) continue;
    try {
      run_ddprun(cfg, a);
    } catch (const std::exception& e) {
      std::printf("| %s | ddprun-store | error: %s |\n", a.name.c_str(), e.what());
      rc = 1;
    }
    for (const auto& py : cfg.pythons) {
      if (!a.tcpstore) {
        std::printf("| %s | TCPStore (torch of %s) | n/a: %s |\n", a.name.c_str(), py.c_str(), a.not_applicable.c_str());
        continue;
      }
      try {
        run_tcpstore(cfg, a, py);
      } catch (const std::exception& e) {
        std::printf("| %s | TCPStore (%s) | error: %s |\n", a.name.c_str(), py.c_str(), e.what());
        rc = 1;
      }
    }
  }
  std::printf("\nload average at end: %s\n", loadavg().c_str());
  return rc;
}
