// --restart-scope=rank end to end: the real ddprun starting real `train`
// ranks (docs/RECOVERY.md). A rank SIGKILLs itself in the middle of a
// random step (--kill-at-step) or hangs after one (--hang-at-step, the
// watchdog finds it); ddprun replaces only that rank and the run must end
// with parameters bit-identical to an uninterrupted one, no checkpoint
// read, no group restart. A replacement that dies before it joins is a
// second failure during the recovery: ddprun falls back to a group restart
// from the checkpoint, which still ends bit-identical.
//
// Kill steps, ranks and backends come from a printed seed
// (DDPRUN_RECOVERY_SEED repeats a run); DDPRUN_RECOVERY_TRIALS sets the
// trials per world size (5, for 2 and 4 ranks). Every run has a deadline;
// process.h kills what the test started.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/skip.h"
#include "tests/common/time_scale.h"
#include "tests/trainer/process.h"
#include "tests/trainer/recovery_support.h"
#include "tests/trainer/temp_dir.h"
#include "trainer/checkpoint.h"

using namespace ddprun::trainer::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kTrain = TRAIN_BIN;
const std::string kDdprun = DDPRUN_BIN;
constexpr int kSteps = 30;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Run {
  int code = -1;
  std::string out;
  std::string params_sha;
  std::string events;  // events.jsonl
};

// `ddprun [flags] train [train flags]` in a fresh folder.
Run run_ddprun(int world, const std::string& backend, const std::vector<std::string>& flags,
           const std::vector<std::string>& train_flags, const std::string& program = kTrain) {
  TempDir tmp;
  std::vector<std::string> argv = {kDdprun, "--standalone", "--nproc-per-node=" + std::to_string(world),
                                   "--max-restarts=3", "--term-timeout=5", "--log-dir",
                                   tmp.file("logs")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--no-python");
  argv.push_back(program);
  for (const std::string& a :
       {std::string("--backend"), backend, std::string("--steps"), std::to_string(kSteps),
        std::string("--hidden"), std::string("64"), std::string("--momentum"), std::string("0.9"),
        std::string("--seed"), std::string("11"), std::string("--log-every"), std::string("0"),
        std::string("--checkpoint-every"), std::string("10"), std::string("--checkpoint-dir"),
        tmp.file("ckpt"), std::string("--save-params"), tmp.file("params")})
    argv.push_back(a);
  argv.insert(argv.end(), train_flags.begin(), train_flags.end());
  Process p(argv, {{"OMP_NUM_THREADS", "1"}}, tmp.file("ddprun.log"));
  Run r;
  r.code = p.wait_for(Clock::now() + ddprun::testing::scaled(300s));
  r.out = p.output();
  r.params_sha = sha_of(tmp.file("params"));
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp.file("logs"), ec))
    if (e.path().filename() == "events.jsonl") r.events += slurp(e.path().string());
  return r;
}

std::string reference_sha(int world, const std::string& backend) {
  static std::map<std::string, std::string> done;
  const std::string key = backend + std::to_string(world);
  if (auto it = done.find(key); it != done.end()) return it->second;
  const Run r = run_ddprun(world, backend, {"--hang-timeout=0"}, {});
  INFO("uninterrupted run:\n", r.out);
  REQUIRE(r.code == 0);
  return done[key] = r.params_sha;
}

// The agent's "every rank joined N ms after rank R failed", -1 if absent.
long joined_ms(const std::string& out) {
  static const std::regex re(R"(generation 1 formed: every rank joined (\d+) ms after rank)");
  std::smatch m;
  return std::regex_search(out, m, re) ? std::stol(m[1]) : -1;
}

// What every rank-scoped recovery of generation 1 must show.
void check_recovered(const Run& r, int world, const std::string& reference) {
  INFO("ddprun output:\n", r.out);
  REQUIRE(r.code == 0);
  CHECK(count_of(r.out, "replacing only that rank, generation 1 ") == 1);
  CHECK(count_of(r.out, "generation 1 formed: every rank joined ") == 1);
  CHECK(count_of(r.out, ": generation 1 formed; state from rank ") == size_t(world));
  CHECK(count_of(r.out, "no checkpoint read") == size_t(world));
  CHECK(count_of(r.out, "restarting the group") == 0);
  CHECK(count_of(r.out, "resuming from") == 0);
  CHECK(r.params_sha == reference);
}

}  // namespace

TEST_CASE("ddprun --restart-scope=rank: a rank SIGKILLed mid-step is replaced alone, bit-identical") {
  const uint64_t seed = seed_from_env();
  const int trials = trials_from_env();
  std::printf("ddprun rank scope, kill: seed %llu (DDPRUN_RECOVERY_SEED=%llu repeats it), %d "
              "trials per size\n",
              (unsigned long long)seed, (unsigned long long)seed, trials);
  std::mt19937_64 gen(seed);
  std::vector<long> times;
  for (int world : {2, 4}) {
    for (int t = 0; t < trials; ++t) {
      const std::string backend = t % 2 == 0 ? "gloo" : "shm";
      const int kill_step = 1 + int(gen() % (kSteps - 1));
      const int victim = int(gen() % uint64_t(world));
      CAPTURE(world);
      CAPTURE(backend);
      CAPTURE(kill_step);
      CAPTURE(victim);
      const std::string reference = reference_sha(world, backend);
      const Run r = run_ddprun(world, backend, {"--restart-scope=rank", "--hang-timeout=0"},
                           {"--kill-at-step", std::to_string(kill_step), "--kill-rank",
                            std::to_string(victim)});
      check_recovered(r, world, reference);
      const long ms = joined_ms(r.out);
      std::printf("  %d ranks %s: rank %d killed in step %d: all joined %ld ms after the "
                  "failure, params %s\n",
                  world, backend.c_str(), victim, kill_step, ms,
                  r.params_sha == reference ? "bit-identical" : "DIFFERENT");
      std::fflush(stdout);
      times.push_back(ms);
    }
  }
  std::sort(times.begin(), times.end());
  std::printf("ddprun rank scope, kill: failure to all joined min %ld median %ld max %ld ms\n",
              times.front(), times[times.size() / 2], times.back());
}

TEST_CASE("ddprun --restart-scope=rank: a hung rank is found, SIGKILLed and replaced, bit-identical") {
  const uint64_t seed = seed_from_env();
  std::printf("ddprun rank scope, hang: seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 gen(seed);
  const std::string beat_timeout =
      std::to_string(ddprun::testing::scaled(std::chrono::seconds(2)).count());
  for (int world : {2, 4}) {
    for (const std::string backend : {"gloo", "shm"}) {
      const int hang_step = 1 + int(gen() % (kSteps - 1));
      CAPTURE(world);
      CAPTURE(backend);
      CAPTURE(hang_step);
      const std::string reference = reference_sha(world, backend);
      const Run r = run_ddprun(world, backend,
                           {"--restart-scope=rank", "--heartbeat-timeout=" + beat_timeout,
                            "--heartbeat-grace=60", "--stack-capture=none"},
                           {"--hang-at-step", std::to_string(hang_step)});
      check_recovered(r, world, reference);
      CHECK(count_of(r.out, "hangs here (injected)") == 1);
      CHECK(count_of(r.out, ") hung; replacing only that rank, generation 1 ") == 1);
      std::printf("  %d ranks %s: rank %d hung after step %d: all joined %ld ms after the "
                  "failure, params %s\n",
                  world, backend.c_str(), world - 1, hang_step, joined_ms(r.out),
                  r.params_sha == reference ? "bit-identical" : "DIFFERENT");
      std::fflush(stdout);
    }
  }
}

TEST_CASE("ddprun --restart-scope=rank: a replacement that dies before joining falls back to a group restart") {
  // The replacement (DDPRUN_GENERATION=1) exits 5 before it joins: a second
  // failure during the recovery. The group restarts from the checkpoint
  // (step 10 or 20) and still ends bit-identical.
  TempDir tmp;
  const std::string wrapper = tmp.file("train-or-fail");
  std::ofstream(wrapper) << "#!/bin/sh\n"
                            "# A replacement that cannot start: the second failure.\n"
                            "if [ \"$DDPRUN_GENERATION\" = 1 ]; then echo 'replacement fails';"
                            " exit 5; fi\n"
                            "exec " << kTrain << " \"$@\"\n";
  REQUIRE(::chmod(wrapper.c_str(), 0755) == 0);
  for (const std::string backend : {"gloo", "shm"}) {
    CAPTURE(backend);
    const std::string reference = reference_sha(2, backend);
    const Run r = run_ddprun(2, backend, {"--restart-scope=rank", "--hang-timeout=0"},
                         {"--kill-at-step", "15", "--kill-rank", "1"}, wrapper);
    INFO("ddprun output:\n", r.out);
    REQUIRE(r.code == 0);
    CHECK(count_of(r.out, "replacing only that rank, generation 1 ") == 1);
    CHECK(count_of(r.out, "replacement fails") == 1);
    CHECK(count_of(r.out, "rank-scoped recovery gives up (second_failure)") == 1);
    CHECK(count_of(r.out, "restarting the group (restart 2 of 3)") == 1);
    CHECK(count_of(r.out, "resuming from") == 1);  // the group restart reads its checkpoint
    CHECK(r.params_sha == reference);
  }
}

TEST_CASE("ddprun --standby-workers=1: the pre-started standby takes the killed rank's slot, bit-identical") {
  // The standby built its model and waits; the killed rank's slot goes to
  // it (event=assign): its pid is the one events.jsonl's rank_assigned
  // names, and no process is spawned for the slot (no rank_replaced).
  const uint64_t seed = seed_from_env();
  const int trials = std::min(trials_from_env(), 2);
  std::printf("ddprun rank scope, standby: seed %llu, %d trials\n", (unsigned long long)seed,
              trials);
  std::mt19937_64 gen(seed);
  for (int t = 0; t < trials; ++t) {
    const std::string backend = t % 2 == 0 ? "gloo" : "shm";
    const int kill_step = 1 + int(gen() % (kSteps - 1));
    const int victim = int(gen() % 2);
    CAPTURE(backend);
    CAPTURE(kill_step);
    CAPTURE(victim);
    const std::string reference = reference_sha(2, backend);
    const Run r = run_ddprun(2, backend,
                             {"--restart-scope=rank", "--standby-workers=1", "--hang-timeout=0"},
                             {"--kill-at-step", std::to_string(kill_step), "--kill-rank",
                              std::to_string(victim)});
    check_recovered(r, 2, reference);
    INFO("events.jsonl:\n", r.events);
    static const std::regex waiting(R"(standby 1 \(pid (\d+)\): model and optimizer built)");
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, waiting));
    const std::string standby_pid = m[1];
    CHECK(count_of(r.out, "standby 1 is rank " + std::to_string(victim) + " (local rank " +
                              std::to_string(victim) + "), joining generation 1") == 1);
    CHECK(count_of(r.events, "\"event\":\"rank_assigned\"") == 1);
    CHECK(count_of(r.events, "\"event\":\"rank_replaced\"") == 0);
    static const std::regex assigned(R"x("event":"rank_assigned".*"pid":(\d+))x");
    REQUIRE(std::regex_search(r.events, m, assigned));
    CHECK(m[1] == standby_pid);
    std::printf("  2 ranks %s: rank %d killed in step %d, standby pid %s took its slot: all "
                "joined %ld ms after the failure, params %s\n",
                backend.c_str(), victim, kill_step, standby_pid.c_str(), joined_ms(r.out),
                r.params_sha == reference ? "bit-identical" : "DIFFERENT");
    std::fflush(stdout);
  }
}

int main(int argc, char** argv) { return ddprun::testing::main_with_skips(argc, argv); }
