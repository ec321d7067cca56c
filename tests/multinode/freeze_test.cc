// Freeze detection judged job-wide across nodes: two ddprun agents in two
// network namespaces, one worker each, running the unmodified gloo DDP
// script of the single-node freeze tests (tests/watchdog/scripts/
// unmodified_ddp.py) on Debian's torch 1.13 (/usr/bin/python3, or
// $DDPRUN_TEST_PYTHON) with learned timeouts over a 3 s floor. The jobs
// mostly sleep (simulated steps and a slow checkpoint): about 40 s each.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "tests/common/skip.h"
#include "tests/common/test_python.h"
#include "tests/multinode/netns.h"

namespace ddprun::testing {
namespace {

const std::string kEndpoint = "10.77.0.1:29400";
// For both agents together; generous: a loaded machine, torch imports.
const Seconds kJobDeadline(200);

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Every file named `name` under `dir`.
std::vector<std::string> find_named(const std::string& dir, const std::string& name) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->path().filename() == name) out.push_back(it->path().string());
  }
  return out;
}

struct FreezeJob {
  explicit FreezeJob(const std::string& test) : net(test, 2) {}
  Netns net;
  TempDir dir;
  std::unique_ptr<NodeAgent> agents[3];
  int status[3] = {-1, -1, -1};

  std::string logs(int node) const { return dir.path() + "/logs-n" + std::to_string(node); }
  std::string console(int node) const { return agents[node] ? agents[node]->log() : ""; }
  std::string events(int node) const {
    auto files = find_named(logs(node), "events.jsonl");
    return files.size() == 1 ? slurp(files[0]) : "";
  }
  std::vector<std::string> reports(int node) const { return find_named(logs(node), "hang_report.json"); }
  // The node whose console shows `line` (its worker printed it), or 0.
  int node_with(const std::string& line) const {
    for (int n = 1; n <= 2; ++n)
      if (console(n).find(line) != std::string::npos) return n;
    return 0;
  }

  // MN_KEEP_LOGS=<dir>: keep the agents' consoles and event logs for a look.
  ~FreezeJob() {
    const char* keep = getenv("MN_KEEP_LOGS");
    if (!keep) return;
    for (int n = 1; n <= 2; ++n) {
      std::ofstream(std::string(keep) + "/" + net.ns(n) + ".log") << console(n);
      std::ofstream(std::string(keep) + "/" + net.ns(n) + ".events.jsonl") << events(n);
    }
  }

  void run(const std::string& mode) {
    for (int n = 1; n <= 2; ++n) {
      agents[n] = std::make_unique<NodeAgent>(
          net.ns(n),
          std::vector<std::string>{"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                   "--rdzv-endpoint=" + kEndpoint, "--rdzv-id=xf",
                                   // A node whose teardown outlasts the host's 10 s exit
                                   // hand-shake finds the store gone and retries for the
                                   // join timeout (600 s by default): bounded here.
                                   "--rdzv-conf=join_timeout=30",
                                   "--log-dir=" + logs(n), "--hang-timeout-floor=3",
                                   std::string(WATCHDOG_SCRIPTS) + "/unmodified_ddp.py", mode},
          std::vector<std::string>{"DDPRUN_PYTHON=" + test_python(), "GLOO_SOCKET_IFNAME=eth0",
                                   "DDPRUN_RDZV_TOKEN=xf-" + std::to_string(::getpid())},
          dir.path() + "/n" + std::to_string(n) + ".log");
    }
    const auto until = std::chrono::steady_clock::now() + kJobDeadline;
    for (int n = 1; n <= 2; ++n) {
      const auto left = std::chrono::duration_cast<Seconds>(until - std::chrono::steady_clock::now());
      status[n] = agents[n]->wait(std::max(left, Seconds(1)));
    }
  }
};

#define REQUIRE_TORCH()                                                                     \
  if (run_command({test_python(), "-c", "import torch, torch.distributed"}) != 0) {        \
    SKIP_TEST(test_python() + " cannot import torch.distributed: no torch to run with");   \
    return;                                                                                 \
  }

}  // namespace

TEST_CASE("multinode.freeze_section") {
  // Rank 0 (one node) alone saves a checkpoint for 75 steps' time, 5 x the
  // learned step timeout, while rank 1 on the other node waits in the next
  // all-reduce with no beat: the other node's watchdog sees the section
  // through the store, so the job finishes with no hang on either node.
  REQUIRE_TORCH();
  FreezeJob job("xfsection");
  job.run("xnode");
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.console(n));
    CHECK(job.status[n] == 0);
    CHECK(job.reports(n).empty());
    CHECK(job.console(n).find("freeze:") == std::string::npos);
  }
  const int saver = job.node_with("rank 0 saved its checkpoint");
  const int waiter = job.node_with("rank 1 done");
  REQUIRE(saver != 0);
  REQUIRE(waiter != 0);
  CHECK(saver != waiter);
  // The waiting node knew why its rank was quiet.
  INFO("node " << waiter << "'s events:\n" << job.events(waiter));
  CHECK(job.events(waiter).find("\"peer_section\"") != std::string::npos);
  CHECK(job.events(waiter).find("\"section\":\"checkpoint\"") != std::string::npos);
  CHECK(job.console(waiter).find("'s rank 0 is inside section \"checkpoint\"") != std::string::npos);
}

TEST_CASE("multinode.freeze_hang") {
  // Rank 1 enters a collective nobody joins at step 50; rank 0, on the other
  // node, waits for it in the next all-reduce. No section anywhere: the
  // freeze is caught within the learned bound and the job ends with 124.
  REQUIRE_TORCH();
  FreezeJob job("xfhang");
  job.run("hang");
  const int culprit = job.node_with("rank 1 enters a collective nobody joins");
  REQUIRE(culprit != 0);
  INFO("node 1:\n" << job.console(1) << "\nnode 2:\n" << job.console(2));
  // The first node past its deadline reports it; the other may be told by
  // the round first. Either way no node runs on, and rank 1's node names it.
  bool caught = false;
  for (int n = 1; n <= 2; ++n) {
    CHECK(job.status[n] != 0);
    CHECK(job.status[n] != -1);  // ended, not killed at the test's deadline
    if (job.status[n] == 124) caught = true;
  }
  CHECK(caught);
  CHECK(job.status[culprit] == 124);
  const auto reports = job.reports(culprit);
  REQUIRE(reports.size() == 1);
  const std::string report = slurp(reports[0]);
  CHECK(report.find("\"culprit_rank\": 1") != std::string::npos);
  CHECK(report.find("\"kind\": \"heartbeat_timeout\"") != std::string::npos);
}

}  // namespace ddprun::testing
