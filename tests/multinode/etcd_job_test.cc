// ddprun agents meeting on a real etcd (Debian's etcd-server) that the test
// starts on loopback: no agent hosts the rendezvous store, so any of them
// may die, the first included. Agents and workers (mn_worker, which meets
// its round's ranks through the c10d TCPStore their node rank 0's agent
// hosts at MASTER_PORT, as torch's env:// does) run on this host. Every wait is on files (inotify) or a process
// exit, with a deadline. Exits 77 (skipped) without etcd.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <set>

#include "rendezvous/etcd_store.h"
#include "tests/common/etcd_server.h"
#include "tests/common/skip.h"
#include "tests/multinode/netns.h"

namespace ddprun::testing {
namespace {

const Seconds kDeadline(40);
// A short keep-alive window (1.5 s; etcd's lease TTL rounds it up to 2 s).
const std::string kConf =
    "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=30,close_timeout=10";

// The trainer's job tests no silent death: a 6 s window, so that a loaded
// machine (etcd fsyncing beside two trainers and other tests) cannot end a
// round by a late lease renewal (seen 2 in 10 runs with the 1.5 s window).
const std::string kTrainConf =
    "keep_alive_interval=1,keep_alive_max_attempt=6,last_call_timeout=1,join_timeout=30,close_timeout=10";

struct EtcdJob {
  explicit EtcdJob(EtcdServer& etcd, std::string id) : etcd(etcd), run_id(std::move(id)) {}
  EtcdServer& etcd;
  std::string run_id;
  TempDir dir;
  std::vector<std::unique_ptr<NodeAgent>> agents{4};

  std::vector<std::string> args(const std::string& nnodes, const std::string& conf = kConf) const {
    return {"--nnodes=" + nnodes, "--nproc-per-node=2", "--rdzv-backend=etcd",
            "--rdzv-endpoint=" + etcd.endpoint(), "--rdzv-id=" + run_id, "--rdzv-conf=" + conf,
            "--max-restarts=3", "--term-timeout=5", MN_WORKER};
  }
  void start(int node, const std::vector<std::string>& args, std::vector<std::string> env = {}) {
    env.push_back("MN_OUT=" + dir.path());
    env.push_back("MN_NODE=n" + std::to_string(node));
    agents[node] = std::make_unique<NodeAgent>("", args, env,
                                               dir.path() + "/n" + std::to_string(node) + ".log");
  }
  void stop_workers() { std::ofstream(dir.path() + "/stop") << "stop\n"; }
  std::string log(int node) { return agents[node] ? agents[node]->log() : ""; }
  // The records of the attempt with restart count `restarts` once it has
  // `world` of them.
  std::vector<Record> attempt(int restarts, int world) {
    std::vector<Record> out;
    bool ok = wait_records(dir.path(), [&](const std::vector<Record>& recs) {
      out.clear();
      for (const auto& r : recs)
        if (r.round == restarts && r.num("WORLD_SIZE") == world) out.push_back(r);
      return out.size() == static_cast<size_t>(world);
    }, kDeadline);
    if (!ok) {
      for (int n = 1; n <= 3; ++n) MESSAGE("node " << n << ":\n" << log(n));
    }
    REQUIRE(ok);
    return out;
  }
};

// Ranks 0..world-1 once each, consistent group ranks, one master, every
// rank met every other; returns node -> group rank.
std::map<std::string, int> check_round(const std::vector<Record>& round, int world,
                                       const std::string& run_id) {
  std::set<int> ranks;
  std::map<std::string, int> node_group;
  for (const auto& r : round) {
    INFO(r.node << " rank " << r.num("RANK"));
    ranks.insert(r.num("RANK"));
    CHECK(r.num("GROUP_WORLD_SIZE") == world / 2);
    CHECK(r.num("RANK") == r.num("GROUP_RANK") * 2 + r.num("LOCAL_RANK"));
    CHECK(r.env.at("MET") == "yes");
    CHECK(r.env.at("DDPRUN_STORE_ADDR").empty());  // no ddprun store with etcd
    CHECK(r.env.at("TORCHELASTIC_RUN_ID") == run_id);
    CHECK(r.env.at("MASTER_PORT") == round[0].env.at("MASTER_PORT"));
    auto [it, fresh] = node_group.emplace(r.node, r.num("GROUP_RANK"));
    CHECK(it->second == r.num("GROUP_RANK"));
  }
  CHECK(ranks.size() == static_cast<size_t>(world));
  CHECK(*ranks.rbegin() == world - 1);
  return node_group;
}

int node_with_group_rank(const std::map<std::string, int>& groups, int rank) {
  for (const auto& [node, g] : groups)
    if (g == rank) return std::stoi(node.substr(1));
  return -1;
}

}  // namespace

TEST_CASE("multinode.etcd_form") {
  EtcdServer etcd;
  for (int n : {2, 3}) {
    CAPTURE(n);
    EtcdJob job(etcd, "etcdform" + std::to_string(n) + "-" + std::to_string(getpid()));
    for (int i = 1; i <= n; ++i) job.start(i, job.args(std::to_string(n)));
    check_round(job.attempt(0, 2 * n), 2 * n, job.run_id);
    job.stop_workers();
    for (int i = 1; i <= n; ++i) {
      INFO("node " << i << ":\n" << job.log(i));
      CHECK(job.agents[i]->wait(kDeadline) == 0);
      CHECK(job.log(i).find("hosting") == std::string::npos);  // nobody hosts a store
    }
    // The last node out deleted the job's keys: the id can be used again.
    rendezvous::EtcdStore s(etcd.options());
    CHECK_FALSE(s.check({"rdzv/" + job.run_id + "/current"}));
  }
}

TEST_CASE("multinode.etcd_kill") {
  // A non-first node dies, then the first one (group rank 0, whose address
  // is MASTER_ADDR): each time the survivors re-form and go on, since no
  // node hosts the rendezvous.
  EtcdServer etcd;
  EtcdJob job(etcd, "etcdkill-" + std::to_string(getpid()));
  for (int i = 1; i <= 3; ++i) job.start(i, job.args("1:3"));
  auto groups = check_round(job.attempt(0, 6), 6, job.run_id);
  const int other = node_with_group_rank(groups, 2);
  REQUIRE(other > 0);
  job.agents[other]->kill_now();  // SIGKILL: its lease ends with its TTL
  auto second = check_round(job.attempt(1, 4), 4, job.run_id);
  CHECK(second.count("n" + std::to_string(other)) == 0);
  // Stable group ranks: the survivors keep theirs where they fit.
  for (const auto& [node, g] : second)
    if (groups.at(node) < 2) CHECK(g == groups.at(node));
  const int first = node_with_group_rank(second, 0);
  REQUIRE(first > 0);
  job.agents[first]->kill_now();
  auto third = check_round(job.attempt(2, 2), 2, job.run_id);
  REQUIRE(third.size() == 1);
  const int survivor = std::stoi(third.begin()->first.substr(1));
  job.stop_workers();
  INFO("survivor:\n" << job.log(survivor));
  CHECK(job.agents[survivor]->wait(kDeadline) == 0);
  CHECK(job.log(survivor).find("node") != std::string::npos);
}

TEST_CASE("multinode.etcd_restart") {
  // etcd stopped and started again (same data) within the keep-alive
  // window (1 s x 10): the agents ride it out, the job goes on unrestarted.
  EtcdServer etcd;
  EtcdJob job(etcd, "etcdrestart-" + std::to_string(getpid()));
  const std::string conf =
      "keep_alive_interval=1,keep_alive_max_attempt=10,last_call_timeout=1,join_timeout=30,close_timeout=10";
  for (int i = 1; i <= 2; ++i) job.start(i, job.args("2", conf));
  check_round(job.attempt(0, 4), 4, job.run_id);
  etcd.stop();
  etcd.start();
  job.stop_workers();
  for (int i = 1; i <= 2; ++i) {
    INFO("node " << i << ":\n" << job.log(i));
    CHECK(job.agents[i]->wait(kDeadline) == 0);
  }
  for (const auto& r : read_records(job.dir.path())) CHECK(r.round == 0);  // no restart
}

TEST_CASE("multinode.etcd_lost") {
  // etcd gone for good: every agent stops its workers and exits 1 naming
  // the store, once the keep-alive window has passed; none hangs.
  EtcdServer etcd;
  EtcdJob job(etcd, "etcdlost-" + std::to_string(getpid()));
  for (int i = 1; i <= 2; ++i) job.start(i, job.args("2"));
  check_round(job.attempt(0, 4), 4, job.run_id);
  etcd.stop();
  for (int i = 1; i <= 2; ++i) {
    INFO("node " << i << ":\n" << job.log(i));
    CHECK(job.agents[i]->wait(kDeadline) == 1);
    CHECK(job.log(i).find("lost the rendezvous store at etcd at " + etcd.endpoint()) != std::string::npos);
  }
}

TEST_CASE("multinode.etcd_auth") {
  // etcd with authentication: the agents log in as --rdzv-conf user= with
  // the password in DDPRUN_RDZV_TOKEN (never logged); a wrong one is a
  // clear error at once.
  if (::access("/usr/bin/etcdctl", X_OK) != 0) SKIP_TEST("etcdctl not found (scripts/setup.sh installs etcd-client)");
  EtcdServer etcd;
  etcd.enable_auth("etcd-pw-" + std::to_string(getpid()));
  EtcdJob job(etcd, "etcdauth-" + std::to_string(getpid()));
  const std::string conf = kConf + ",user=root";
  const std::string pw = "DDPRUN_RDZV_TOKEN=etcd-pw-" + std::to_string(getpid());
  job.start(3, job.args("2", conf), {"DDPRUN_RDZV_TOKEN=wrong"});
  for (int i = 1; i <= 2; ++i) job.start(i, job.args("2", conf), {pw});
  check_round(job.attempt(0, 4), 4, job.run_id);
  job.stop_workers();
  for (int i = 1; i <= 2; ++i) {
    INFO("node " << i << ":\n" << job.log(i));
    CHECK(job.agents[i]->wait(kDeadline) == 0);
    CHECK(job.log(i).find(pw.substr(18)) == std::string::npos);
  }
  INFO("wrong password:\n" << job.log(3));
  CHECK(job.agents[3]->wait(kDeadline) == 1);
  CHECK(job.log(3).find("authenticating as 'root'") != std::string::npos);
}

TEST_CASE("multinode.etcd_tls") {
  // etcd over TLS with client certificates (--client-cert-auth): the agents
  // check etcd's certificate against cacert= and show cert=/key=; one
  // without a client certificate is refused with a clear error at once.
  if (::access("/usr/bin/openssl", X_OK) != 0) SKIP_TEST("openssl not found (scripts/setup.sh installs it)");
  EtcdServer etcd(EtcdServer::Config{true, true});
  EtcdJob job(etcd, "etcdtls-" + std::to_string(getpid()));
  const std::string conf = kConf + ",cacert=" + etcd.file("ca.pem") + ",cert=" + etcd.file("client.pem") +
                           ",key=" + etcd.file("client.key");
  job.start(3, job.args("2", kConf + ",cacert=" + etcd.file("ca.pem")));
  for (int i = 1; i <= 2; ++i) job.start(i, job.args("2", conf));
  check_round(job.attempt(0, 4), 4, job.run_id);
  job.stop_workers();
  for (int i = 1; i <= 2; ++i) {
    INFO("node " << i << ":\n" << job.log(i));
    CHECK(job.agents[i]->wait(kDeadline) == 0);
  }
  INFO("no client certificate:\n" << job.log(3));
  CHECK(job.agents[3]->wait(kDeadline) == 1);
  CHECK(job.log(3).find("TLS") != std::string::npos);
}

TEST_CASE("multinode.etcd_interrupt") {
  // SIGINT while the join waits on etcd: the agent's etcd calls are
  // cancelled and it exits 128+2 at once, not after join_timeout.
  EtcdServer etcd;
  EtcdJob lone(etcd, "etcdint-" + std::to_string(getpid()));
  lone.start(1, lone.args("2", kConf + ",join_timeout=120"));
  REQUIRE(wait_in_dir(lone.dir.path(), [&] {
    return lone.log(1).find("joining rendezvous '" + lone.run_id + "'") != std::string::npos;
  }, kDeadline));
  lone.agents[1]->signal(SIGINT);
  {
    INFO("lone agent:\n" << lone.log(1));
    CHECK(lone.agents[1]->wait(kDeadline) == 130);
    CHECK(lone.log(1).find("got SIGINT while waiting for the other nodes") != std::string::npos);
  }
  // SIGTERM to one agent of a running job: it tells the other through etcd
  // why it left, and the other re-forms alone (1:2) with one restart spent.
  EtcdJob job(etcd, "etcdterm-" + std::to_string(getpid()));
  for (int i = 1; i <= 2; ++i) job.start(i, job.args("1:2", kConf + ",keep_alive_interval=60"));
  check_round(job.attempt(0, 4), 4, job.run_id);
  job.agents[2]->signal(SIGTERM);
  check_round(job.attempt(1, 2), 2, job.run_id);
  job.stop_workers();
  INFO("node 1:\n" << job.log(1) << "\nnode 2:\n" << job.log(2));
  CHECK(job.agents[2]->wait(kDeadline) == 143);
  CHECK(job.agents[1]->wait(kDeadline) == 0);
  CHECK(job.log(1).find("its agent got SIGTERM") != std::string::npos);
}

#ifdef TRAIN_BIN
TEST_CASE("multinode.etcd_train") {
  // The trainer on two agents meeting on etcd, one rank each: the ranks
  // meet at MASTER_ADDR:MASTER_PORT (torch's TCPStore hosted by rank 0), a
  // failure at step 30 restarts both (one job-wide restart), they resume
  // from the step-20 checkpoint and finish.
  EtcdServer etcd;
  EtcdJob job(etcd, "etcdtrain-" + std::to_string(getpid()));
  for (int n = 1; n <= 2; ++n) {
    std::vector<std::string> args = {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=1",
                                      "--rdzv-backend=etcd", "--rdzv-endpoint=" + etcd.endpoint(),
                                      "--rdzv-id=" + job.run_id, "--rdzv-conf=" + kTrainConf,
                                      TRAIN_BIN, "--backend", "gloo", "--data", DIGITS_DIR,
                                      "--steps", "60", "--log-every", "0", "--checkpoint-every", "20",
                                      "--fail-at-step", "30", "--checkpoint-dir",
                                      job.dir.path() + "/ck" + std::to_string(n)};
    job.start(n, args);
  }
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(Seconds(90)) == 0);
    CHECK(job.log(n).find("restart count 1") != std::string::npos);
  }
  const std::string logs = job.log(1) + job.log(2);
  CHECK(logs.find("resuming from") != std::string::npos);
  CHECK(logs.find("final parameters sha256 ") != std::string::npos);
}
#endif

}  // namespace ddprun::testing

int main(int argc, char** argv) {
  if (!ddprun::testing::etcd_available()) {
    std::puts("SKIP: etcd not found (scripts/setup.sh installs etcd-server)");
    return 77;
  }
  return ddprun::testing::main_with_skips(argc, argv);
}
