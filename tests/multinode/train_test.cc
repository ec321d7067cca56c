// The LibTorch trainer across two network stacks, one rank each, meeting
// through the store hosted by node 1's agent (10.77.0.1:29400): a group
// restart from a checkpoint, and --restart-scope=rank, where only the
// failed rank's node replaces it and the other node's rank re-forms with
// the replacement. Both end bit-identical to a failure-free run on one node.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/time_scale.h"
#include "tests/multinode/netns.h"

namespace ddprun::testing {
namespace {

const std::string kEndpoint = "10.77.0.1:29400";

std::vector<std::string> train_args(int steps) {
  return {TRAIN_BIN, "--backend", "gloo", "--data", DIGITS_DIR, "--steps", std::to_string(steps), "--log-every", "0"};
}

std::string params_sha(const std::string& log) {
  const auto at = log.find("final parameters sha256 ");
  return at == std::string::npos ? std::string("none") : log.substr(at + 24, 64);
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The same training on 2 ranks on this node, without a failure.
std::string reference_sha(int steps = 60) {
  TempDir ref;
  std::vector<std::string> args = {"--nproc-per-node=2"};
  for (const auto& a : train_args(steps)) args.push_back(a);
  for (const std::string& a : {std::string("--checkpoint-dir"), ref.path() + "/ck", std::string("--no-resume")})
    args.push_back(a);
  NodeAgent one("", args, {}, ref.path() + "/single.log");  // "": this namespace
  REQUIRE(one.wait(Seconds(60)) == 0);
  const std::string sha = params_sha(one.log());
  REQUIRE(sha != "none");
  return sha;
}

// Two agents, one rank each, with `flags` (ddprun's, then train's).
struct TrainJob {
  // `node_flags[n]`: ddprun flags of node n (1 or 2) alone.
  TrainJob(const std::string& test, const std::vector<std::string>& ddprun_flags,
           const std::vector<std::string>& train_flags,
           std::map<int, std::vector<std::string>> node_flags = {}, int steps = 60)
      : net(test, 2) {
    for (int n = 1; n <= 2; ++n) {
      std::vector<std::string> args = {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=1",
                                        "--rdzv-backend=c10d", "--rdzv-endpoint=" + kEndpoint,
                                        "--rdzv-id=train"};
      args.insert(args.end(), ddprun_flags.begin(), ddprun_flags.end());
      args.insert(args.end(), node_flags[n].begin(), node_flags[n].end());
      for (const auto& a : train_args(steps)) args.push_back(a);
      args.insert(args.end(), train_flags.begin(), train_flags.end());
      args.push_back("--checkpoint-dir");
      args.push_back(dir.path() + "/ck" + std::to_string(n));
      // No GLOO_SOCKET_IFNAME: train binds gloo to the address that routes
      // to MASTER_ADDR (the host name resolves to loopback in a namespace).
      agents[n] = std::make_unique<NodeAgent>(
          net.ns(n), args, std::vector<std::string>{"DDPRUN_RDZV_TOKEN=train-" + std::to_string(getpid())},
          dir.path() + "/n" + std::to_string(n) + ".log");
      // Node 2 starts once node 1 joins its own store, so node 1 is
      // nearly always group rank 0 (first-join order; the tests that care
      // read the assignment from the logs all the same).
      if (n == 1 && !node_flags.empty())
        wait_in_dir(dir.path(), [&] { return agents[1]->log().find("joining rendezvous") != std::string::npos; },
                    Seconds(30));
    }
  }
  // Both agents' exit statuses are 0; both logs, node 1's first.
  std::string finish() {
    for (int n = 1; n <= 2; ++n) {
      INFO("node " << n << ":\n" << agents[n]->log());
      // 120 s: a hang job may wait out a node's 60 s timeout first.
      CHECK(agents[n]->wait(Seconds(120)) == 0);
    }
    return agents[1]->log() + agents[2]->log();
  }
  Netns net;
  TempDir dir;
  std::unique_ptr<NodeAgent> agents[3];
};

// Rank scope: rank 1's node replaced it (one generation, no restart), the
// other node's rank re-formed with the replacement, each from the state of a
// peer, ending bit-identical to `single`.
void check_one_node_replaced(const std::string& logs, const std::string& single) {
  CHECK(count_of(logs, "replacing only that rank, generation 1 ") == 1);
  CHECK(count_of(logs, "the ranks here re-form with its replacement, generation 1 ") == 1);
  // Each agent's line, once every node's ranks joined.
  CHECK(count_of(logs, "generation 1 formed: every rank joined ") == 2);
  CHECK(count_of(logs, ": generation 1 formed; state from rank ") == 2);
  CHECK(count_of(logs, "no checkpoint read") == 2);
  CHECK(count_of(logs, "restart count 1") == 0);
  CHECK(count_of(logs, "resuming from") == 0);
  CHECK(params_sha(logs) == single);
}

}  // namespace

TEST_CASE("multinode.train") {
  // A failure at step 30 restarts both nodes (one job-wide restart); they
  // resume from the step-20 checkpoint.
  const std::string single = reference_sha();
  TrainJob job("train", {}, {"--checkpoint-every", "20", "--fail-at-step", "30"});
  const std::string logs = job.finish();
  INFO(logs);
  CHECK(count_of(logs, "restart count 1") == 2);
  CHECK(logs.find("resuming from") != std::string::npos);
  CHECK(params_sha(logs) == single);
}

TEST_CASE("multinode.train_rank") {
  // --restart-scope=rank: rank 1 is SIGKILLed in the middle of step 30.
  // Its node's agent replaces it (a process started then, or a standby
  // started with the group) and opens generation 1 in the store; the other
  // node's agent tells rank 0, which re-forms with the replacement and
  // hands it the state: no restart, no checkpoint read.
  // Third, with a fixed --heartbeat-timeout that may be shorter than the
  // replacement's start-up: rank 0 waits for it without being blamed (the
  // watchdog's peer_replacing).
  const std::string single = reference_sha();
  const std::string beat_timeout = std::to_string(scaled(std::chrono::seconds(2)).count());
  for (const std::string& mode : {std::string("spawned"), std::string("standby"), std::string("fixed-timeout")}) {
    CAPTURE(mode);
    const bool standby = mode == "standby";
    std::vector<std::string> flags = {"--restart-scope=rank"};
    if (mode == "fixed-timeout") {
      for (const std::string& f : {"--heartbeat-timeout=" + beat_timeout, std::string("--heartbeat-grace=60"),
                                  std::string("--stack-capture=none")})
        flags.push_back(f);
    } else {
      flags.push_back("--hang-timeout=0");
    }
    if (standby) flags.push_back("--standby-workers=1");
    TrainJob job("tr" + mode.substr(0, 4), flags,
                 {"--checkpoint-every", "20", "--kill-at-step", "30", "--kill-rank", "1"});
    const std::string logs = job.finish();
    INFO(logs);
    CHECK(count_of(logs, "is rank 1 (local rank 0), joining generation 1") == (standby ? 1 : 0));
    check_one_node_replaced(logs, single);
  }
}

TEST_CASE("multinode.train_rank_hang") {
  // --restart-scope=rank with a hang: rank 1 (node 2) stops in step 200
  // before its beat, and rank 0 (node 1) then waits in step 201's
  // collective. Node 1 has the shorter timeout, so its watchdog fires
  // first, on a rank that is only waiting: it holds that verdict and asks;
  // node 2 finds its rank behind node 1's stalled rank (step 199 < 200),
  // acts on it long before its own timeout and replaces it; node 1's rank
  // re-forms with the replacement. Without the question node 1 replaced
  // rank 0, and rank 1's hang ended that recovery: a group restart.
  // Both with fixed heartbeat timeouts and learned ones (floors).
  //
  // 240 steps, a checkpoint at 100, the hang at 200: a learned timeout is
  // only the floor once a node saw 10 step gaps with nothing protected, and
  // each node sees the other's setup and checkpoint only at its next poll of
  // the store (200 ms, PeerGuards), so the steps right after them count for
  // nothing. With 60 steps of ~5 ms, a checkpoint at 20 and 40 and the hang
  // at 45, neither node had learned by the hang in some runs, both waited
  // out the 600 s initial timeout, and the test timed out.
  constexpr int kSteps = 240, kHangStep = 200;
  const std::string single = reference_sha(kSteps);
  const auto secs = [](int s) { return std::to_string(scaled(std::chrono::seconds(s)).count()); };
  for (const std::string& mode : {std::string("fixed"), std::string("learned")}) {
    CAPTURE(mode);
    const std::string flag = mode == "fixed" ? "--heartbeat-timeout=" : "--hang-timeout-floor=";
    std::vector<std::string> flags = {"--restart-scope=rank", "--stack-capture=none"};
    if (mode == "fixed") flags.push_back("--heartbeat-grace=60");
    TrainJob job("th" + mode.substr(0, 4), flags,
                 {"--checkpoint-every", "100", "--hang-at-step", std::to_string(kHangStep)},
                 {{1, {flag + secs(3)}}, {2, {flag + secs(60)}}}, kSteps);
    const std::string logs = job.finish();
    INFO(logs);
    // Rank 1 is node 2's when node 1 joined first (TrainJob); otherwise the
    // culprit's node has the short timeout and acts first on its own. A
    // learned timeout is the floor only once 10 step gaps were seen, which
    // on a loaded machine may still not be the case by the hang on node 1
    // (gaps across the other node's setup and the checkpoints do not
    // count): then node 2 fires first there too.
    const bool rank1_on_node2 = job.agents[2]->log().find("group rank 1 of 2") != std::string::npos;
    const bool asked = job.agents[1]->log().find("asking the other nodes") != std::string::npos;
    MESSAGE("rank 1 on node 2: " << rank1_on_node2 << "; node 1 fired first and asked: " << asked);
    if (rank1_on_node2 && (mode == "fixed" || asked)) {
      CHECK(asked);
      CHECK(count_of(logs, "heartbeat_timeout: behind node 0's stalled ranks: last step " +
                               std::to_string(kHangStep - 1)) >= 1);
    }
    CHECK(count_of(logs, "freeze: rank 1 is the culprit") == 1);
    CHECK(count_of(logs, "freeze: rank 0 is the culprit") == 0);
    check_one_node_replaced(logs, single);
  }
}

TEST_CASE("multinode.train_hostdies") {
  // Three nodes, one rank each, one checkpoint folder. Node 1's agent, the
  // store's host (group rank 0: it joins first), is SIGKILLed once the
  // step-200 checkpoint exists, and its rank dies with it. Its successor
  // serves the store, the two survivors re-form there (one restart), resume
  // from the newest checkpoint S and finish, bit-identical to 3 ranks
  // trained to S and 2 ranks from S's checkpoint on.
  constexpr int kSteps = 1000;
  const std::vector<std::string> ckpt = {"--checkpoint-every", "100", "--keep", "20"};
  Netns net("trhost", 3);
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  REQUIRE(mkdir(ck.c_str(), 0700) == 0);
  std::unique_ptr<NodeAgent> agents[4];
  for (int n = 1; n <= 3; ++n) {
    std::vector<std::string> args = {"--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=1",
                                     "--rdzv-backend=c10d", "--rdzv-endpoint=" + kEndpoint,
                                     "--rdzv-id=trhost",
                                     "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=3,"
                                     "last_call_timeout=1"};
    for (const auto& a : train_args(kSteps)) args.push_back(a);
    args.insert(args.end(), ckpt.begin(), ckpt.end());
    args.push_back("--checkpoint-dir");
    args.push_back(ck);
    agents[n] = std::make_unique<NodeAgent>(
        net.ns(n), args, std::vector<std::string>{"DDPRUN_RDZV_TOKEN=trhost-" + std::to_string(getpid())},
        dir.path() + "/n" + std::to_string(n) + ".log");
    if (n == 1)
      REQUIRE(wait_in_dir(dir.path(), [&] { return agents[1]->log().find("joining rendezvous") != std::string::npos; },
                          Seconds(30)));
  }
  REQUIRE(wait_in_dir(ck, [&] { return std::filesystem::exists(ck + "/step-0000000200.json"); },
                      Seconds(120)));
  agents[1]->kill_now();
  std::string logs;
  for (int n = 2; n <= 3; ++n) {
    INFO("node " << n << ":\n" << agents[n]->log());
    CHECK(agents[n]->wait(Seconds(120)) == 0);
    logs += agents[n]->log();
  }
  INFO(logs);
  CHECK(count_of(logs, "hosts the store now") == 2);
  CHECK(count_of(logs, "restart count 1") == 2);
  const auto at = logs.find("resuming from ");
  REQUIRE(at != std::string::npos);
  const auto step_at = logs.find("(step ", at);
  REQUIRE(step_at != std::string::npos);
  const int resumed = std::stoi(logs.substr(step_at + 6));
  CHECK(resumed >= 200);
  CHECK(resumed < kSteps);

  // The reference: 3 ranks on one node to the end (every checkpoint kept),
  // then 2 ranks from a folder holding its checkpoints up to S only.
  auto run_ref = [&](int ranks, const std::string& folder, bool resume) {
    std::vector<std::string> args = {"--nproc-per-node=" + std::to_string(ranks)};
    for (const auto& a : train_args(kSteps)) args.push_back(a);
    args.insert(args.end(), ckpt.begin(), ckpt.end());
    args.push_back("--checkpoint-dir");
    args.push_back(folder);
    if (!resume) args.push_back("--no-resume");
    NodeAgent one("", args, {}, folder + ".log");
    REQUIRE(one.wait(Seconds(120)) == 0);
    return one.log();
  };
  const std::string ref3 = dir.path() + "/ref3", ref2 = dir.path() + "/ref2";
  run_ref(3, ref3, false);
  REQUIRE(mkdir(ref2.c_str(), 0700) == 0);
  for (const auto& e : std::filesystem::directory_iterator(ref3)) {
    long long step = 0;
    const std::string name = e.path().filename().string();
    if (std::sscanf(name.c_str(), "step-%lld.", &step) == 1 && step <= resumed)
      std::filesystem::copy_file(e.path(), ref2 + "/" + name);
  }
  const std::string ref_logs = run_ref(2, ref2, true);
  CHECK(ref_logs.find("(step " + std::to_string(resumed)) != std::string::npos);
  CHECK(params_sha(logs) != "none");
  CHECK(params_sha(logs) == params_sha(ref_logs));
}

}  // namespace ddprun::testing
