// store_bench's c10d::TCPStore side (see store_bench_client.h for why it is
// a file of its own). With torch 2.x the server is the libuv one (the
// default of TCPStoreOptions::useLibUV since torch 2.4).
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "bench/store_bench_client.h"

#ifdef DDPRUN_HAVE_TORCH
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#endif

using namespace std::chrono_literals;

namespace ddprun::bench {

#ifdef DDPRUN_HAVE_TORCH
namespace {

c10d::TCPStoreOptions options(uint16_t port, bool server) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = server;
  o.waitWorkers = false;
  o.timeout = 120s;
  return o;
}

struct TorchClient : BenchClient {
  TorchClient(const std::string& host, uint16_t port)
      : s(std::make_unique<c10d::TCPStore>(host, options(port, false))) {}
  void set(const std::string& k, const std::vector<uint8_t>& v) override { s->set(k, v); }
  std::vector<uint8_t> get(const std::string& k) override { return s->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return s->add(k, d); }
  std::unique_ptr<c10d::TCPStore> s;
};

bool server_is_libuv() {
#if TORCH_VERSION_MAJOR >= 2
  return options(0, true).useLibUV;
#else
  return false;
#endif
}

}  // namespace

bool have_tcpstore() { return true; }

std::string tcpstore_description() {
  return std::string("c10d::TCPStore ") + TORCH_VERSION +
         (server_is_libuv() ? " (libuv server)" : " (classic server)");
}

std::unique_ptr<BenchClient> connect_tcpstore(const std::string& host, uint16_t port) {
  return std::make_unique<TorchClient>(host, port);
}

int serve_tcpstore() {
  c10d::TCPStore s("127.0.0.1", options(0, true));
  std::printf("PORT %u\n", s.getPort());
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

#else

bool have_tcpstore() { return false; }
std::string tcpstore_description() { return "none (built without LibTorch)"; }
std::unique_ptr<BenchClient> connect_tcpstore(const std::string&, uint16_t) { return nullptr; }
int serve_tcpstore() { return 2; }

#endif

}  // namespace ddprun::bench
