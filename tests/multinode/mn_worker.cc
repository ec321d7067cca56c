// The multi-node tests' worker: meets the other workers of its round through
// ddprun's store (DDPRUN_STORE_*), or, where the job has none (the etcd
// backend), through the agent's c10d TCPStore at MASTER_ADDR:MASTER_PORT
// as torch's env:// would (tcpstore_meet.h; the round is then named by
// TORCHELASTIC_RESTART_COUNT); writes what it was told to
// $MN_OUT/<node>.r<round>.l<local_rank> (written whole, then renamed), and
// waits for $MN_OUT/stop (or $MN_OUT/$MN_STOP_NAME) with inotify (deadline
// 60 s), then exits 0; or exits 5 once $MN_OUT/$MN_FAIL_FILE appears (when
// set). With MN_FAIL_RANK=N, global rank N exits 7 right after writing its
// file.
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <memory>
#include <vector>

#include "rendezvous/client.h"
#include "tests/multinode/tcpstore_meet.h"

namespace rdzv = ddprun::rendezvous;

static std::string env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

static bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

int main() {
  const std::string out = env("MN_OUT"), node = env("MN_NODE");
  const std::string prefix = env("DDPRUN_STORE_PREFIX");
  const int rank = std::atoi(env("RANK").c_str());
  const int world = std::atoi(env("WORLD_SIZE").c_str());
  auto at = prefix.find("round_");
  const bool own_store = env("DDPRUN_STORE_ADDR").empty();
  const std::string round = own_store              ? env("TORCHELASTIC_RESTART_COUNT")
                            : at == std::string::npos ? "x"
                                                      : prefix.substr(at + 6, prefix.size() - at - 7);
  // Every rank of the round sets its key and reads everyone's: the workers
  // of all nodes reach the store with the token and the round's prefix.
  std::string met = "no";
  try {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
    if (own_store) {
      mn::TcpStoreMeet store(env("MASTER_ADDR"), env("MASTER_PORT"), std::chrono::seconds(20));
      store.set("rank/" + std::to_string(rank), node);
      store.wait(keys);
    } else {
      auto store = rdzv::connect_from_env(std::chrono::seconds(10));
      store->set("rank/" + std::to_string(rank), rdzv::to_bytes(node));
      store->multi_get(keys, std::chrono::seconds(20));
    }
    met = "yes";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mn_worker rank %d: %s\n", rank, e.what());
  }

  const std::string name = out + "/" + node + ".r" + round + ".l" + env("LOCAL_RANK");
  {
    std::ofstream f(name + ".tmp");
    for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                          "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
                          "DDPRUN_STORE_ADDR", "DDPRUN_STORE_PREFIX"})
      f << k << "=" << env(k) << "\n";
    f << "MET=" << met << "\n";
  }
  std::rename((name + ".tmp").c_str(), name.c_str());
  if (env("MN_FAIL_RANK") == std::to_string(rank)) std::_Exit(7);

  const std::string stop = out + "/" + (env("MN_STOP_NAME").empty() ? "stop" : env("MN_STOP_NAME"));
  int fd = inotify_init1(IN_CLOEXEC);
  inotify_add_watch(fd, out.c_str(), IN_CREATE | IN_MOVED_TO);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const std::string fail = env("MN_FAIL_FILE").empty() ? "" : out + "/" + env("MN_FAIL_FILE");
  while (!exists(stop)) {
    if (!fail.empty() && exists(fail)) std::_Exit(5);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) std::_Exit(3);
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) > 0) {
      char buf[4096];
      (void)!read(fd, buf, sizeof buf);
    }
  }
  std::_Exit(0);  // the detached server thread is still running
}
