// ddprun attach on a process group (--pgid) and on a Slurm step's processes
// (--slurm-step, found by SLURM_JOB_ID/SLURM_STEP_ID in their environment;
// here plain processes carrying them: the real Slurm is in tests/slurm).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/proc_stat.h"
#include "introspect/proc_usage.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

namespace {

using ddprun::testing::DdprunProcess;
using ddprun::testing::TempDir;
using nlohmann::json;

// Two ranks that sleep (no CPU, no I/O) under a shell that waits for them.
const std::string kTwoSleepingRanks =
    "RANK=0 sleep 600 & RANK=1 sleep 600 & echo started; wait";

// SIGKILLs a process group when the test ends, whatever happened: the
// shells' sleeping children must not outlive the test.
struct GroupKiller {
  pid_t pgid;
  ~GroupKiller() { ::kill(-pgid, SIGKILL); }
};

bool started(const std::string& o) { return o.find("started") != std::string::npos; }

bool dead(pid_t pid) {
  const auto st = ddprun::base::read_proc_stat(pid);
  return !st || st->state == 'Z';
}

json read_report(const std::string& dir) {
  std::ifstream in(dir + "/hang_report.json");
  REQUIRE(in);
  return json::parse(in);
}

std::set<int> watched_ranks(const json& report) {
  std::set<int> out;
  for (const auto& w : report["watched"]) out.insert(w["rank"].get<int>());
  return out;
}

}  // namespace

TEST_CASE("attach --pgid: a process group whose ranks stop is reported and, with kill, ends") {
  TempDir dir;
  // In a group of its own, as a shell starts a job.
  DdprunProcess group({"-c", kTwoSleepingRanks}, {}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_group{group.pid()};
  REQUIRE(group.wait_for_stdout(started, std::chrono::seconds(30)));
  const auto r = ddprun::testing::run_ddprun(
      {"attach", "--pgid", std::to_string(group.pid()), "--silence-timeout", "1", "--on-hang",
       "kill", "--kill-grace", "5", "--stack-capture", "proc", "--report-dir", dir.path()},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.out.find("group " + std::to_string(group.pid())) != std::string::npos);
  const json report = read_report(dir.path());
  CHECK(report["kind"] == "silence_timeout");  // attach's no-progress rule
  CHECK(report["attach_kind"] == "no_progress");
  CHECK(watched_ranks(report) == std::set<int>{0, 1});
  CHECK(report["stacks"].at(0)["rank"] == report["rank"]);
  // The whole group ended: the shell (SIGTERM) and both ranks.
  const auto end = group.finish(std::chrono::seconds(30));
  CHECK(!end.timed_out);
  for (const auto& w : report["watched"]) CHECK(dead(w["pid"].get<pid_t>()));
}

TEST_CASE("attach --slurm-step: the step's ranks are watched, other steps of the job are not") {
  TempDir dir;
  // A job id no real Slurm here hands out, unique per test process.
  const std::string job = std::to_string(900000000 + ::getpid());
  DdprunProcess step0({"-c", kTwoSleepingRanks}, {"SLURM_JOB_ID=" + job, "SLURM_STEP_ID=0"},
                      "/bin/sh", /*own_group=*/true);
  GroupKiller kill_step0{step0.pid()};
  DdprunProcess step1({"-c", "RANK=5 sleep 600 & echo started; wait"},
                      {"SLURM_JOB_ID=" + job, "SLURM_STEP_ID=1"}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_step1{step1.pid()};
  REQUIRE(step0.wait_for_stdout(started, std::chrono::seconds(30)));
  REQUIRE(step1.wait_for_stdout(started, std::chrono::seconds(30)));
  const auto r = ddprun::testing::run_ddprun(
      {"attach", "--slurm-step", job + ".0", "--silence-timeout", "1", "--on-hang", "kill",
       "--kill-grace", "5", "--stack-capture", "proc", "--report-dir", dir.path()},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.out.find("Slurm step " + job + ".0") != std::string::npos);
  const json report = read_report(dir.path());
  CHECK(watched_ranks(report) == std::set<int>{0, 1});
  // Step 0 ended; step 1 of the same job was left alone.
  CHECK(!step0.finish(std::chrono::seconds(30)).timed_out);
  CHECK(!dead(step1.pid()));
  // A step with no process here is a usage error naming it; so is a malformed one.
  const auto none = ddprun::testing::run_ddprun({"attach", "--slurm-step", job + ".7"}, {},
                                                std::chrono::seconds(30));
  CHECK(none.status == 2);
  CHECK(none.err.find("no process of Slurm step " + job + ".7 on this node") != std::string::npos);
  const auto bad = ddprun::testing::run_ddprun({"attach", "--slurm-step", "12x"}, {},
                                               std::chrono::seconds(30));
  CHECK(bad.status == 2);
  CHECK(bad.err.find("--slurm-step 12x") != std::string::npos);
}

TEST_CASE("attach: a rank stopped (state T) for --stuck-timeout is hung, though its silence "
          "timeout is far off") {
  TempDir dir;
  DdprunProcess group({"-c", kTwoSleepingRanks}, {}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_group{group.pid()};
  REQUIRE(group.wait_for_stdout(started, std::chrono::seconds(30)));
  // Rank 1: the shell's child with RANK=1 (it may not have exec'd yet when
  // the shell printed "started": look until it carries RANK).
  pid_t rank1 = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rank1 == 0 && std::chrono::steady_clock::now() < deadline) {
    for (pid_t p : ddprun::introspect::child_pids(group.pid()))
      if (ddprun::introspect::proc_environ_value(p, "RANK") == "1") rank1 = p;
  }
  REQUIRE(rank1 > 0);
  ::kill(rank1, SIGSTOP);  // as a debugger or a stray job-control stop would
  const auto r = ddprun::testing::run_ddprun(
      {"attach", "--pgid", std::to_string(group.pid()), "--silence-timeout", "600",
       "--stuck-timeout", "1", "--once", "--stack-capture", "none", "--report-dir", dir.path()},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  const json report = read_report(dir.path());
  CHECK(report["kind"] == "process_stopped");
  CHECK(report["rank"] == 1);
  CHECK(report["pid"] == rank1);
  ::kill(-group.pid(), SIGKILL);
  ::kill(rank1, SIGCONT);
  CHECK(!group.finish(std::chrono::seconds(30)).timed_out);
}
