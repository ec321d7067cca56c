// The multi-node tests' job: three agents, one a namespace, 2 workers each
// (mn_worker), meeting at the store hosted by node 1's agent
// (10.77.0.1:29400), and the checks on the records their workers write.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/multinode/netns.h"

namespace ddprun::testing {

inline const std::string kEndpoint = "10.77.0.1:29400";
inline const std::string kToken = "mn-secret-" + std::to_string(getpid());

inline std::vector<std::string> agent_args(const std::string& extra_conf = "",
                                    const std::string& nnodes = "2:3") {
  return {"--nnodes=" + nnodes, "--nproc-per-node=2", "--rdzv-backend=c10d",
          "--rdzv-endpoint=" + kEndpoint, "--rdzv-id=mnjob",
          "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=1,"
          "join_timeout=20,close_timeout=10" + extra_conf,
          "--max-restarts=3", "--term-timeout=5", MN_WORKER};
}

// How long a step of a multi-node test may take (a round forming, an agent
// exiting).
inline const Seconds kDeadline(25);

struct Job {
  explicit Job(const std::string& test, int nodes = 3) : net(test, nodes) {}
  Netns net;
  TempDir dir;
  std::vector<std::unique_ptr<NodeAgent>> agents{4};

  void start(int node, std::vector<std::string> env = {}, std::vector<std::string> args = agent_args()) {
    env.push_back("MN_OUT=" + dir.path());
    env.push_back("MN_NODE=n" + std::to_string(node));
    if (std::none_of(env.begin(), env.end(),
                     [](const std::string& e) { return e.rfind("DDPRUN_RDZV_TOKEN=", 0) == 0; }))
      env.push_back("DDPRUN_RDZV_TOKEN=" + kToken);
    agents[node] = std::make_unique<NodeAgent>(net.ns(node), args, env,
                                               dir.path() + "/n" + std::to_string(node) + ".log");
  }
  // Starts node `node` and waits until its agent joins: it joins first,
  // so it holds group rank 0 of the first round.
  void start_first(int node, std::vector<std::string> env = {},
                   std::vector<std::string> args = agent_args()) {
    start(node, std::move(env), std::move(args));
    REQUIRE(wait_in_dir(dir.path(), [&] {
      return log(node).find("joining rendezvous") != std::string::npos;
    }, kDeadline));
  }
  void stop_workers() { std::ofstream(dir.path() + "/stop") << "stop\n"; }
  // Stops the workers; nodes first..last each exit 0, and a log that
  // holds `absent` (when given) is a failure.
  void finish(int first, int last, const std::string& absent = "") {
    stop_workers();
    for (int n = first; n <= last; ++n) {
      INFO("node " << n << ":\n" << log(n));
      CHECK(agents[n]->wait(kDeadline) == 0);
      if (!absent.empty()) CHECK(log(n).find(absent) == std::string::npos);
    }
  }
  std::string log(int node) { return agents[node] ? agents[node]->log() : ""; }
  // MN_KEEP_LOGS=<dir>: keep the agents' logs for a look after the test.
  ~Job() {
    const char* keep = getenv("MN_KEEP_LOGS");
    if (!keep) return;
    for (int n = 1; n <= 3; ++n)
      if (agents[n]) std::ofstream(std::string(keep) + "/" + net.ns(n) + ".log") << agents[n]->log();
  }
};

// The newest round with exactly `world` worker records, or -1.
inline int round_with(const std::vector<Record>& recs, int world, int after = -1) {
  std::map<int, int> count;
  for (const auto& r : recs)
    if (r.num("WORLD_SIZE") == world && r.round > after) ++count[r.round];
  int best = -1;
  for (auto [round, n] : count)
    if (n == world) best = std::max(best, round);
  return best;
}

inline std::vector<Record> in_round(const std::vector<Record>& recs, int round) {
  std::vector<Record> out;
  for (const auto& r : recs)
    if (r.round == round) out.push_back(r);
  return out;
}

// Ranks 0..world-1 once each, consistent group ranks, one master, the
// store at `store` (node 1's, unless another node took it over).
inline void check_round(const std::vector<Record>& round, int world,
                        const std::string& store = kEndpoint) {
  REQUIRE(round.size() == static_cast<size_t>(world));
  std::set<int> ranks, group_ranks;
  std::map<std::string, int> node_group;
  std::string master_node;
  for (const auto& r : round) {
    INFO(r.node << " rank " << r.num("RANK"));
    ranks.insert(r.num("RANK"));
    CHECK(r.num("LOCAL_WORLD_SIZE") == 2);
    CHECK(r.num("GROUP_WORLD_SIZE") == world / 2);
    CHECK(r.num("RANK") == r.num("GROUP_RANK") * 2 + r.num("LOCAL_RANK"));
    CHECK(r.env.at("MET") == "yes");  // reached every rank through the store
    CHECK(r.env.at("DDPRUN_STORE_ADDR") == store);
    CHECK(r.env.at("TORCHELASTIC_RUN_ID") == "mnjob");
    CHECK(r.env.at("MASTER_PORT") == round[0].env.at("MASTER_PORT"));
    CHECK(r.env.at("MASTER_ADDR") == round[0].env.at("MASTER_ADDR"));
    auto [it, fresh] = node_group.emplace(r.node, r.num("GROUP_RANK"));
    CHECK(it->second == r.num("GROUP_RANK"));
    if (fresh) group_ranks.insert(r.num("GROUP_RANK"));
    if (r.num("GROUP_RANK") == 0) master_node = r.node;
  }
  CHECK(ranks.size() == static_cast<size_t>(world));
  CHECK(*ranks.begin() == 0);
  CHECK(*ranks.rbegin() == world - 1);
  CHECK(group_ranks.size() == static_cast<size_t>(world / 2));
  // MASTER_ADDR is group rank 0's address as its store connection saw it.
  REQUIRE(!master_node.empty());
  CHECK(round[0].env.at("MASTER_ADDR") == Netns::addr(std::stoi(master_node.substr(1))));
}

inline std::map<std::string, int> group_ranks(const std::vector<Record>& round) {
  std::map<std::string, int> out;
  for (const auto& r : round) out[r.node] = r.num("GROUP_RANK");
  return out;
}


// Waits (kDeadline) for a round with `world` worker records newer than
// round `after`; returns its number.
inline int wait_round(Job& job, int world, int after = -1) {
  int round = -1;
  REQUIRE(wait_records(job.dir.path(), [&](const auto& recs) {
    return (round = round_with(recs, world, after)) >= 0;
  }, kDeadline));
  return round;
}

// Nodes 1 and 2 form a round of 4; node 1's workers then succeed and its
// agent waits in the exit barrier for node 2, whose workers still run.
inline void park_node1_in_exit_barrier(Job& job) {
  job.start(1, {"MN_STOP_NAME=stop-n1"}, agent_args("", "2"));
  job.start(2, {"MN_STOP_NAME=stop-n2"}, agent_args("", "2"));
  wait_round(job, 4);
  std::ofstream(job.dir.path() + "/stop-n1") << "stop\n";
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    return job.log(1).find("waiting for the other nodes to finish") != std::string::npos;
  }, kDeadline));
}

inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace ddprun::testing
