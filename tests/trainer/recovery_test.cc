// Rank-scoped recovery (docs/RECOVERY.md) with real `train` processes, the
// test playing the agent: it hosts the store (a ddprun store server on a
// thread, so any rank may die), starts N ranks with torchrun's environment
// and a socket pair end each as DDPRUN_RECOVERY_FD, lets one rank SIGKILL
// itself in the middle of a random step (--kill-at-step: its first
// gradient all-reduce launched, the step in flight), sends event=failed to
// the survivors as the agent would, starts the replacement with
// DDPRUN_GENERATION=1 and waits for every rank's event=joined. The final
// parameters (--save-params) must be bit-identical to an uninterrupted run
// of the same seed, and the replacement must read no checkpoint. The hang
// variant (--hang-at-step) leaves the hung rank alive until everyone joined.
//
// The kill steps and ranks come from a printed seed (DDPRUN_RECOVERY_SEED
// repeats a run); DDPRUN_RECOVERY_TRIALS sets the trials per case (5).
// Every wait has a deadline; process.h kills what the test started.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "base/recovery_wire.h"
#include "base/scoped_fd.h"
#include "tests/common/skip.h"
#include "tests/common/time_scale.h"
#include "tests/rendezvous/test_util.h"
#include "tests/trainer/process.h"
#include "tests/trainer/recovery_support.h"
#include "tests/trainer/temp_dir.h"
#include "trainer/checkpoint.h"

using namespace ddprun::trainer::testing;
using namespace std::chrono_literals;
namespace wire = ddprun::base::recovery_wire;
using ddprun::base::ScopedFd;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kTrain = TRAIN_BIN;
constexpr int kChildFd = 100;  // DDPRUN_RECOVERY_FD in every rank
constexpr int kSteps = 30;

struct Config {
  std::string backend;
  int world = 2;
  double bucket_mb = 25;  // 25: one bucket; 0.05: several (the first layer's alone)
};

std::vector<std::string> train_argv(const Config& c, const std::string& dir) {
  return {kTrain, "--backend", c.backend, "--steps", std::to_string(kSteps), "--hidden", "64",
          "--momentum", "0.9", "--seed", "11", "--bucket-mb", std::to_string(c.bucket_mb),
          "--log-every", "0", "--checkpoint-every", "10", "--checkpoint-dir", dir + "/ckpt",
          "--save-params", dir + "/params", "--recovery-timeout", "60"};
}

std::map<std::string, std::string> rank_env(const Config& c, int rank, uint16_t store_port,
                                            const std::string& prefix) {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(c.world)},
          {"LOCAL_WORLD_SIZE", std::to_string(c.world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "1"},  // unused: the store is ours
          {"DDPRUN_STORE_ADDR", "127.0.0.1:" + std::to_string(store_port)},
          {"DDPRUN_STORE_PREFIX", prefix},
          {"TORCHELASTIC_RESTART_COUNT", "0"},
          {"OMP_NUM_THREADS", "1"}};
}

// One recovery channel: the test's end, and the end the rank inherits.
struct Channel {
  ScopedFd mine, theirs;
  static Channel open() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    return Channel{ScopedFd(sv[0]), ScopedFd(sv[1])};
  }
  void send(const wire::Message& m) const {
    const std::string p = wire::format(m);
    REQUIRE(::send(mine.get(), p.data(), p.size(), MSG_NOSIGNAL) == ssize_t(p.size()));
  }
};

// The uninterrupted run's parameters, once per configuration.
std::string reference_sha(const Config& c) {
  static std::map<std::string, std::string> done;
  const std::string key = c.backend + "/" + std::to_string(c.world) + "/" +
                          std::to_string(c.bucket_mb);
  if (auto it = done.find(key); it != done.end()) return it->second;
  TempDir tmp;
  ddprun::rendezvous::testing::ServerThread store;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < c.world; ++r) {
    ranks.push_back(std::make_unique<Process>(train_argv(c, tmp.path()),
                                              rank_env(c, r, store.port(), "reference/"),
                                              tmp.file("rank" + std::to_string(r) + ".log")));
  }
  const auto deadline = Clock::now() + ddprun::testing::scaled(240s);
  for (int r = 0; r < c.world; ++r) {
    const int code = ranks[r]->wait_for(deadline);
    INFO("reference rank ", r, ":\n", ranks[r]->output());
    REQUIRE(code == 0);
  }
  return done[key] = sha_of(tmp.file("params"));
}

// Waits (inotify on `folder`, the log's, deadline) until p's log holds `text`.
bool wait_for_output(const Process& p, const std::string& folder, const std::string& text,
                     Clock::time_point deadline) {
  const ScopedFd watch(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!watch || ::inotify_add_watch(watch.get(), folder.c_str(), IN_MODIFY) < 0) return false;
  for (;;) {
    if (p.output().find(text) != std::string::npos) return true;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{watch.get(), POLLIN, 0};
    if (::poll(&pfd, 1, int(left.count())) > 0) {
      alignas(inotify_event) char buf[4096];
      while (::read(watch.get(), buf, sizeof buf) > 0) {
      }
    }
  }
}

// kKill: --kill-at-step (SIGKILL in the middle of the step, the agent sees
// the exit). kHang: --hang-at-step, the last rank stops after the step,
// alive, holding its sockets and shm pid: the survivors can leave their
// collective only through event=failed. The hung process stays alive until
// every rank of generation 1 joined (the agent would SIGKILL it; not
// killing it proves the channel alone frees the survivors).
enum class Fault { kKill, kHang };

struct TrialResult {
  double recovery_ms = 0;
  int source = -1;
  long long state_step = -1;
};

// One trial: rank `victim` dies in the middle of step `kill_step` (kKill),
// or hangs after it (kHang).
TrialResult run_trial(const Config& c, Fault fault, int kill_step, int victim,
                      const std::string& reference) {
  TempDir tmp;
  ddprun::rendezvous::testing::ServerThread store;
  std::vector<std::string> argv = train_argv(c, tmp.path());
  const std::vector<std::string> fault_flags =
      fault == Fault::kKill
          ? std::vector<std::string>{"--kill-at-step", std::to_string(kill_step), "--kill-rank",
                                     std::to_string(victim)}
          : std::vector<std::string>{"--hang-at-step", std::to_string(kill_step)};
  argv.insert(argv.end(), fault_flags.begin(), fault_flags.end());
  auto env_of = [&](int rank, int generation) {
    auto env = rank_env(c, rank, store.port(), "trial/");
    env["DDPRUN_RESTART_SCOPE"] = "rank";
    env["DDPRUN_RECOVERY_FD"] = std::to_string(kChildFd);
    env["DDPRUN_GENERATION"] = std::to_string(generation);
    return env;
  };
  std::vector<Channel> chans;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < c.world; ++r) {
    chans.push_back(Channel::open());
    ranks.push_back(std::make_unique<Process>(argv, env_of(r, 0),
                                              tmp.file("rank" + std::to_string(r) + ".log"),
                                              std::vector<std::pair<int, int>>{
                                                  {chans[r].theirs.get(), kChildFd}}));
    chans[r].theirs.reset();
  }
  const auto deadline = Clock::now() + ddprun::testing::scaled(240s);
  auto dump = [&] {
    std::string all;
    for (int r = 0; r < c.world; ++r) all += "--- rank " + std::to_string(r) + ":\n" + ranks[r]->output();
    return all;
  };
  // The agent's part: see the death, tell the survivors at once, then start
  // the replacement.
  std::unique_ptr<Process> hung;
  if (fault == Fault::kKill) {
    const int killed = ranks[victim]->wait_for(deadline);
    const std::string before = dump();  // INFO stringifies only on failure, later
    INFO("logs before the replacement:\n", before);
    REQUIRE(killed == 128 + SIGKILL);
  } else {
    const bool stopped = wait_for_output(*ranks[victim], tmp.path(),
                                         "hangs here (injected)", deadline);
    const std::string before = dump();
    INFO("logs before the replacement:\n", before);
    REQUIRE(stopped);
    hung = std::move(ranks[victim]);
  }
  const Clock::time_point failed_at = Clock::now();
  wire::Message failed;
  failed.event = wire::Event::kFailed;
  failed.generation = 1;
  failed.ranks = {victim};
  failed.cause = fault == Fault::kKill ? wire::Cause::kExit : wire::Cause::kHang;
  for (int r = 0; r < c.world; ++r) {
    if (r != victim) chans[r].send(failed);
  }
  const std::string first_log = (hung ? hung : ranks[victim])->output();
  chans[victim] = Channel::open();
  ranks[victim] = std::make_unique<Process>(
      argv, env_of(victim, 1), tmp.file("rank" + std::to_string(victim) + ".gen1.log"),
      std::vector<std::pair<int, int>>{{chans[victim].theirs.get(), kChildFd}});
  chans[victim].theirs.reset();
  wire::Message ready;
  ready.event = wire::Event::kReady;
  ready.generation = 1;
  ready.ranks = {victim};
  for (int r = 0; r < c.world; ++r) {
    if (r != victim) chans[r].send(ready);
  }
  // Every rank's event=joined generation=1.
  std::set<int> joined;
  while (int(joined.size()) < c.world) {
    std::vector<pollfd> fds;
    for (int r = 0; r < c.world; ++r) fds.push_back({chans[r].mine.get(), POLLIN, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    INFO("logs while waiting for joined:\n", dump());
    REQUIRE(left.count() > 0);
    REQUIRE(::poll(fds.data(), fds.size(), int(left.count())) >= 0);
    for (int r = 0; r < c.world; ++r) {
      if ((fds[r].revents & POLLIN) == 0) continue;
      char buf[wire::kMaxPacketBytes + 1];
      const ssize_t n = ::recv(chans[r].mine.get(), buf, sizeof buf, MSG_DONTWAIT);
      REQUIRE(n > 0);  // EOF: the rank died before it joined
      const std::optional<wire::Message> m = wire::parse(std::string_view(buf, size_t(n)));
      REQUIRE(m.has_value());
      CHECK(m->event == wire::Event::kJoined);
      CHECK(m->generation == 1);
      CHECK(m->rank == r);
      joined.insert(r);
    }
  }
  TrialResult result;
  result.recovery_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - failed_at).count();
  if (hung) {
    hung->signal(SIGKILL);  // the agent's part, once nobody waits on it
    CHECK(hung->wait_for(deadline) == 128 + SIGKILL);
  }
  for (int r = 0; r < c.world; ++r) {
    const int code = ranks[r]->wait_for(deadline);
    INFO("logs:\n", dump());
    REQUIRE(code == 0);
  }
  // Every rank names the same source and step; the replacement read nothing.
  static const std::regex formed(
      R"(rank (\d+): generation 1 formed; state from rank (\d+) at step (\d+); no checkpoint read)");
  for (int r = 0; r < c.world; ++r) {
    const std::string out = ranks[r]->output();
    std::smatch m;
    INFO("rank ", r, ":\n", out);
    REQUIRE(std::regex_search(out, m, formed));
    CHECK(std::stoi(m[1]) == r);
    const int source = std::stoi(m[2]);
    const long long step = std::stoll(m[3]);
    if (result.source < 0) {
      result.source = source;
      result.state_step = step;
    }
    CHECK(source == result.source);
    CHECK(step == result.state_step);
    CHECK(source != victim);
    CHECK(out.find("resuming from") == std::string::npos);
  }
  INFO("the failed rank's log:\n", first_log);
  if (fault == Fault::kKill) {
    // The in-flight step: committed by some survivors at most (kill_step),
    // never past it, and never lost (kill_step - 1 were done by everyone).
    CHECK(result.state_step >= kill_step - 1);
    CHECK(result.state_step <= kill_step);
    CHECK(first_log.find("--kill-at-step " + std::to_string(kill_step)) != std::string::npos);
  } else {
    // The hung rank finished the step's collectives; a survivor still
    // waiting in them when event=failed arrives (a busy machine) abandons
    // that step, so the source has it or the one before, never less.
    CHECK(result.state_step >= kill_step - 1);
    CHECK(result.state_step <= kill_step);
    CHECK(first_log.find("--hang-at-step " + std::to_string(kill_step)) != std::string::npos);
  }
  INFO("logs:\n", dump());
  CHECK(sha_of(tmp.file("params")) == reference);
  return result;
}

void run_case(const std::string& backend, int world, Fault fault = Fault::kKill) {
  const uint64_t seed = seed_from_env();
  const int trials = fault == Fault::kKill ? trials_from_env() : (trials_from_env() + 1) / 2;
  const char* what = fault == Fault::kKill ? "killed in" : "hung after";
  std::printf("recovery %s %d ranks, a rank %s a step: seed %llu (DDPRUN_RECOVERY_SEED=%llu "
              "repeats it), %d trials\n",
              backend.c_str(), world, what, (unsigned long long)seed, (unsigned long long)seed,
              trials);
  std::fflush(stdout);
  std::mt19937_64 gen(seed);
  std::vector<double> times;
  for (int t = 0; t < trials; ++t) {
    Config c{backend, world, t % 2 == 0 ? 25.0 : 0.05};
    // Up to kSteps - 1: a later collective must exist for the survivors to
    // notice (a death in the last step can leave them nothing to wait on).
    const int kill_step = 1 + int(gen() % (kSteps - 1));
    const int drawn = int(gen() % uint64_t(world));
    const int victim = fault == Fault::kKill ? drawn : world - 1;  // --hang-at-step's rank
    CAPTURE(t);
    CAPTURE(kill_step);
    CAPTURE(victim);
    CAPTURE(c.bucket_mb);
    const std::string reference = reference_sha(c);
    const TrialResult r = run_trial(c, fault, kill_step, victim, reference);
    std::printf("  trial %d: rank %d %s step %d (bucket %.2f MiB): state from rank %d at "
                "step %lld, all joined %.0f ms after event=failed, params bit-identical\n",
                t, victim, what, kill_step, c.bucket_mb, r.source, r.state_step, r.recovery_ms);
    std::fflush(stdout);
    times.push_back(r.recovery_ms);
  }
  std::sort(times.begin(), times.end());
  if (!times.empty()) {
    std::printf("recovery %s %d ranks: event=failed to all joined min %.0f median %.0f max %.0f "
                "ms\n",
                backend.c_str(), world, times.front(), times[times.size() / 2], times.back());
  }
}

}  // namespace

TEST_CASE("rank scope on gloo with 2 ranks: a rank killed mid-step is replaced, parameters bit-identical") {
  run_case("gloo", 2);
}
TEST_CASE("rank scope on gloo with 4 ranks: a rank killed mid-step is replaced, parameters bit-identical") {
  run_case("gloo", 4);
}
TEST_CASE("rank scope on shm with 2 ranks: a rank killed mid-step is replaced, parameters bit-identical") {
  run_case("shm", 2);
}
TEST_CASE("rank scope on shm with 4 ranks: a rank killed mid-step is replaced, parameters bit-identical") {
  run_case("shm", 4);
}

TEST_CASE("rank scope on gloo with 2 ranks and a hang: event=failed alone frees the survivors") {
  run_case("gloo", 2, Fault::kHang);
}
TEST_CASE("rank scope on gloo with 4 ranks and a hang: event=failed alone frees the survivors") {
  run_case("gloo", 4, Fault::kHang);
}
TEST_CASE("rank scope on shm with 2 ranks and a hang: event=failed alone frees the survivors") {
  run_case("shm", 2, Fault::kHang);
}
TEST_CASE("rank scope on shm with 4 ranks and a hang: event=failed alone frees the survivors") {
  run_case("shm", 4, Fault::kHang);
}

// A rank's own error (an OOM, a bug) is no peer failure: no event=failed
// will come for it, and waiting --recovery-timeout for one only delays the
// error. The rank must end with the error at once; the test's deadline is
// far below the recovery timeout, so a rank that waited would be seen.
TEST_CASE("rank scope: a rank's own error (not a collective's) ends it at once with the error") {
  TempDir tmp;
  ddprun::rendezvous::testing::ServerThread store;
  const Config c{"gloo", 2};
  std::vector<std::string> argv = train_argv(c, tmp.path());
  const auto timeout = std::find(argv.begin(), argv.end(), "--recovery-timeout");
  REQUIRE(timeout + 1 < argv.end());
  *(timeout + 1) = "3600";
  argv.insert(argv.end(), {"--throw-at-step", "4", "--kill-rank", "1"});
  std::vector<Channel> chans;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < c.world; ++r) {
    auto env = rank_env(c, r, store.port(), "local_error/");
    env["DDPRUN_RESTART_SCOPE"] = "rank";
    env["DDPRUN_RECOVERY_FD"] = std::to_string(kChildFd);
    env["DDPRUN_GENERATION"] = "0";
    chans.push_back(Channel::open());
    ranks.push_back(std::make_unique<Process>(argv, env, tmp.file("rank" + std::to_string(r) + ".log"),
                                              std::vector<std::pair<int, int>>{
                                                  {chans[r].theirs.get(), kChildFd}}));
    chans[r].theirs.reset();
  }
  const int code = ranks[1]->wait_for(Clock::now() + ddprun::testing::scaled(240s));
  const std::string out = ranks[1]->output();
  INFO("rank 1:\n", out, "\n--- rank 0:\n", ranks[0]->output());
  CHECK(code == 1);
  CHECK(out.find("--throw-at-step 4: rank 1 fails on its own (injected)") != std::string::npos);
  CHECK(out.find("abandoned in generation") == std::string::npos);
}

int main(int argc, char** argv) { return ddprun::testing::main_with_skips(argc, argv); }
