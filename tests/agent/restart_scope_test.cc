// --restart-scope=rank end to end (docs/RECOVERY.md): the real ddprun, real
// workers speaking the recovery channel (workers/recovery_worker.py, plain
// /usr/bin/python3, no torch). A killed or hung rank is replaced alone and
// the survivors keep their processes; what cannot recover falls back to a
// group restart; --restart-scope=group stays today's behaviour. Every wait
// is bounded (run_ddprun's deadline, the worker's own 60 s); ctest entry
// agent.restart_scope, skipped (77) without /usr/bin/python3.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>

#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;

namespace {

const char* kPython = "/usr/bin/python3";

std::string worker() { return std::string(WORKERS_DIR) + "/recovery_worker.py"; }

Finished run_rank_scope(std::vector<std::string> flags, std::vector<std::string> worker_args,
                        const std::string& program = worker()) {
  if (access(kPython, X_OK) != 0) {
    MESSAGE("no " << kPython << ": skipped");
    std::exit(77);
  }
  std::vector<std::string> args = std::move(flags);
  args.push_back(program);
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  // Quiet learned detection (Python without torch never beats on its own),
  // unless a test asks for a timeout itself.
  return run_ddprun(args, {std::string("DDPRUN_PYTHON=") + kPython, "PYTHON_EXEC="},
                    Seconds(90));
}

// The value of `key=` in the one line starting with `prefix`; -1 unless there is
// exactly one such line.
long one(const std::string& out, const std::string& prefix, const std::string& key) {
  auto lines = lines_with(out, prefix);
  return lines.size() == 1 ? field(lines[0], key) : -1;
}

std::string digits_masked(const std::string& s) { return std::regex_replace(s, std::regex("[0-9]+"), "N"); }

}  // namespace

TEST_CASE("a killed rank is replaced alone: the survivor keeps its pid and hears failed, ready, recovered") {
  auto r = run_rank_scope({"--nproc-per-node=3", "--max-restarts=2", "--restart-scope=rank",
                           "--hang-timeout=0"},
                          {"--fail", "1:0:3"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  // Generation 0: every rank once; rank 1's replacement in generation 1,
  // same ranks, same attempt (TORCHELASTIC_RESTART_COUNT=0).
  CHECK(lines_with(r.out, "[default0]:start rank=0 local=0 world=3 ").size() == 1);
  CHECK(lines_with(r.out, "[default2]:start rank=2 local=2 world=3 ").size() == 1);
  auto rank1 = lines_with(r.out, "[default1]:start rank=1 local=1 world=3 ");
  REQUIRE(rank1.size() == 2);
  CHECK(rank1[0].find(" gen=0 restart=0 ") != std::string::npos);
  CHECK(rank1[1].find(" gen=1 restart=0 ") != std::string::npos);
  CHECK(field(rank1[0], "pid") != field(rank1[1], "pid"));
  CHECK(count_of(r.out, "restart=1") == 0);
  for (int survivor : {0, 2}) {
    CAPTURE(survivor);
    const std::string p = "[default" + std::to_string(survivor) + "]:";
    const long pid = one(r.out, p + "start ", "pid");
    REQUIRE(pid > 0);
    // The same process heard all three, in order.
    auto got = lines_with(r.out, p + "got ");
    REQUIRE(got.size() == 3);
    CHECK(got[0].find("event=failed generation=1 ranks=1 cause=exit") != std::string::npos);
    CHECK(got[1].find("event=ready generation=1 ranks=1") != std::string::npos);
    CHECK(got[2].find("event=recovered generation=1 ranks=1") != std::string::npos);
    for (const auto& g : got) CHECK(field(g, "pid") == pid);
  }
  // The replacement heard only the end of its own recovery.
  CHECK(lines_with(r.out, "[default1]:got ").size() == 1);
  CHECK(count_of(r.err, "rank 1 (local rank 1, pid ") == 1);
  CHECK(count_of(r.err, ") failed with exit code 3; replacing only that rank, generation 1 "
                        "(--restart-scope=rank; 1 of 2 restarts left)") == 1);
  CHECK(count_of(r.err, "generation 1 formed: every rank joined ") == 1);
  CHECK(count_of(r.err, "restarting the group") == 0);
}

TEST_CASE("a standby dying before assignment is no failure; the next one gets event=assign with the failed rank") {
  // Standby 1 exits 5 at once: one line, and standby 2 starts. Rank 1 fails
  // only once standby 2 waits (its mark file), so the slot goes to it:
  // event=assign with rank 1, local rank 1, generation 1, no new process.
  // Through a shell script: ddprun refuses standbys for a Python program.
  ddprun::testing::TempDir marks;
  const std::string mark2 = marks.file("standby2");
  const std::string wrapper = marks.file("worker.sh");
  std::ofstream(wrapper) << "#!/bin/sh\nexec " << kPython << " " << worker() << " \"$@\"\n";
  REQUIRE(::chmod(wrapper.c_str(), 0755) == 0);
  auto r = run_rank_scope({"--nproc-per-node=2", "--max-restarts=2", "--restart-scope=rank",
                           "--standby-workers=1", "--hang-timeout=0"},
                          {"--standby-fail", "1:5", "--mark", marks.path(), "--fail-when",
                           "1:" + mark2 + ":3"},
                          wrapper);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  const long standby1 = one(r.out, "[standby1]:standby number=1 ", "pid");
  CHECK(lines_with(r.out, "[standby1]:standby number=1 ")[0].find(" rank=unset local=unset") !=
        std::string::npos);
  CHECK(count_of(r.err, "standby 1 (pid " + std::to_string(standby1) +
                            ") ended with exit code 5 before it was assigned a rank; not a "
                            "job failure; starting another") == 1);
  const long standby2 = one(r.out, "[standby2]:standby number=2 ", "pid");
  REQUIRE(standby2 > 0);
  // Once assigned, its lines carry the rank's prefix.
  auto assigned = lines_with(r.out, "[default1]:assigned number=2 ");
  REQUIRE(assigned.size() == 1);
  CHECK(field(assigned[0], "pid") == standby2);
  CHECK(field(assigned[0], "rank") == 1);
  CHECK(field(assigned[0], "local") == 1);
  CHECK(field(assigned[0], "gen") == 1);
  // Rank 1's processes: the first and the standby, none spawned at the failure.
  auto rank1 = lines_with(r.out, "[default1]:start rank=1 local=1 world=2 ");
  REQUIRE(rank1.size() == 2);
  CHECK(field(rank1[1], "pid") == standby2);
  CHECK(rank1[1].find(" gen=1 ") != std::string::npos);
  auto got = lines_with(r.out, "[default0]:got ");
  REQUIRE(got.size() == 3);
  CHECK(got[0].find("event=failed generation=1 ranks=1 cause=exit") != std::string::npos);
  CHECK(got[1].find("event=ready generation=1 ranks=1") != std::string::npos);
  CHECK(got[2].find("event=recovered generation=1 ranks=1") != std::string::npos);
  CHECK(count_of(r.err, "standby 2 (pid " + std::to_string(standby2) +
                            ") takes rank 1's slot (local rank 1), generation 1") == 1);
  CHECK(count_of(r.err, "generation 1 formed: every rank joined ") == 1);
  CHECK(count_of(r.err, "restarting the group") == 0);
}

TEST_CASE("a second failure during the recovery falls back to a group restart of fresh workers") {
  // Rank 1 fails, and so does its replacement before it joins.
  auto r = run_rank_scope({"--nproc-per-node=2", "--max-restarts=3", "--restart-scope=rank",
                           "--hang-timeout=0", "--term-timeout=5"},
                          {"--fail", "1:0:3", "--fail", "1:1:5"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  CHECK(count_of(r.err, "rank-scoped recovery gives up (second_failure): rank 1 (local rank 1, "
                        "pid ") == 1);
  CHECK(count_of(r.err, "failed with exit code 5 during the recovery of generation 1") == 1);
  // The survivor heard the fallback; the group restart counts both restarts.
  CHECK(lines_with(r.out, "[default0]:got ").back().find("event=fallback reason=second_failure") !=
        std::string::npos);
  CHECK(count_of(r.err, "restarting the group (restart 2 of 3)") == 1);
  // Attempt 1: fresh processes for both ranks, TORCHELASTIC_RESTART_COUNT=1.
  std::set<long> first, second;
  for (int rank : {0, 1}) {
    for (const auto& l : lines_with(r.out, "[default" + std::to_string(rank) + "]:start ")) {
      (l.find(" restart=1 ") != std::string::npos ? second : first).insert(field(l, "pid"));
      if (l.find(" restart=1 ") != std::string::npos) CHECK(l.find(" gen=0 ") != std::string::npos);
    }
  }
  CHECK(second.size() == 2);
  for (long pid : second) CHECK_FALSE(first.count(pid));
}

TEST_CASE("a worker that ignores the channel never joins: --recovery-timeout falls back") {
  auto r = run_rank_scope({"--nproc-per-node=2", "--max-restarts=2", "--restart-scope=rank",
                           "--hang-timeout=0", "--recovery-timeout=1", "--term-timeout=5"},
                          {"--fail", "1:0:3", "--ignore-channel"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  CHECK(count_of(r.err, "rank-scoped recovery gives up (timeout): generation 1 did not form "
                        "within --recovery-timeout=1 s (not joined: rank 0,1)") == 1);
  CHECK(lines_with(r.out, "[default0]:start ").size() == 2);
  CHECK(count_of(r.out, "[default0]:start rank=0 local=0 world=2 ") == 2);
  CHECK(count_of(r.out, " restart=1 ") == 2);
}

TEST_CASE("no restart left: the failure ends the job as with group scope, said in one line") {
  auto r = run_rank_scope({"--nproc-per-node=2", "--restart-scope=rank", "--hang-timeout=0",
                           "--term-timeout=5"},
                          {"--fail", "1:0:3"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 3);
  CHECK(count_of(r.err, "rank-scoped recovery gives up (no_restart_left): ") == 1);
  CHECK(count_of(r.err, "root cause: rank 1 (local rank 1, pid ") == 1);
}

TEST_CASE("a hung rank is SIGKILLed and replaced, and the watchdog watches its replacement") {
  // Local rank 0 stops beating in generation 0, and its replacement in
  // generation 1 once that formed: two hangs, two replacements, the
  // survivor the same process throughout. (Rank 0: the watchdog's socket
  // and state belong to the attempt, not to its first worker.)
  auto r = run_rank_scope({"--nproc-per-node=2", "--max-restarts=2", "--restart-scope=rank",
                           "--heartbeat-timeout=1", "--heartbeat-grace=20", "--stack-capture=none",
                           "--term-timeout=5"},
                          {"--beat", "--recoveries=2", "--hang", "0:0", "--hang", "0:1"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  auto rank0 = lines_with(r.out, "[default0]:start ");
  REQUIRE(rank0.size() == 3);
  CHECK(rank0[1].find(" gen=1 ") != std::string::npos);
  CHECK(rank0[2].find(" gen=2 ") != std::string::npos);
  CHECK(lines_with(r.out, "[default1]:start ").size() == 1);
  CHECK(count_of(r.err, "freeze: rank 0 is the culprit; replacing that rank") == 2);
  CHECK(count_of(r.err, ") hung; replacing only that rank, generation 1 ") == 1);
  CHECK(count_of(r.err, ") hung; replacing only that rank, generation 2 ") == 1);
  auto got = lines_with(r.out, "[default1]:got ");
  REQUIRE(got.size() == 6);
  CHECK(got[0].find("event=failed generation=1 ranks=0 cause=hang") != std::string::npos);
  CHECK(got[2].find("event=recovered generation=1 ranks=0") != std::string::npos);
  CHECK(got[3].find("event=failed generation=2 ranks=0 cause=hang") != std::string::npos);
  // Both hung processes are gone (SIGKILLed or ended by their SIGABRT).
  for (size_t i = 0; i < 2; ++i) {
    const pid_t pid = static_cast<pid_t>(field(rank0[i], "pid"));
    CHECK((kill(pid, 0) != 0 && errno == ESRCH));
  }
  CHECK(count_of(r.err, "restarting the group") == 0);
}

TEST_CASE("--restart-scope=group is today's behaviour: no channel, the whole group restarts") {
  auto plain = run_rank_scope({"--nproc-per-node=2", "--max-restarts=2", "--hang-timeout=0"},
                              {"--fail", "1:0:3"});
  auto group = run_rank_scope({"--nproc-per-node=2", "--max-restarts=2", "--hang-timeout=0",
                               "--restart-scope=group"},
                              {"--fail", "1:0:3"});
  for (const auto* r : {&plain, &group}) {
    REQUIRE_FALSE(r->timed_out);
    CHECK(r->status == 0);
    CHECK(count_of(r->out, " fd=none") == 4);
    CHECK(count_of(r->out, " restart=1 fd=none") == 2);
    CHECK(count_of(r->err, "restarting the group (restart 1 of 2)") == 1);
    CHECK(count_of(r->err, "rank-scoped") == 0);
  }
  CHECK(digits_masked(plain.err) == digits_masked(group.err));
}

namespace {

std::set<long> fds_of(const std::string& start_line) {
  std::set<long> out;
  const size_t at = start_line.find(" fds=");
  if (at == std::string::npos) return out;
  std::string list = start_line.substr(at + 5);
  for (size_t p = 0; p < list.size();) {
    size_t comma = list.find(',', p);
    if (comma == std::string::npos) comma = list.size();
    out.insert(std::strtol(list.substr(p, comma - p).c_str(), nullptr, 10));
    p = comma + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("each worker inherits its own channel end and nothing more than with group scope") {
  auto group = run_rank_scope({"--nproc-per-node=3", "--hang-timeout=0"}, {"--recoveries=0"});
  auto rank = run_rank_scope({"--nproc-per-node=3", "--hang-timeout=0", "--restart-scope=rank",
                              "--max-restarts=1"},
                             {"--recoveries=0"});
  REQUIRE(group.status == 0);
  REQUIRE(rank.status == 0);
  auto group_lines = lines_with(group.out, "[default");
  auto rank_lines = lines_with(rank.out, "[default");
  REQUIRE(group_lines.size() == 3);
  REQUIRE(rank_lines.size() == 3);
  std::vector<long> channels;
  for (const auto& l : rank_lines) channels.push_back(field(l, "fd"));
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(rank_lines[i]);
    const auto fds = fds_of(rank_lines[i]);
    CHECK(fds.count(channels[i]) == 1);
    for (size_t j = 0; j < 3; ++j)
      if (j != i) CHECK(fds.count(channels[j]) == 0);  // a peer's end is close-on-exec
    // What a worker inherits besides (the agent's own, the test's): as many
    // as under group scope.
    CHECK(fds.size() == fds_of(group_lines[i]).size() + 1);
  }
}
