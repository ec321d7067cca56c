// ddprun end to end with real hung workers: each hang is detected, its stack
// or traceback lands in the hang report, the group restarts and the next
// attempt completes. A worker that beats on time is never killed.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/version.h"
#include "tests/common/python_stack_tools.h"
#include "tests/common/run_folder.h"
#include "tests/common/skip.h"
#include "tests/common/slurp.h"
#include "tests/common/test_python.h"
#include "tests/watchdog/ddprun_job.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/stack_capture.h"

using namespace ddprun::watchdog::testing;
using nlohmann::json;

namespace {

constexpr auto kJobDeadline = std::chrono::seconds(90);

struct Job : DdprunJob {
  Job() : DdprunJob("wd") {}

  // Runs ddprun with `flags` then `program...`, bounded by kJobDeadline.
  void run(std::vector<std::string> flags, const std::vector<std::string>& program,
           std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {DDPRUN_BIN, "--rdzv-id=" + rdzv_id, "--log-dir=" + log_dir()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), program.begin(), program.end());
    run_argv(argv, std::move(env), kJobDeadline);
  }

  std::vector<json> events() const {
    std::vector<json> out;
    std::ifstream in(run_dir() + "/events.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  std::vector<std::string> event_names() const {
    std::vector<std::string> names;
    for (const auto& e : events()) {
      // progress: the monitor's step samples (introspect/agent_hook.h), at its own pace.
      if (e["event"] != "worker_exit" && e["event"] != "progress") names.push_back(e["event"]);
    }
    return names;
  }
};

// Common to every hang scenario: detected, restarted once, then completed.
void check_recovered(const Job& job, const std::string& done_log) {
  CAPTURE(job.console());
  CHECK(job.exit_code == 0);
  const auto names = job.event_names();
  CHECK(names ==
        std::vector<std::string>{"start", "rendezvous", "hang_detected", "restart", "rendezvous",
                                 "done"});
  CHECK(job.events().back()["reason"] == "succeeded");
  CHECK(slurp(done_log).find("done") != std::string::npos);
  CHECK(job.console().find("Hang detected in attempt 0") != std::string::npos);
}

}  // namespace

TEST_CASE("a native worker that stops beating while alive: its stack, restart, completion") {
  Job job;
  job.run({"--nproc-per-node=2", "--max-restarts=1", "--heartbeat-timeout=1",
           "--heartbeat-grace=30"},
          {WATCHDOG_TEST_WORKER, "scenario", "nobeat"});
  check_recovered(job, job.attempt(1) + "/1/stdout.log");
  const auto r = job.report();
  CHECK(r["kind"] == "heartbeat_timeout");
  CHECK(r["rank"] == 1);
  CHECK(r["stalled_ranks"] == json::array({1}));  // the healthy peer is not blamed
  CHECK(r["suspect_ranks"] == json::array({1}));  // its step is behind rank 0's
  CHECK(r["workers"][1]["step"] == 2);
  REQUIRE(r["stacks"].size() == 1);
  // eu-stack first, gdb when elfutils is missing, /proc without either.
  const bool eu_stack = tool_installed("eu-stack");
  if (eu_stack || tool_installed("gdb")) {
    CHECK(r["stacks"][0]["method"] == (eu_stack ? "eu-stack" : "gdb"));
    CHECK(r["stacks"][0]["text"].get<std::string>().find("ddprun_test_hang_here") !=
          std::string::npos);
  } else {
    CHECK(r["stacks"][0]["method"] == "proc");
  }
  CHECK(slurp(job.attempt(0) + "/hang_report.txt").find("--heartbeat-timeout=1") !=
        std::string::npos);
  // Which build wrote them: the report (both forms) and every event line.
  CHECK(r["ddprun_version"] == ddprun::base::version());
  CHECK(slurp(job.attempt(0) + "/hang_report.txt")
            .find(std::string("Reported by ddprun ") + ddprun::base::version() + ".\n") !=
        std::string::npos);
  for (const auto& e : job.events()) CHECK(e["ddprun_version"] == ddprun::base::version());
}

TEST_CASE("a SIGSTOPped worker is caught by its process state and the group restarts") {
  Job job;
  job.run({"--nproc-per-node=2", "--max-restarts=1", "--stuck-timeout=0.5"},
          {WATCHDOG_TEST_WORKER, "scenario", "stop"});
  check_recovered(job, job.attempt(1) + "/1/stdout.log");
  const auto r = job.report();
  CHECK(r["kind"] == "process_stopped");
  CHECK(r["rank"] == 1);
  REQUIRE(r["stacks"].size() == 1);
  // gdb or the kernel's view: either way the stopped thread is in there.
  const std::string text = r["stacks"][0]["text"];
  CHECK((text.find("scenario") != std::string::npos || text.find("state T") != std::string::npos));
}

TEST_CASE("a worker that goes silent is caught by the silence timeout and the group restarts") {
  Job job;
  // --stack-capture=proc: the kernel's view only, no debugger attached.
  job.run({"--nproc-per-node=2", "--max-restarts=1", "--silence-timeout=1", "--stuck-timeout=0",
           "--stack-capture=proc"},
          {WATCHDOG_TEST_WORKER, "scenario", "silent"});
  check_recovered(job, job.attempt(1) + "/1/stdout.log");
  const auto r = job.report();
  CHECK(r["kind"] == "silence_timeout");
  CHECK(r["rank"] == 1);
  REQUIRE(r["stacks"].size() == 1);
  CHECK(r["stacks"][0]["method"] == "proc");
  CHECK(r["stacks"][0]["text"].get<std::string>().find("watchdog_test_w") != std::string::npos);
}

TEST_CASE("the hang headline names the rank that stopped first, not its victim in all_reduce") {
  if (!tool_installed("eu-stack") && !tool_installed("gdb"))
    SKIP_TEST("neither eu-stack nor gdb is installed: native stacks cannot show the collective");
  Job job;
  const std::string marker = job.dir.path() + "/rank0_in_allreduce";
  job.run({"--nproc-per-node=2", "--heartbeat-timeout=1", "--heartbeat-grace=30"},
          {WATCHDOG_TEST_WORKER, "collective", marker});
  CAPTURE(job.console());
  CHECK(job.exit_code == 124);  // a freeze ended the job (docs/CONTRACTS.md)
  const auto r = job.report();
  // Rank 0 passed its deadline first (its last beat is older), but it waits
  // in all_reduce for rank 1, which stopped outside any collective.
  CHECK(r["rank"] == 0);
  CHECK(r["workers"][0]["step"] == 3);
  CHECK(r["workers"][1]["step"] == 3);
  CHECK(r["culprit_rank"] == 1);
  CHECK(r["in_collective_ranks"] == json::array({0}));
  CHECK(r["stacks"].size() == 2);
  CHECK(job.console().find("Hang detected in attempt 0: rank 1 stopped first (its stack is "
                           "outside any collective; rank(s) 0 wait inside one)") !=
        std::string::npos);
  CHECK(slurp(job.attempt(0) + "/hang_report.txt").find("Stopped first: rank 1") !=
        std::string::npos);
}

TEST_CASE("a Python worker blocked forever in dist.barrier() after its peer exited") {
  Job job;
  job.run({"--nproc-per-node=2", "--max-restarts=1", "--heartbeat-timeout=2",
           "--heartbeat-grace=60"},
          {std::string(WATCHDOG_SCRIPTS) + "/barrier_hang.py"});
  check_recovered(job, job.attempt(1) + "/0/stdout.log");
  const auto r = job.report();
  CHECK(r["kind"] == "heartbeat_timeout");
  CHECK(r["rank"] == 0);
  CHECK(r["workers"][1]["exited"] == true);
  REQUIRE(r["stacks"].size() == 1);
  // Dumped live by the worker (ddprun's stack signal) before the verdict:
  // no SIGABRT, nothing of faulthandler's on the console.
  CHECK(r["stacks"][0]["method"] == "python_faulthandler");
  const std::string tb = r["stacks"][0]["text"];
  CHECK(tb.find("Fatal Python error: Aborted") == std::string::npos);
  CHECK(job.console().find("Fatal Python error") == std::string::npos);
  CHECK(tb.find("wait_for_peer_in_barrier") != std::string::npos);
  CHECK(tb.find("distributed_c10d.py") != std::string::npos);
}

TEST_CASE("torch's FileTimerClient deadline is served and a missed one restarts the group") {
  Job job;
  job.run({"--nproc-per-node=1", "--max-restarts=1"}, {std::string(WATCHDOG_SCRIPTS) + "/file_timer_hang.py"},
          {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
  check_recovered(job, job.attempt(1) + "/0/stdout.log");
  const auto r = job.report();
  CHECK(r["kind"] == "torch_file_timer");
  CHECK(r["detail"].get<std::string>().find("train_step") != std::string::npos);
  REQUIRE(r["stacks"].size() == 1);
  CHECK(r["stacks"][0]["text"].get<std::string>().find("train_step_that_never_returns") !=
        std::string::npos);
}

TEST_CASE("workers that beat on time are never killed, even with every core busy") {
  // Two spinners keep both cores busy for the whole job.
  Child spin1({WATCHDOG_TEST_WORKER, "spin"}, {}, true), spin2({WATCHDOG_TEST_WORKER, "spin"}, {}, true);
  REQUIRE(spin1.wait_for_output("ready"));
  REQUIRE(spin2.wait_for_output("ready"));
  Job job;
  job.run({"--nproc-per-node=2", "--max-restarts=3", "--heartbeat-timeout=1",
           "--heartbeat-grace=30", "--silence-timeout=5"},
          {WATCHDOG_TEST_WORKER, "beat", "200", "10", "exit"});
  CAPTURE(job.console());
  CHECK(job.exit_code == 0);
  CHECK(job.event_names() == std::vector<std::string>{"start", "rendezvous", "done"});
}

TEST_CASE("a hang with no restarts left ends the job with the hang as the root cause") {
  Job job;
  // --stack-capture=none: the report is written without any stack.
  job.run({"--nproc-per-node=2", "--max-restarts=0", "--heartbeat-timeout=1",
           "--heartbeat-grace=30", "--stack-capture=none"},
          {WATCHDOG_TEST_WORKER, "scenario", "nobeat"});
  CHECK(job.report()["stacks"].empty());
  const std::string console = job.console();
  CAPTURE(console);
  CHECK(job.exit_code == 124);  // a freeze ended the job (docs/CONTRACTS.md)
  CHECK(console.find("root cause: Hang detected in attempt 0: rank 1") != std::string::npos);
  CHECK(console.find("hang_report.txt") != std::string::npos);
  const auto ev = job.events();
  CHECK(ev.back()["event"] == "done");
  CHECK(ev.back()["rule"] == "max_restarts");
}

TEST_CASE("an exit code listed in --no-restart-exit-codes stops the job at once") {
  Job job;
  // The test worker exits 2 on a usage error.
  job.run({"--nproc-per-node=1", "--max-restarts=3", "--no-restart-exit-codes=2,64"},
          {WATCHDOG_TEST_WORKER, "bogus-usage"});
  CHECK(job.exit_code == 2);
  const auto ev = job.events();
  REQUIRE(!ev.empty());
  CHECK(ev.back()["event"] == "done");
  CHECK(ev.back()["rule"] == "no_restart_exit_code");
  CHECK(job.console().find("--no-restart-exit-codes") != std::string::npos);
}

TEST_CASE("attempts that never get past the same step stop on the no-progress rule") {
  Job job;
  job.run({"--nproc-per-node=2", "--max-restarts=5", "--max-no-progress-restarts=1",
           "--heartbeat-timeout=0.5", "--heartbeat-grace=30", "--restart-backoff=0"},
          {WATCHDOG_TEST_WORKER, "scenario", "stall"});
  const std::string console = job.console();
  CAPTURE(console);
  CHECK(job.exit_code == 124);  // a freeze ended the job (docs/CONTRACTS.md)
  CHECK(job.event_names() == std::vector<std::string>{"start", "rendezvous", "hang_detected",
                                                      "restart", "rendezvous", "hang_detected",
                                                      "done"});
  const auto ev = job.events();
  CHECK(ev.back()["rule"] == "no_progress");
  CHECK(ev.back()["max_step"] == 5);
  CHECK(console.find("--max-no-progress-restarts=1") != std::string::npos);
}

TEST_CASE("the teardown after a worker failure is not reported as a hang") {
  Job job;
  // Rank 1 exits 1; rank 0 ignores SIGTERM and stops beating, so it lives on
  // for --term-timeout, well past --heartbeat-timeout.
  job.run({"--nproc-per-node=2", "--max-restarts=0", "--heartbeat-timeout=0.3",
           "--heartbeat-grace=30", "--term-timeout=2"},
          {WATCHDOG_TEST_WORKER, "scenario", "crash"});
  const std::string console = job.console();
  CAPTURE(console);
  CHECK(job.exit_code == 1);
  CHECK(console.find("failed with exit code 1") != std::string::npos);
  CHECK(console.find("Hang detected") == std::string::npos);
  CHECK(job.event_names() == std::vector<std::string>{"start", "rendezvous", "done"});
}

TEST_CASE("the teardown after ctrl-c is not reported as a hang") {
  TempDir dir;
  Child ddprun({DDPRUN_BIN, "--rdzv-id=wd", "--log-dir=" + dir.path() + "/logs",
                "--nproc-per-node=1", "--heartbeat-timeout=0.3", "--heartbeat-grace=30",
                "--term-timeout=2", WATCHDOG_TEST_WORKER, "deaf"},
               {}, /*capture_stdout=*/true, dir.path() + "/ddprun.stderr");
  REQUIRE(ddprun.wait_for_output("ready"));
  REQUIRE(::kill(ddprun.pid(), SIGINT) == 0);
  auto status = ddprun.wait_for(kJobDeadline);
  REQUIRE(status.has_value());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 128 + SIGINT);
  std::vector<std::string> names;
  std::ifstream in(ddprun::testing::run_folder(dir.path() + "/logs", "wd") + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto e = json::parse(line);
    // progress: the monitor's step samples (introspect/agent_hook.h), at its own pace.
    if (e["event"] != "worker_exit" && e["event"] != "progress") names.push_back(e["event"]);
  }
  CAPTURE(slurp(dir.path() + "/ddprun.stderr"));
  CHECK(names == std::vector<std::string>{"start", "rendezvous", "done"});
}

namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

const std::string kNativeOff = "freeze detection is off for ";

}  // namespace

// Polls `path` until it holds `text`; false once `deadline` passed.
bool file_shows(const std::string& path, const std::string& text, std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (slurp(path).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > until) return false;
    usleep(10 * 1000);
  }
  return true;
}

TEST_CASE("a native program that has not beaten when its notice is due is told once, then told "
          "when its first beat comes") {
  Job job;
  const std::string go = job.dir.path() + "/go";
  // The notice is due at the setup window's end (1 s here) or 10 s, the
  // earlier; both ranks stay quiet until the test saw it, then beat once.
  std::vector<std::string> argv = {DDPRUN_BIN,
                                   "--rdzv-id=wd",
                                   "--log-dir=" + job.dir.path() + "/logs",
                                   "--nproc-per-node=2",
                                   "--heartbeat-grace=1",
                                   WATCHDOG_TEST_WORKER,
                                   "quiet",
                                   go};
  const std::string err = job.dir.path() + "/ddprun.stderr";
  Child ddprun(argv, {}, false, err, job.dir.path() + "/ddprun.stdout");
  const bool told = file_shows(err, kNativeOff, std::chrono::seconds(30));
  { std::ofstream(go).put('1'); }
  auto status = ddprun.wait_for(kJobDeadline);
  REQUIRE_MESSAGE(status.has_value(), "ddprun did not finish within its deadline");
  const std::string console = job.console();
  CAPTURE(console);
  CHECK(told);
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
  CHECK(count_of(console, kNativeOff + std::string(WATCHDOG_TEST_WORKER) +
                              ": no rank beat in its first 1 s") == 1);
  CHECK(console.find("watchdog/heartbeat.h") != std::string::npos);
  CHECK(console.find("--silence-timeout=S watches its output") != std::string::npos);
  CHECK(count_of(console, "freeze detection is on for " + std::string(WATCHDOG_TEST_WORKER) +
                              ": rank ") == 1);
  CHECK(console.find(kNativeOff) < console.find("freeze detection is on for "));
  const auto names = job.event_names();
  CHECK(names == std::vector<std::string>{"start", "rendezvous", "detection_off", "done"});
}

TEST_CASE("a native program that beats is never told that freeze detection is off") {
  Job job;
  // Beats for 2 s, past the notice's due time (the 1 s setup window).
  job.run({"--heartbeat-grace=1"}, {WATCHDOG_TEST_WORKER, "beat", "100", "20", "exit"});
  const std::string console = job.console();
  CAPTURE(console);
  CHECK(job.exit_code == 0);
  CHECK(console.find(kNativeOff) == std::string::npos);
  CHECK(console.find("freeze detection is on for ") == std::string::npos);
  const auto names = job.event_names();
  CHECK(std::count(names.begin(), names.end(), "detection_off") == 0);
}

TEST_CASE("no notice where it does not apply: detection off, fixed or output-watched") {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--hang-timeout=0"}, {"--heartbeat-timeout=5"},
        {"--hang-timeout=5"}, {"--silence-timeout=30"}}) {
    Job job;
    job.run(flags, {WATCHDOG_TEST_WORKER, "beat", "2", "10", "exit"});
    CAPTURE(flags[0]);
    CAPTURE(job.console());
    CHECK(job.exit_code == 0);
    CHECK(job.console().find(kNativeOff) == std::string::npos);
  }
}

TEST_CASE("a Python worker, named by script or by interpreter, gets the bootstrap and no notice") {
  // No torch needed: the script reports whether ddprun's import hook is in.
  const std::string script = std::string(WATCHDOG_SCRIPTS) + "/autobeat_no_torch.py";
  for (const std::vector<std::string>& program :
       {std::vector<std::string>{script}, {test_python(), script}, {"python3", script}}) {
    Job job;
    job.run({}, program);
    CAPTURE(program[0]);
    CAPTURE(job.console());
    CHECK(job.exit_code == 0);
    CHECK(slurp(job.attempt(0) + "/0/stdout.log").find("hook=True") != std::string::npos);
    CHECK(job.console().find(kNativeOff) == std::string::npos);
  }
}

// Named without "Python": torch2.watchdog.integration runs *Python* cases,
// and this one's skip (no py-spy) would skip that whole entry.
TEST_CASE("py-spy: a worker started with -I (no bootstrap, no faulthandler) has its stack "
          "in the hang report, read from outside") {
  if (!ddprun::testing::py_spy_available())
    SKIP_TEST(std::string("no py-spy in ") + PYTOOLS_BIN + " or on PATH (scripts/setup-pytools.sh)");
  Job job;
  const std::string script = std::string(WATCHDOG_SCRIPTS) + "/isolated_hang.py";
  // -I ignores PYTHONPATH and PYTHONFAULTHANDLER: no automatic beats, so the
  // silence of its output is the hang; SIGABRT would kill it silently.
  job.run({"--nproc-per-node=1", "--max-restarts=0", "--silence-timeout=2"},
          {test_python(), "-I", script}, {{"PATH", ddprun::testing::path_with_python_tools()}});
  CAPTURE(job.console());
  CHECK(job.exit_code == 124);  // a freeze ended the job (docs/CONTRACTS.md)
  const auto r = job.report();
  CAPTURE(r.dump(2));
  const json* py = nullptr;
  for (const auto& s : r["stacks"])
    if (s["method"] == "py-spy") py = &s;
  REQUIRE(py != nullptr);
  CHECK((*py)["rank"] == 0);
  const std::string text = (*py)["text"];
  // The function and its file:line (the time.sleep line of the script).
  CHECK(text.find("wait_here_forever (") != std::string::npos);
  CHECK(text.find("isolated_hang.py:9)") != std::string::npos);
  // The native stack is still there, after the Python one.
  CHECK(r["stacks"].size() == 2);
  CHECK(slurp(job.attempt(0) + "/hang_report.txt").find("wait_here_forever") != std::string::npos);
}

TEST_CASE("py-spy: where py-spy is missing, pystack reads the frames and the stack says so") {
  const std::string pystack = std::string(PYTOOLS_BIN) + "/pystack";
  if (::access(pystack.c_str(), X_OK) != 0)
    SKIP_TEST("no " + pystack + " (scripts/setup-pytools.sh)");
  Child child({test_python(), "-c",
               "import time\n"
               "def pystack_finds_me():\n"
               "    print('ready', flush=True)\n"
               "    time.sleep(60)\n"
               "pystack_finds_me()\n"},
              {}, true);
  REQUIRE(child.wait_for_output("ready"));
  TempDir dir;
  ddprun::watchdog::StackCaptureOptions o;
  o.py_spy.clear();  // as if not installed
  o.pystack = pystack;
  const auto c = ddprun::watchdog::capture_python_stack(child.pid(), 3, dir.path(), o);
  CAPTURE(c.text);
  CAPTURE(c.note);
  CHECK(c.method == ddprun::watchdog::StackMethod::kPyStack);
  CHECK(c.text.find("pystack_finds_me") != std::string::npos);
  CHECK(c.path == dir.path() + "/stack_rank3_python.txt");
  CHECK(slurp(c.path) == c.text);
}
