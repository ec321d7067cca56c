// store_bench: the ddprun store against LibTorch's c10d::TCPStore, same
// machine, same process, same client pattern, one run.
//
//   store_bench [--seconds S] [--reps R] [--clients 1,16,64] [--barrier 256,1024,4096]
//
// Throughput: K threads, each with its own connection, loop set(k_i, 64 B)
// then get(k_i) for S seconds; ops/s counts both calls. Barrier: N threads
// (1 MiB stacks), each opens its own connection, adds 1 to a counter; the
// one that reads N sets the final key, every other one blocks in get() of
// it. Time is from releasing the threads to the last get returning, server
// start and thread creation excluded. Each store's server runs in a child
// process (this program with --serve NAME) on 127.0.0.1, a fresh one per
// measurement; the two stores are measured alternately, --reps times.
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <spdlog/spdlog.h>

#include "base/fd_limit.h"
#include "bench/store_bench_client.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"

namespace rdzv = ddprun::rendezvous;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

using ddprun::bench::BenchClient;

struct Backend {
  std::string name;
  std::function<std::unique_ptr<BenchClient>()> connect;
  std::function<void(bool start)> server;  // start a fresh server, or stop it
};

// --- ours
struct OurClient : BenchClient {
  explicit OurClient(rdzv::ClientOptions o) : c(std::move(o)) {}
  void set(const std::string& k, const std::vector<uint8_t>& v) override { c.set(k, v); }
  std::vector<uint8_t> get(const std::string& k) override { return c.get(k, 120s); }
  int64_t add(const std::string& k, int64_t d) override { return c.add(k, d); }
  rdzv::Client c;
};

struct OurServer {
  boost::asio::io_context io;
  std::unique_ptr<rdzv::Server> server;
  std::thread thread;
  OurServer() {
    rdzv::ServerOptions o;
    o.host = "127.0.0.1";
    // Every bench client comes from 127.0.0.1, where a job's would come from
    // one address per node: the per-address cap (2,048) would refuse the
    // 4,096- and 16,384-client barriers, which stand for that many hosts.
    o.max_connections_per_peer = o.max_connections;
    server = std::make_unique<rdzv::Server>(io, o);
    thread = std::thread([this] { io.run(); });
  }
  ~OurServer() {
    boost::asio::post(io, [this] {
      server->close();
      io.stop();
    });
    thread.join();
  }
};


// A store server in a child process (this program with --serve NAME), so
// the clients' and the server's descriptors and CPU time are separate, as
// they are when the store runs on its own host. Closing the child's stdin
// stops it.
struct ServerProcess {
  pid_t pid = -1;
  int to_child = -1;
  uint16_t port = 0;
  explicit ServerProcess(const std::string& name) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) std::abort();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::string self = "/proc/self/exe";
    std::vector<char*> argv = {self.data(), const_cast<char*>("--serve"),
                               const_cast<char*>(name.c_str()), nullptr};
    if (posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ) != 0) std::abort();
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_child = in[1];
    FILE* f = fdopen(out[0], "r");
    unsigned p = 0;
    if (std::fscanf(f, "PORT %u", &p) != 1) {
      std::fprintf(stderr, "server process for %s did not report its port\n", name.c_str());
      std::abort();
    }
    std::fclose(f);
    port = static_cast<uint16_t>(p);
  }
  ~ServerProcess() {
    close(to_child);
    int status = 0;
    waitpid(pid, &status, 0);
  }
};

int serve(const std::string& name) {
  ddprun::base::raise_fd_limit();
  auto wait_for_eof = [] {
    char c;
    while (read(0, &c, 1) > 0) {
    }
  };
  if (name == "ddprun") {
    OurServer s;
    std::printf("PORT %u\n", s.server->endpoint().port());
    std::fflush(stdout);
    wait_for_eof();
    return 0;
  }
  if (name == "tcpstore") return ddprun::bench::serve_tcpstore();
  return 2;
}

// Runs f(i) on n threads with small stacks, all released together; returns
// the seconds from release to the last thread's end.
double run_threads(int n, const std::function<void(int)>& f) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool go = false;
    const std::function<void(int)>* f;
  } sh;
  sh.f = &f;
  struct Arg {
    Shared* sh;
    int i;
  };
  std::vector<Arg> args(n);
  std::vector<pthread_t> threads(n);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  // 1 MiB, not less: glibc carves the static TLS of every loaded library out
  // of each thread's stack, and the CUDA LibTorch's is large enough that
  // 256 KiB stacks overflowed in the client's 64 KiB receive buffer. Stacks
  // are reserved, not committed, so 16,384 of them cost address space only.
  pthread_attr_setstacksize(&attr, 1024 * 1024);
  for (int i = 0; i < n; ++i) {
    args[i] = {&sh, i};
    int rc = pthread_create(&threads[i], &attr, [](void* p) -> void* {
      auto* a = static_cast<Arg*>(p);
      {
        std::unique_lock<std::mutex> lock(a->sh->mu);
        a->sh->cv.wait(lock, [&] { return a->sh->go; });
      }
      try {
        (*a->sh->f)(a->i);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "client %d: %s\n", a->i, e.what());
        std::abort();
      }
      return nullptr;
    }, &args[i]);
    if (rc != 0) {
      std::fprintf(stderr, "pthread_create: %s\n", std::strerror(rc));
      std::abort();
    }
  }
  pthread_attr_destroy(&attr);
  auto start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.go = true;
  }
  sh.cv.notify_all();
  for (auto& t : threads) pthread_join(t, nullptr);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double throughput(Backend& b, int clients, double seconds) {
  std::vector<std::unique_ptr<BenchClient>> cs;
  for (int i = 0; i < clients; ++i) cs.push_back(b.connect());
  std::atomic<uint64_t> ops{0};
  std::vector<uint8_t> value(64, 'v');
  auto end = Clock::now() + std::chrono::duration<double>(seconds);
  double elapsed = run_threads(clients, [&](int i) {
    std::string key = "tp/" + std::to_string(i);
    uint64_t n = 0;
    while (Clock::now() < end) {
      cs[i]->set(key, value);
      if (cs[i]->get(key).size() != value.size()) std::abort();
      n += 2;
    }
    ops += n;
  });
  return static_cast<double>(ops.load()) / elapsed;
}

double barrier(Backend& b, int n, int round) {
  std::string prefix = "barrier" + std::to_string(round) + "/";
  double t = run_threads(n, [&](int) {
    auto c = b.connect();
    if (c->add(prefix + "count", 1) == n) {
      c->set(prefix + "go", {1});
    } else {
      c->get(prefix + "go");
    }
  });
  return t;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  int reps = 3;
  std::vector<int> clients = {1, 16, 64};
  std::vector<int> barriers = {256, 1024, 4096};
  std::string only;
  if (argc == 3 && std::string(argv[1]) == "--serve") return serve(argv[2]);
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seconds") seconds = std::stod(argv[i + 1]);
    else if (a == "--clients") clients = parse_list(argv[i + 1]);
    else if (a == "--barrier") barriers = parse_list(argv[i + 1]);
    else if (a == "--only") only = argv[i + 1];
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: store_bench [--seconds S] [--reps R] [--clients 1,16] [--barrier 256] [--only ddprun|tcpstore]\n");
      return 2;
    }
  }
  std::printf("fd limit %llu\n", static_cast<unsigned long long>(ddprun::base::raise_fd_limit().soft));
  spdlog::set_level(spdlog::level::warn);

  // Backends are measured alternately, `reps` times each, with a fresh
  // server every time, and the median is kept: the other load on the
  // machine then hits both alike.
  std::vector<Backend> backends;
  auto ours = std::make_shared<std::unique_ptr<ServerProcess>>();
  backends.push_back(Backend{
      "ddprun",
      [ours]() -> std::unique_ptr<BenchClient> {
        rdzv::ClientOptions o;
        o.host = "127.0.0.1";
        o.port = (*ours)->port;
        o.connect_timeout = 120s;
        return std::make_unique<OurClient>(o);
      },
      [ours](bool start) {
        ours->reset();
        if (start) *ours = std::make_unique<ServerProcess>("ddprun");
      }});
  std::printf("anchor: %s\n", ddprun::bench::tcpstore_description().c_str());
  if (ddprun::bench::have_tcpstore()) {
    auto theirs = std::make_shared<std::unique_ptr<ServerProcess>>();
    backends.push_back(Backend{
        "tcpstore",
        [theirs]() -> std::unique_ptr<BenchClient> {
          return ddprun::bench::connect_tcpstore("127.0.0.1", (*theirs)->port);
        },
        [theirs](bool start) {
          theirs->reset();
          if (start) *theirs = std::make_unique<ServerProcess>("tcpstore");
        }});
  }
  if (!only.empty()) {
    backends.erase(std::remove_if(backends.begin(), backends.end(),
                                  [&](const Backend& b) { return b.name != only; }),
                   backends.end());
  }

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  struct Row {
    std::string what;
    bool higher_is_better;
    std::vector<double> value;  // median per backend
    std::vector<double> best;   // best sample per backend
  };
  std::vector<Row> rows;
  int round = 0;
  auto measure = [&](const std::string& what, bool higher, int r, auto f) {
    std::vector<std::vector<double>> samples(backends.size());
    for (int rep = 0; rep < r; ++rep) {
      for (size_t b = 0; b < backends.size(); ++b) {
        backends[b].server(true);
        samples[b].push_back(f(backends[b]));
        backends[b].server(false);
      }
    }
    Row row{what, higher, {}, {}};
    for (size_t b = 0; b < backends.size(); ++b) {
      row.value.push_back(median(samples[b]));
      row.best.push_back(higher ? *std::max_element(samples[b].begin(), samples[b].end())
                                : *std::min_element(samples[b].begin(), samples[b].end()));
      std::printf("%-9s %-22s %12.3f  (samples:", backends[b].name.c_str(), what.c_str(),
                  row.value.back());
      for (double x : samples[b]) std::printf(" %.3f", x);
      std::printf(")\n");
      std::fflush(stdout);
    }
    rows.push_back(row);
  };
  for (int k : clients) {
    measure("set+get " + std::to_string(k) + " clients ops/s", true, reps,
            [&](Backend& b) { return throughput(b, k, seconds); });
  }
  for (int n : barriers) {
    measure("barrier " + std::to_string(n) + " clients s", false, n >= 4096 ? std::max(1, reps / 2) : reps,
            [&](Backend& b) { return barrier(b, n, round++); });
  }

  if (backends.size() == 2) {
    std::printf("\nratios ddprun vs tcpstore (>1 means ddprun is better): median, best\n");
    for (const Row& r : rows) {
      double ratio = r.higher_is_better ? r.value[0] / r.value[1] : r.value[1] / r.value[0];
      double best = r.higher_is_better ? r.best[0] / r.best[1] : r.best[1] / r.best[0];
      std::printf("%-32s %6.2fx %6.2fx\n", r.what.c_str(), ratio, best);
    }
  }
  return 0;
}
