// ddprun status across nodes: two agents of one job (on loopback, each with
// a registry of its own, so neither can find the other's control socket)
// meet through the elastic rendezvous; asked on either, status shows all
// four ranks, the other node's from the job's store (introspect/node_board.h).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tests/agent/ddprun_process.h"
#include "tests/common/etcd_server.h"
#include "tests/common/loopback_port.h"
#include "tests/common/temp_dir.h"
#include "introspect/node_board.h"
#include "rendezvous/record.h"

namespace {

using ddprun::testing::count_of;
using ddprun::testing::DdprunProcess;
using ddprun::testing::run_ddprun;
using ddprun::testing::TempDir;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr const char* kPython = "/usr/bin/python3";

int free_port() { return ddprun::testing::free_loopback_port(); }

struct TwoNodeJob {
  TempDir dir;
  std::string until = dir.file("until");
  std::string run_id = "nodes-" + std::to_string(::getpid());
  std::string registry[2] = {dir.file("registry_a"), dir.file("registry_b")};
  std::vector<std::string> args;
  std::optional<DdprunProcess> agent[2];
  bool etcd = false;
  // The rendezvous on ddprun's TCP store, or with `etcd_endpoint` on etcd.
  explicit TwoNodeJob(const std::string& etcd_endpoint = "") : etcd(!etcd_endpoint.empty()) {
    for (const auto& r : registry) ::mkdir(r.c_str(), 0700);
    args = {"--nnodes=2", "--nproc-per-node=2",
            etcd ? "--rdzv-backend=etcd" : "--rdzv-backend=c10d",
            "--rdzv-endpoint=" +
                (etcd ? etcd_endpoint : "127.0.0.1:" + std::to_string(free_port())),
            "--rdzv-id=" + run_id, "--heartbeat-timeout=60",
            std::string(INTROSPECT_SCRIPTS) + "/beating_worker.py", "--until", until};
  }
  std::vector<std::string> env(int node) const {
    std::vector<std::string> e = {"DDPRUN_REGISTRY_DIR=" + registry[node],
                                  std::string("DDPRUN_PYTHON=") + kPython};
    // etcd's token is its password, which this etcd has not.
    if (!etcd) e.push_back("DDPRUN_RDZV_TOKEN=nodes-secret");
    return e;
  }
  ddprun::testing::Finished status(int node, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {"status", run_id};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_ddprun(a, env(node), std::chrono::seconds(60));
  }
  // Starts both agents and waits until each node's two ranks are ready.
  void start() {
    for (int node = 0; node < 2; ++node) agent[node].emplace(args, env(node));
    auto two_ready = [](const std::string& o) { return count_of(o, "ready ") >= 2; };
    for (int node = 0; node < 2; ++node) {
      if (agent[node]->wait_for_stdout(two_ready, std::chrono::seconds(120))) continue;
      // What each agent said so far: which of them waits, and for what.
      FAIL("agent " << node << " has not two ready ranks after 120 s\nagent 0 stderr:\n"
                    << agent[0]->err() << "\nagent 1 stderr:\n" << agent[1]->err() << "\nagent "
                    << node << " stdout:\n" << agent[node]->out());
    }
  }
  // Lets the workers end; both agents must then exit 0.
  void finish() {
    std::ofstream(until).put('\n');
    const auto end_a = agent[0]->finish(std::chrono::seconds(120));
    const auto end_b = agent[1]->finish(std::chrono::seconds(120));
    INFO("agent a: " << end_a.err << "\nagent b: " << end_b.err);
    CHECK(end_a.status == 0);
    CHECK(end_b.status == 0);
  }
  json agents(int node) const {
    const auto r = status(node, {"--json"});
    INFO("status stderr: " << r.err);
    REQUIRE(r.status == 0);
    return json::parse(r.out)["agents"];
  }
};

// The step of global rank `rank` in `agents`, or -1.
int64_t step_of(const json& agents, int rank) {
  for (const auto& a : agents)
    for (const auto& w : a["workers"])
      if (w["rank"] == rank && w["step"].is_number()) return w["step"].get<int64_t>();
  return -1;
}

}  // namespace

TEST_CASE("status across nodes: asked on either agent, status shows every node's ranks, the "
          "other node's through the job's store, with advancing steps") {
  TwoNodeJob job;
  job.start();

  for (int node = 0; node < 2; ++node) {
    INFO("asked through agent " << node << "'s registry");
    // The other node publishes once a second: ask until its rows came and
    // its ranks' steps moved on between two answers.
    json first, later;
    bool whole = false, advanced = false;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!(whole && advanced) && Clock::now() < deadline) {
      later = job.agents(node);
      std::set<int> ranks;
      for (const auto& ag : later)
        for (const auto& w : ag["workers"]) ranks.insert(w["rank"].get<int>());
      whole = later.size() == 2 && ranks == std::set<int>{0, 1, 2, 3};
      if (!whole) continue;
      if (first.is_null()) {
        first = later;
        continue;
      }
      advanced = true;
      for (int rank = 0; rank < 4; ++rank)
        if (step_of(later, rank) <= step_of(first, rank)) advanced = false;
    }
    INFO("last answer: " << later.dump());
    REQUIRE(whole);
    CHECK(advanced);
    // One agent answered on its socket, the other came from the store, with
    // the node (group rank) it published as.
    std::multiset<std::string> via;
    std::set<int> nodes;
    for (const auto& ag : later) {
      via.insert(ag["via"].get<std::string>());
      nodes.insert(ag["node"].get<int>());
      CHECK(ag["run_id"] == job.run_id);
      CHECK(!ag["host"].get<std::string>().empty());
    }
    CHECK(via == std::multiset<std::string>{"socket", "store"});
    CHECK(nodes == std::set<int>{0, 1});
    CHECK(later[0]["agent_pid"] != later[1]["agent_pid"]);

    // The table: one line per rank, both agents' headers, the store's marked.
    const auto table = job.status(node);
    INFO("table: " << table.out << "\nstderr: " << table.err);
    CHECK(table.status == 0);
    CHECK(table.out.find("HOST") != std::string::npos);
    for (const char* row : {"\n0 ", "\n1 ", "\n2 ", "\n3 "}) CHECK(table.out.find(row) != std::string::npos);
    CHECK(count_of(table.out, "via the store") == 1);

    // --local: this agent's ranks only.
    const auto local = job.status(node, {"--local", "--json"});
    REQUIRE(local.status == 0);
    const json only = json::parse(local.out)["agents"];
    REQUIRE(only.size() == 1);
    CHECK(only[0]["workers"].size() == 2);
  }
  job.finish();
}

TEST_CASE("stacks across nodes: asked on one agent, stacks returns the Python tracebacks of "
          "every node's ranks, the other node's captured there and sent through the store") {
  TwoNodeJob job;
  job.start();
  // The ranks and host of the other agent, as status --local on each tells.
  std::set<int> remote_ranks;
  const auto local_b = job.status(1, {"--local", "--json"});
  REQUIRE(local_b.status == 0);
  const json b_only = json::parse(local_b.out);  // kept: the loop walks into it
  for (const auto& w : b_only["agents"].at(0)["workers"]) remote_ranks.insert(w["rank"].get<int>());
  REQUIRE(remote_ranks.size() == 2);

  const auto all = run_ddprun({"stacks", job.run_id, "--json"}, job.env(0), std::chrono::seconds(120));
  INFO("stacks stderr: " << all.err);
  REQUIRE(all.status == 0);
  const json stacks = json::parse(all.out)["agents"].at(0)["stacks"];
  std::set<int> ranks;
  for (const auto& s : stacks) {
    INFO("rank " << s["rank"] << " python: " << s["python"] << " note: " << s["python_note"]);
    ranks.insert(s["rank"].get<int>());
    CHECK(s["python"].get<std::string>().find("in wait_here") != std::string::npos);
    CHECK(!s["host"].get<std::string>().empty());
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});

  // One rank of the other node: only its stack, no error for the nodes without it.
  const int far = *remote_ranks.begin();
  const auto one = run_ddprun({"stacks", job.run_id, "--rank", std::to_string(far)}, job.env(0),
                              std::chrono::seconds(120));
  INFO("stacks --rank stderr: " << one.err);
  CHECK(one.status == 0);
  CHECK(count_of(one.out, "=== ") == 1);
  CHECK(one.out.find("rank " + std::to_string(far)) != std::string::npos);
  CHECK(one.out.find("in wait_here") != std::string::npos);
  CHECK(one.err.empty());

  job.finish();
}

TEST_CASE("etcd: status and stacks across nodes show both nodes when the rendezvous is on etcd "
          "(no ddprun store: the board goes through the agents' etcd store)") {
  if (!ddprun::testing::etcd_available()) {
    MESSAGE("SKIP: no /usr/bin/etcd (Debian's etcd-server, scripts/setup.sh)");
    std::exit(77);
  }
  ddprun::testing::EtcdServer etcd;
  TwoNodeJob job(etcd.endpoint());
  job.start();
  // The other node publishes once a second: ask until its rows came.
  json agents;
  std::set<int> ranks;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (ranks != std::set<int>{0, 1, 2, 3} && Clock::now() < deadline) {
    agents = job.agents(0);
    ranks.clear();
    for (const auto& ag : agents)
      for (const auto& w : ag["workers"]) ranks.insert(w["rank"].get<int>());
  }
  INFO("last answer: " << agents.dump());
  REQUIRE(ranks == std::set<int>{0, 1, 2, 3});
  std::multiset<std::string> via;
  for (const auto& ag : agents) via.insert(ag["via"].get<std::string>());
  CHECK(via == std::multiset<std::string>{"socket", "store"});

  const auto all = run_ddprun({"stacks", job.run_id, "--json"}, job.env(1), std::chrono::seconds(120));
  INFO("stacks stderr: " << all.err);
  REQUIRE(all.status == 0);
  const json parsed = json::parse(all.out);  // kept: the loop walks into it
  std::set<int> stacked;
  for (const auto& s : parsed["agents"].at(0)["stacks"]) {
    INFO("rank " << s["rank"] << " python: " << s["python"] << " note: " << s["python_note"]);
    stacked.insert(s["rank"].get<int>());
    CHECK(s["python"].get<std::string>().find("in wait_here") != std::string::npos);
  }
  CHECK(stacked == std::set<int>{0, 1, 2, 3});
  job.finish();
  // etcd outlives the job: the board's keys were inside the run's, which
  // the agents deleted at the end; nothing of the job is left in it.
  ddprun::rendezvous::EtcdStore left(etcd.options());
  CHECK(left.num_keys() == 0);
}

TEST_CASE("a stacks request record reads back, and anything else is refused") {
  namespace in = ddprun::introspect;
  using ddprun::rendezvous::RecordError;
  for (const in::StacksRequest& r : {in::StacksRequest{"4242-0-1", -1}, in::StacksRequest{"x", 7}}) {
    const in::StacksRequest back = in::decode_stacks_request(in::encode_stacks_request(r));
    CHECK(back.id == r.id);
    CHECK(back.rank == r.rank);
  }
  // The JSON this request was before: a node running an older ddprun.
  const std::string old = R"({"id":"1-0-1","rank":-1})";
  CHECK_THROWS_WITH_AS(in::decode_stacks_request({old.begin(), old.end()}),
                       doctest::Contains("no DSR magic"), RecordError);
  auto below = in::encode_stacks_request({"x", -1});
  below[11] = 0xfe;  // rank -2
  CHECK_THROWS_WITH_AS(in::decode_stacks_request(below), doctest::Contains("rank -2"), RecordError);
}
