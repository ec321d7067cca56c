// ddprun across three network stacks: one agent per namespace, 2 workers
// each, meeting at the store hosted by node 1's agent (10.77.0.1:29400).
// Every wait is on files (inotify) or a process exit, with a deadline.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "tests/common/run_folder.h"
#include "tests/common/skip.h"
#include "tests/multinode/mn_job.h"
#include "tests/multinode/netns.h"
#include "tests/common/test_python.h"

namespace ddprun::testing {

TEST_CASE("multinode.form") {
  Job job("form");
  for (int n = 1; n <= 3; ++n) job.start(n);
  const int round = wait_round(job, 6);
  check_round(in_round(read_records(job.dir.path()), round), 6);
  job.stop_workers();
  // Every agent sees the same outcome and exits with the same status.
  for (int n = 1; n <= 3; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(kDeadline) == 0);
    CHECK(job.log(n).find(kToken) == std::string::npos);  // never logged
  }
  CHECK(job.log(1).find("hosting the rendezvous store at " + kEndpoint) != std::string::npos);
}

namespace {

// Keep-alive and last call far beyond the test's deadline: the survivors
// can only re-form in time because the store saw node 3's connection
// close (its death ends the round at once) and the new round closes as
// soon as both live members are back, whatever MIN is (`nnodes`).
void kill_node3(const std::string& test, const std::string& nnodes) {
  Job job(test);
  for (int n = 1; n <= 3; ++n)
    job.start(n, {}, agent_args(",keep_alive_interval=60,last_call_timeout=120,join_timeout=120", nnodes));
  const int first = wait_round(job, 6);
  job.agents[3]->kill_now();  // SIGKILL: no goodbye, its heartbeats stop
  const int next = wait_round(job, 4, first);
  auto round = in_round(read_records(job.dir.path()), next);
  check_round(round, 4);
  for (const auto& r : round) {
    CHECK(r.node != "n3");
    CHECK(r.num("TORCHELASTIC_RESTART_COUNT") == 1);  // one job-wide restart
  }
  job.stop_workers();
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(kDeadline) == 0);
    CHECK(job.log(n).find("closed its store connection") != std::string::npos);
    CHECK(job.log(n).find("missed heartbeats") == std::string::npos);
    CHECK(job.log(n).find("(last_call_timeout)") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("multinode.kill") { kill_node3("kill", "2:3"); }

// --nnodes=1:3: the two survivors are only MIN plus one, and still re-form
// at once (nobody they expect back is alive).
TEST_CASE("multinode.kill_min1") { kill_node3("kill_min1", "1:3"); }

TEST_CASE("multinode.scaleup") {
  Job job("scaleup");
  // Node 1 keeps logs: the scale-up round must get a folder of its own.
  auto logged = agent_args();
  logged.insert(logged.begin(), {"--log-dir", job.dir.path() + "/logs1"});
  job.start(1, {}, logged);
  job.start(2);
  const int small = wait_round(job, 4);
  auto before = group_ranks(in_round(read_records(job.dir.path()), small));
  job.start(3);
  const int big = wait_round(job, 6, small);
  auto round = in_round(read_records(job.dir.path()), big);
  check_round(round, 6);
  auto after = group_ranks(round);
  // The nodes that stayed keep their group ranks; the newcomer gets rank 2.
  CHECK(after.at("n1") == before.at("n1"));
  CHECK(after.at("n2") == before.at("n2"));
  CHECK(after.at("n3") == 2);
  // A scale-up spends no restart.
  for (const auto& r : round) CHECK(r.num("TORCHELASTIC_RESTART_COUNT") == 0);
  job.finish(1, 3);
  CHECK(job.log(1).find("scale-up") != std::string::npos);
  // Same restart count, two rounds: attempt_0 and attempt_1, both kept.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string out = run_folder(job.dir.path() + "/logs1", "mnjob") + "/attempt_" +
                      std::to_string(attempt) + "/0/stdout.log";
    CAPTURE(out);
    CHECK(std::ifstream(out).good());
  }
}

TEST_CASE("multinode.sharedlogs") {
  // Two nodes with one --log-dir (an NFS folder on a cluster): each node's
  // run gets a folder of its own, named after its host, and every file of
  // both nodes is kept.
  Job job("sharedlogs", 2);
  const std::string shared = job.dir.path() + "/shared";
  auto args = agent_args("", "2:2");
  args.insert(args.begin(), {"--log-dir", shared});
  job.start(1, {}, args);
  job.start(2, {}, args);
  wait_round(job, 4);
  job.finish(1, 2);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  auto runs = run_folders(shared, "mnjob");
  REQUIRE(runs.size() == 2);
  for (const auto& run : runs) {
    CAPTURE(run);
    CHECK(run.find("/mnjob_" + std::string(host) + "_") != std::string::npos);
    CHECK(std::ifstream(run + "/events.jsonl").good());
    for (int lr = 0; lr < 2; ++lr) {
      CHECK(std::ifstream(run + "/attempt_0/" + std::to_string(lr) + "/stdout.log").good());
      CHECK(std::ifstream(run + "/attempt_0/" + std::to_string(lr) + "/stderr.log").good());
    }
  }
  // Each node names the folder it wrote.
  for (int n = 1; n <= 2; ++n)
    CHECK(job.log(n).find("logs go to " + shared + "/mnjob_") != std::string::npos);
}

TEST_CASE("multinode.linkcut") {
  Job job("linkcut");
  for (int n = 1; n <= 2; ++n) job.start(n);
  // Node 3 waits join_timeout for the store to answer again before it
  // gives up (a partition may heal: multinode.partition): a short one here.
  job.start(3, {}, agent_args(",join_timeout=6"));
  const int first = wait_round(job, 6);
  job.net.cut(3);  // ip link set eth0 down inside node 3's namespace
  const int next = wait_round(job, 4, first);
  check_round(in_round(read_records(job.dir.path()), next), 4);
  // Node 3 cannot reach the store: it fails on its own, naming the store,
  // once join_timeout has passed without an answer.
  {
    INFO("node 3:\n" << job.log(3));
    int status = job.agents[3]->wait(kDeadline);
    CHECK(status != 0);
    CHECK(status != -1);
    CHECK(job.log(3).find(kEndpoint) != std::string::npos);
  }
  job.stop_workers();
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(kDeadline) == 0);
    CHECK(job.log(n).find("missed heartbeats") != std::string::npos);
  }
}

TEST_CASE("multinode.token") {
  Job job("token", 2);
  job.start(1);
  job.start(2, {"DDPRUN_RDZV_TOKEN=wrong-token"});
  INFO("node 2:\n" << job.log(2));
  CHECK(job.agents[2]->wait(kDeadline) == 1);
  std::string log = job.log(2);
  CHECK(log.find("refused the token") != std::string::npos);
  CHECK(log.find(kEndpoint) != std::string::npos);
  CHECK(log.find("wrong-token") == std::string::npos);
  CHECK(read_records(job.dir.path()).empty());  // no worker ever started
}

TEST_CASE("multinode.failure") {
  // Rank 3's worker fails every time: every node restarts together on one
  // job-wide budget, then all three exit with the worker's status.
  Job job("failure");
  std::vector<std::string> args = agent_args();
  args[6] = "--max-restarts=1";
  for (int n = 1; n <= 3; ++n) job.start(n, {"MN_FAIL_RANK=3"}, args);
  for (int n = 1; n <= 3; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(kDeadline) == 7);  // the failing node's record's status
    CHECK(job.log(n).find("rank 3") != std::string::npos);  // the root cause names it
  }
  auto recs = read_records(job.dir.path());
  std::set<int> counts;
  for (const auto& r : recs) counts.insert(r.num("TORCHELASTIC_RESTART_COUNT"));
  CHECK(counts == std::set<int>{0, 1});
}

TEST_CASE("multinode.toofew") {
  // Fewer than MIN nodes: wait join_timeout, then say how many came and
  // from where.
  Job job("toofew", 2);
  auto args = agent_args(",join_timeout=2", "3:3");
  for (int n = 1; n <= 2; ++n) job.start(n, {}, args);
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(kDeadline) == 1);
    std::string log = job.log(n);
    CHECK(log.find("2 of 3 required nodes joined") != std::string::npos);
    CHECK(log.find("at " + Netns::addr(1)) != std::string::npos);
    CHECK(log.find("at " + Netns::addr(2)) != std::string::npos);
  }
  CHECK(read_records(job.dir.path()).empty());
}

TEST_CASE("multinode.interrupt") {
  // SIGINT while waiting for the other nodes: ddprun exits 128+2 at once
  // instead of waiting out join_timeout.
  Job job("interrupt", 1);
  job.start(1, {}, agent_args(",join_timeout=60"));
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    return job.log(1).find("joining rendezvous 'mnjob'") != std::string::npos;
  }, kDeadline));
  job.agents[1]->signal(SIGINT);
  INFO("node 1:\n" << job.log(1));
  CHECK(job.agents[1]->wait(kDeadline) == 130);
  CHECK(job.log(1).find("got SIGINT while waiting for the other nodes") != std::string::npos);
}

TEST_CASE("multinode.pytorch") {
  // An unmodified PyTorch script (init_process_group("gloo"), env://) across
  // two network stacks: MASTER_ADDR must be group rank 0's reachable address.
  const std::string python = test_python();
  if (run_command({python, "-c", "import torch.distributed"}) != 0) {
    SKIP_TEST(python + " has no torch");
  }
  Job job("pytorch", 2);
  for (int n = 1; n <= 2; ++n)
    job.start(n, {"DDPRUN_PYTHON=" + python, "GLOO_SOCKET_IFNAME=eth0"},
              {"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
               "--rdzv-endpoint=" + kEndpoint, "--rdzv-id=py", std::string(EXAMPLES_DIR) + "/hello_ddp.py"});
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(Seconds(60)) == 0);
  }
  std::string all = job.log(1) + job.log(2);
  for (int rank = 0; rank < 4; ++rank)
    CHECK(all.find("rank " + std::to_string(rank) + "/4 ") != std::string::npos);
  CHECK(count_of(all, "sum of 1..4 = 10") == 4);
}

TEST_CASE("multinode.external") {
  // The store on a machine of its own (ddprun-store in node 1's namespace):
  // no agent hosts it, nodes 2 and 3 meet there; MASTER_ADDR is node 2 or 3.
  Job job("external");
  NodeAgent store(job.net.ns(1), {"--host", "0.0.0.0", "--port", "29400"},
                  {"DDPRUN_RDZV_TOKEN=" + kToken}, job.dir.path() + "/store.log", STORE_BIN);
  for (int n = 2; n <= 3; ++n) job.start(n, {}, agent_args("", "2"));
  const int round = wait_round(job, 4);
  check_round(in_round(read_records(job.dir.path()), round), 4);
  job.finish(2, 3, "hosting");
}

TEST_CASE("multinode.barrier") {
  // Node 1's workers succeed; while it waits for node 2 to finish, node 2's
  // agent is SIGKILLed: node 1 fails as soon as the store sees node 2's
  // connection close, not at the exit barrier's 300 s deadline.
  Job job("barrier", 2);
  park_node1_in_exit_barrier(job);
  job.agents[2]->kill_now();
  INFO("node 1:\n" << job.log(1));
  CHECK(job.agents[1]->wait(kDeadline) == 1);
  CHECK(job.log(1).find("while waiting for the other nodes to finish: node ") != std::string::npos);
  CHECK(job.log(1).find("closed its store connection") != std::string::npos);
}

TEST_CASE("multinode.barrierint") {
  // Node 1's workers succeed; while it waits in the exit barrier for node 2,
  // whose workers still run, node 1's agent gets SIGINT: it exits 130 at
  // once (the barrier runs off the agent's loop and is abandoned), and tells
  // node 2 before its store goes: node 2 reads node 1's record (signalled,
  // exit status 130, the store closes with it), stops its workers and exits
  // with that status, instead of finding the store gone (the wrong root
  // cause, exit 1) or waiting join_timeout to rejoin a store that is gone.
  Job job("barrierint", 2);
  park_node1_in_exit_barrier(job);
  const auto sent = std::chrono::steady_clock::now();
  job.agents[1]->signal(SIGINT);
  const int status = job.agents[1]->wait(kDeadline);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  MESSAGE("node 1 exited " << status << " " << took << " s after SIGINT");
  INFO("node 1:\n" << job.log(1));
  CHECK(status == 130);
  CHECK(job.log(1).find("got SIGINT while waiting for the other nodes to finish") !=
        std::string::npos);
  INFO("node 2:\n" << job.log(2));
  const int peer = job.agents[2]->wait(kDeadline);
  MESSAGE("node 2 exited " << peer << " "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count()
          << " s after node 1's SIGINT");
  CHECK(peer == 130);
  CHECK(job.log(2).find("lost the rendezvous store") == std::string::npos);
}

TEST_CASE("multinode.handshakeint") {
  // Both nodes' workers succeed, node 2's first; node 2's agent is then
  // SIGSTOPped in the exit barrier, so the host (node 1), past the barrier,
  // waits in the exit hand-shake (up to close_timeout, 10 s here) for node 2
  // to read the outcome. SIGINT to the host cancels that wait: it exits 130
  // well within the hand-shake's bound (half of it is the deadline here).
  Job job("handshakeint", 2);
  job.start(1, {"MN_STOP_NAME=stop-n1"}, agent_args("", "2"));
  job.start(2, {"MN_STOP_NAME=stop-n2"}, agent_args("", "2"));
  int round = -1;
  REQUIRE(wait_records(job.dir.path(), [&](const auto& recs) {
    return (round = round_with(recs, 4)) >= 0;
  }, kDeadline));
  std::ofstream(job.dir.path() + "/stop-n2") << "stop\n";
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    return job.log(2).find("waiting for the other nodes to finish") != std::string::npos;
  }, kDeadline));
  job.agents[2]->signal(SIGSTOP);
  std::ofstream(job.dir.path() + "/stop-n1") << "stop\n";
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    return job.log(1).find("for the other nodes to read the job's outcome") != std::string::npos;
  }, kDeadline));
  const auto sent = std::chrono::steady_clock::now();
  job.agents[1]->signal(SIGINT);
  const int status = job.agents[1]->wait(Seconds(5));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  MESSAGE("node 1 exited " << status << " " << took << " s after SIGINT");
  INFO("node 1:\n" << job.log(1));
  CHECK(status == 130);
  CHECK(job.log(1).find("got SIGINT while the other nodes were reading the job's outcome") !=
        std::string::npos);
  const auto resumed = std::chrono::steady_clock::now();
  job.agents[2]->signal(SIGCONT);
  const int status2 = job.agents[2]->wait(kDeadline);
  MESSAGE("node 2 exited " << status2 << " "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - resumed).count()
          << " s after SIGCONT");
  INFO("node 2:\n" << job.log(2));
  CHECK(status2 >= 0);
}

TEST_CASE("multinode.pause") {
  // Node 2's agent (not the host) is SIGSTOPped for 4 s, longer than its
  // store calls' own deadlines but within the keep-alive window (2 s x 5):
  // its store connection still works, so on resume it carries on, with no
  // restart, and the job ends 0.
  Job job("pause", 2);
  const auto args = agent_args(",keep_alive_interval=2,keep_alive_max_attempt=5", "2");
  job.start(1, {}, args);
  job.start(2, {}, args);
  wait_round(job, 4);
  job.agents[2]->signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // the pause is the scenario
  job.agents[2]->signal(SIGCONT);
  job.stop_workers();
  for (int n = 1; n <= 2; ++n) {
    INFO("node " << n << ":\n" << job.log(n));
    CHECK(job.agents[n]->wait(kDeadline) == 0);
    CHECK(job.log(n).find("restarting") == std::string::npos);
    CHECK(job.log(n).find("lost the rendezvous store") == std::string::npos);
  }
}

TEST_CASE("multinode.pauselong") {
  // Node 2's agent is SIGSTOPped for longer than the keep-alive window: node
  // 1 finds it silent, ends the round and goes on alone (--nnodes=1:2). On
  // resume node 2's round has moved on: it rejoins as a late node (scale-up)
  // instead of failing, and the job ends 0 with both nodes.
  Job job("pauselong", 2);
  const auto args = agent_args("", "1:2");
  job.start(1, {}, args);
  job.start(2, {}, args);
  const int round = wait_round(job, 4);
  job.agents[2]->signal(SIGSTOP);
  // Node 1 goes on alone: a round of 2 workers after the first.
  int alone = -1;
  CHECK(wait_records(job.dir.path(), [&](const auto& recs) {
    return (alone = round_with(recs, 2, round)) >= 0;
  }, kDeadline));
  job.agents[2]->signal(SIGCONT);
  int both = -1;
  CHECK(wait_records(job.dir.path(), [&](const auto& recs) {
    return (both = round_with(recs, 4, alone)) >= 0;
  }, kDeadline));
  job.finish(1, 2);
}

TEST_CASE("multinode.partition") {
  // Node 3 (group rank 2) is cut off without a local error (its switch
  // port drops everything) for longer than the keep-alive window (0.5 s x
  // 3): nodes 1 and 2 find it silent and re-form without it, keeping their
  // group ranks; node 3 loses the store. After the heal it reaches the store
  // again and rejoins as a late node, within join_timeout, instead of
  // exiting 1; the re-formation its return causes keeps every survivor's
  // group rank, and the job ends 0 on all three.
  Job job("partition");
  // Started one after another so that first-join order (group ranks)
  // is node 1, 2, 3: node 3, rank 2, is not the store's host.
  for (int n = 1; n <= 3; ++n) {
    job.start(n);
    REQUIRE(wait_in_dir(job.dir.path(), [&] {
      return job.log(n).find("joining rendezvous 'mnjob'") != std::string::npos;
    }, kDeadline));
  }
  const int first = wait_round(job, 6);
  auto ranks = group_ranks(in_round(read_records(job.dir.path()), first));
  REQUIRE(ranks == std::map<std::string, int>{{"n1", 0}, {"n2", 1}, {"n3", 2}});
  job.net.partition(3);
  const int survivors = wait_round(job, 4, first);
  auto kept = group_ranks(in_round(read_records(job.dir.path()), survivors));
  CHECK(kept == std::map<std::string, int>{{"n1", 0}, {"n2", 1}});
  // Node 3 has found the store gone before the heal: the eviction, not a pause.
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    return job.log(3).find("lost the rendezvous store") != std::string::npos;
  }, kDeadline));
  job.net.heal(3);
  const int back = wait_round(job, 6, survivors);
  auto records = in_round(read_records(job.dir.path()), back);
  check_round(records, 6);
  CHECK(group_ranks(records) == std::map<std::string, int>{{"n1", 0}, {"n2", 1}, {"n3", 2}});
  job.finish(1, 3);
  CHECK(job.log(3).find("rejoining as a late node") != std::string::npos);
}

TEST_CASE("multinode.preauth_flood") {
  // Without the token, 16 addresses of one attacker namespace, in the
  // agents' own /24, take every unauthenticated slot that subnet gets
  // (256; they try 16 x 17) and reconnect within 10 ms whenever the store
  // closes one. Agents with the right token still join: a newcomer evicts the
  // oldest unauthenticated connection of the subnet's biggest holder, and
  // an agent (a few connections at a time) is never the biggest.
  Job job("preauth", 3);
  std::vector<std::string> hog = {Netns::addr(1), "29400", "17"};
  for (int i = 101; i <= 116; ++i) {
    job.net.add_address(3, "10.77.0." + std::to_string(i));
    hog.push_back("10.77.0." + std::to_string(i));
  }
  job.start(1, {}, agent_args("", "2"));
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    return job.log(1).find("joining rendezvous 'mnjob'") != std::string::npos;
  }, kDeadline));
  NodeAgent attacker(job.net.ns(3), hog, {}, job.dir.path() + "/hog.log", SLOT_HOG);
  // The subnet's share is taken: the attacker's surplus is refused, or
  // evicts the attacker's own oldest, in a steady flood (the store logs
  // its first lines, then a count a second).
  REQUIRE(wait_in_dir(job.dir.path(), [&] {
    const std::string log = job.log(1);
    return attacker.log().find("slot_hog: holding") != std::string::npos &&
           (log.find("from one subnet is the limit") != std::string::npos ||
            log.find("slots of subnet 10.77.0 are taken") != std::string::npos) &&
           log.find("more warnings like the above in the last second") != std::string::npos;
  }, kDeadline));
  job.start(2, {}, agent_args("", "2"));
  const int round = wait_round(job, 4);
  check_round(in_round(read_records(job.dir.path()), round), 4);
  job.finish(1, 2);
}


}  // namespace ddprun::testing
