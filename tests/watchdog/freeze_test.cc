// Freeze detection on by default, end to end: ddprun with default flags
// (a small --hang-timeout-floor so the tests stay short) runs
// scripts/unmodified_ddp.py, a gloo DDP script with no ddprun import, on
// the interpreter of tests/common/test_python.h (/usr/bin/python3 with
// Debian's torch 1.13; the torch2 label reruns this with the torch 2.x
// venv). Every case names "Python" so that label's filter selects it.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/common/skip.h"
#include "tests/common/slurp.h"
#include "tests/common/test_python.h"
#include "tests/watchdog/ddprun_job.h"
#include "tests/watchdog/test_util.h"

using namespace ddprun::watchdog::testing;
using nlohmann::json;

namespace {

// Generous: a busy 2-core machine runs two torch workers slowly.
constexpr auto kJobDeadline = std::chrono::seconds(240);
const std::string kScript = std::string(WATCHDOG_SCRIPTS) + "/unmodified_ddp.py";
// Floor of the learned timeouts in these tests (the default is 60 s).
const std::string kFloor = "--hang-timeout-floor=3";

bool torch_importable() {
  Child py({test_python(), "-c", "import torch, torch.distributed"});
  auto status = py.wait_for(std::chrono::seconds(120));
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

struct Job : DdprunJob {
  Job() : DdprunJob("fz") {}
  bool has_report(int n) const { return std::filesystem::exists(attempt(n) + "/hang_report.json"); }
  // ddprun [flags] unmodified_ddp.py <mode>, in this job's folder as cwd,
  // with `ulimit -c unlimited` (a core dump would land right here).
  void run(std::vector<std::string> flags, const std::string& mode) {
    std::vector<std::string> argv = {"/bin/sh", "-c", "cd \"$1\" && ulimit -c unlimited && shift && exec \"$@\"",
                                     "sh", dir.path(), DDPRUN_BIN, "--nproc-per-node=2",
                                     "--rdzv-id=" + rdzv_id, "--log-dir=" + log_dir()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(kScript);
    argv.push_back(mode);
    run_argv(argv, {}, kJobDeadline);
  }
  std::vector<std::string> cores() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      if (e.path().filename().string().rfind("core", 0) == 0) out.push_back(e.path().string());
    return out;
  }
};

#define REQUIRE_TORCH()                                                                  \
  if (!torch_importable()) {                                                             \
    SKIP_TEST(test_python() + " cannot import torch.distributed: no torch to run with"); \
    return;                                                                              \
  }

}  // namespace

TEST_CASE("freeze: an unmodified Python DDP job whose rank 1 stops in a collective is caught "
          "with default flags, rank 1 named culprit, exit 124, no core dump") {
  REQUIRE_TORCH();
  Job job;
  job.run({kFloor}, "hang");
  CAPTURE(job.console());
  CHECK(job.exit_code == 124);
  const auto r = job.report();
  CHECK(r["kind"] == "heartbeat_timeout");
  CHECK(r["culprit_rank"] == 1);
  CHECK(r["suspect_ranks"][0] == 1);
  CHECK(r["rank"] == 1);
  CHECK(r["action"] == "exit");
  // The learned bound (5 x the longest step, at least 1 s), acted on by the
  // evidence when below the 3 s floor; the floor otherwise.
  const double timeout = r["timeout_s"];
  CHECK(timeout >= 1.0);
  CHECK(timeout < 60.0);
  if (timeout < 3.0) CHECK(r["evidence"].get<std::string>().find("rank 1 in all_reduce") != std::string::npos);
  // Rank 0 waits in DDP's backward (its gradient all-reduce), rank 1 in a
  // collective of a group nobody else joined: both inside, in different ones.
  CHECK(r["in_collective_ranks"] == json::array({0, 1}));
  CHECK(r["mismatch"].get<std::string>().find("rank 1 in all_reduce") != std::string::npos);
  CHECK(r["learned_from"].get<std::string>().rfind("step: ", 0) == 0);
  CHECK(r["workers"][1]["step"].get<int>() == 49);
  CHECK(job.console().find("freeze: rank 1 is the culprit") != std::string::npos);
  CHECK(job.console().find("Hang detected in attempt 0: rank 1 ") != std::string::npos);
  // Both ranks' Python stacks, dumped live by the workers before the
  // verdict: nothing of faulthandler's on the console, no core dump with
  // `ulimit -c unlimited` in this folder; the culprit's frames are there.
  REQUIRE(r["stacks"].size() == 2);
  CHECK(r["stacks"][0]["method"] == "python_faulthandler");
  CHECK(r["stacks"][1]["text"].get<std::string>().find("unmodified_ddp.py") != std::string::npos);
  CHECK(job.console().find("Fatal Python error") == std::string::npos);
  CHECK(job.console().find("Rank 1's main thread, innermost first:") != std::string::npos);
  CHECK(job.cores().empty());
  CHECK(slurp(job.attempt(0) + "/hang_report.txt").find("Timeouts (learned") != std::string::npos);
}

TEST_CASE("freeze: a healthy unmodified Python job with checkpoints 30 steps long on rank 0 and "
          "eval passes 20 steps long runs 320 steps without a false hang") {
  REQUIRE_TORCH();
  Job job;
  job.run({kFloor}, "healthy");
  CAPTURE(job.console());
  CHECK(job.exit_code == 0);
  CHECK_FALSE(job.has_report(0));
  CHECK(slurp(job.attempt(0) + "/0/stdout.log").find("rank 0 step 300") != std::string::npos);
  CHECK(job.console().find("freeze:") == std::string::npos);
}

TEST_CASE("freeze: a Python setup of 20 s (6 x the floor) before the first step is no hang") {
  REQUIRE_TORCH();
  Job job;
  job.run({kFloor}, "setup");
  CAPTURE(job.console());
  CHECK(job.exit_code == 0);
  CHECK_FALSE(job.has_report(0));
}

TEST_CASE("freeze: a restarted Python attempt uses the learned timeouts from its first step") {
  REQUIRE_TORCH();
  Job job;
  job.run({kFloor, "--max-restarts=1"}, "restart");
  CAPTURE(job.console());
  CHECK(job.exit_code == 124);  // the second hang ends the job: no restart left
  CHECK(job.report(0)["action"] == "restart");
  const auto r = job.report(1);
  CHECK(r["culprit_rank"] == 1);
  CHECK(r["workers"][1]["step"].get<int>() == 2);
  // Not the 600 s initial guess: what attempt 0 learned.
  CHECK(r["timeout_s"].get<double>() < 60.0);
  bool step_learned = false;
  for (const auto& t : r["timeouts"])
    if (t["kind"] == "step") step_learned = t["learned"].get<bool>() && t["samples"] > 50;
  CHECK(step_learned);
}

TEST_CASE("freeze: --hang-timeout=S and --heartbeat-timeout=S are fixed timeouts for a Python "
          "job (nothing learned)") {
  REQUIRE_TORCH();
  for (const std::string flag : {"--hang-timeout=3", "--heartbeat-timeout=3"}) {
    CAPTURE(flag);
    Job job;
    job.run({flag, "--heartbeat-grace=120"}, "hang");
    CAPTURE(job.console());
    CHECK(job.exit_code == 124);
    const auto r = job.report();
    CHECK(r["timeout_s"] == 3.0);
    CHECK(r["learned_from"] == "");
    CHECK(r["timeouts"].empty());
    CHECK(r["culprit_rank"] == 1);
  }
}

TEST_CASE("freeze: --on-hang=report warns about a stalled Python rank and keeps the job running") {
  REQUIRE_TORCH();
  Job job;
  job.run({kFloor, "--on-hang=report"}, "stall");
  CAPTURE(job.console());
  CHECK(job.exit_code == 0);
  const auto r = job.report();
  CHECK(r["action"] == "report");
  CHECK(r["culprit_rank"] == 1);
  CHECK(job.console().find("reporting only (--on-hang=report): the job keeps running") !=
        std::string::npos);
  CHECK(slurp(job.attempt(0) + "/1/stdout.log").find("rank 1 done") != std::string::npos);
}

TEST_CASE("freeze: a sleeping Python rank is ended at the learned bound, long before the floor, "
          "on the evidence that the other waits for it") {
  REQUIRE_TORCH();
  Job job;
  job.run({"--hang-timeout-floor=40"}, "sleep");
  CAPTURE(job.console());
  CHECK(job.exit_code == 124);
  const auto r = job.report();
  CHECK(r["culprit_rank"] == 1);
  CHECK(r["culprit_state"] == "asleep");
  CHECK(r["timeout_s"].get<double>() < 40.0);
  CHECK(r["evidence"].get<std::string>().find("rank 1 is outside any collective") != std::string::npos);
  CHECK(r["in_collective_ranks"] == json::array({0}));
  CHECK(r["culprit_by_stacks"] == true);
  // The advice points at the code, not at a flag that would hide the hang.
  CHECK(r["flags_to_change"][0].get<std::string>().find("unmodified_ddp.py") != std::string::npos);
  CHECK(job.console().find("freeze detection is on") != std::string::npos);
}

TEST_CASE("freeze: a Python rank spinning in its own loop is ended at the learned bound, its "
          "main thread answering the bytecode probe there") {
  REQUIRE_TORCH();
  Job job;
  job.run({"--hang-timeout-floor=40"}, "spin");
  CAPTURE(job.console());
  CHECK(job.exit_code == 124);
  const auto r = job.report();
  CHECK(r["culprit_rank"] == 1);
  CHECK(r["in_collective_ranks"] == json::array({0}));
  if (r["culprit_state"] == "spinning") {
    CHECK(r["timeout_s"].get<double>() < 40.0);
    // Confirmed by the probe, not by 5 s more of an unchanged stack.
    CHECK(r["evidence"].get<std::string>().find("answers a Python signal") != std::string::npos);
    return;
  }
  // A busy machine (the suite's loaded runs) may give the spinning rank
  // under a quarter of the window's CPU: nothing then tells its loop from a
  // healthy rank the machine starves, so it is ended at the floor, never
  // sooner (watchdog/README.md, rule 5).
  CHECK(job.console().find("rank 1 is runnable but got little CPU (a loaded machine)") !=
        std::string::npos);
  CHECK(r["timeout_s"].get<double>() >= 40.0);
}

TEST_CASE("freeze: a Python rank waiting 8 s for a child process that does I/O is not ended before "
          "the floor") {
  REQUIRE_TORCH();
  Job job;
  job.run({"--hang-timeout-floor=40"}, "child_io");
  CAPTURE(job.console());
  CHECK(job.exit_code == 0);
  CHECK_FALSE(job.has_report(0));
  // Judged once at the learned bound, found alive, said so once.
  CHECK(job.console().find("rank 1 is alive: its processes did") != std::string::npos);
  CHECK(slurp(job.attempt(0) + "/1/stdout.log").find("rank 1 done") != std::string::npos);
}
