// Restart policy rules, the JSON-lines event log and the hang report files.
#include <doctest/doctest.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/clock.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/event_log.h"
#include "watchdog/hang_report.h"
#include "watchdog/restart_rules.h"

namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using wd::testing::TempDir;

namespace {

// An attempt that failed after `restarts` restarts of the job.
wd::AttemptOutcome failed(int restarts, int64_t step, std::vector<int> codes = {1},
                          bool hang = false) {
  wd::AttemptOutcome o;
  o.restart_count = restarts;
  o.exit_codes = std::move(codes);
  o.max_step = step;
  o.hang = hang;
  return o;
}

}  // namespace

TEST_CASE("first restart is immediate, then back-off doubles and is capped") {
  wd::RestartRulesOptions opt;
  opt.max_restarts = 6;
  opt.backoff_initial = 100ms;
  opt.backoff_max = 500ms;
  wd::RestartRules p(opt);
  std::vector<long> delays;
  for (int i = 0; i < 6; ++i) {
    auto d = p.on_attempt_end(failed(i, i));
    REQUIRE(d.restart);
    delays.push_back(d.delay.count());
  }
  CHECK(delays == std::vector<long>{0, 100, 200, 400, 500, 500});
  auto last = p.on_attempt_end(failed(6, 7));
  CHECK_FALSE(last.restart);
  CHECK(last.rule == wd::StopRule::kMaxRestarts);
  CHECK(last.reason.find("--max-restarts=6") != std::string::npos);
}

TEST_CASE("a no-restart exit code stops at once, even with restarts left") {
  wd::RestartRulesOptions opt;
  opt.max_restarts = 5;
  opt.no_restart_exit_codes = {2, 64};
  wd::RestartRules p(opt);
  CHECK(p.on_attempt_end(failed(0, -1, {1})).restart);
  auto d = p.on_attempt_end(failed(1, -1, {0, 64}));
  CHECK_FALSE(d.restart);
  CHECK(d.rule == wd::StopRule::kNoRestartExitCode);
  CHECK(d.reason.find("64") != std::string::npos);
}

TEST_CASE("no-progress rule stops after K attempts without a higher step") {
  wd::RestartRulesOptions opt;
  opt.max_restarts = 100;
  opt.max_no_progress_restarts = 2;
  wd::RestartRules p(opt);
  CHECK(p.on_attempt_end(failed(0, 50, {}, true)).restart);  // progress
  CHECK(p.on_attempt_end(failed(1, 80, {}, true)).restart);  // progress
  CHECK(p.on_attempt_end(failed(2, 80, {}, true)).restart);  // streak 1
  auto d = p.on_attempt_end(failed(3, -1, {}, true));     // streak 2: stop
  CHECK_FALSE(d.restart);
  CHECK(d.rule == wd::StopRule::kNoProgress);
  CHECK(d.reason.find("step 80") != std::string::npos);
  CHECK(d.reason.find("--max-no-progress-restarts=2") != std::string::npos);
}

TEST_CASE("no-progress rule stays inactive when no attempt reports steps") {
  wd::RestartRulesOptions opt;
  opt.max_restarts = 3;
  opt.max_no_progress_restarts = 1;
  wd::RestartRules p(opt);
  for (int i = 0; i < 3; ++i) CHECK(p.on_attempt_end(failed(i, -1)).restart);
  CHECK(p.on_attempt_end(failed(3, -1)).rule == wd::StopRule::kMaxRestarts);
  wd::RestartRules ok(opt);
  wd::AttemptOutcome success;
  success.succeeded = true;
  CHECK(ok.on_attempt_end(success).rule == wd::StopRule::kSucceeded);
}

TEST_CASE("event log lines are JSON with time, attempt, ranks and reason") {
  TempDir dir;
  const std::string path = dir.path() + "/events.jsonl";
  const time_t before = time(nullptr);
  {
    wd::EventLog log(path);
    log.write("start", 0, {}, "2 workers");
    log.write("hang_detected", 0, {1}, "no heartbeat for 2.00 s \"quoted\"\n",
              {{"kind", "heartbeat_timeout"}});
    log.write("restart", 1, {0, 1}, "restart 1 of 3");
  }
  wd::EventLog again(path);  // appends
  again.write("done", 1, {0, 1}, "succeeded");
  REQUIRE(again.flush(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 4);
  CHECK(lines[0]["event"] == "start");
  CHECK(lines[1]["event"] == "hang_detected");
  CHECK(lines[1]["ranks"] == nlohmann::json::array({1}));
  CHECK(lines[1]["kind"] == "heartbeat_timeout");
  CHECK(lines[2]["attempt"] == 1);
  CHECK(lines[3]["event"] == "done");
  CHECK(lines[0]["time"].get<std::string>().back() == 'Z');
  // The UTC calendar time of the write (computed without gmtime_r), between
  // the clock's readings before and after it.
  std::tm tm{};
  int usec = -1;
  REQUIRE(sscanf(lines[0]["time"].get<std::string>().c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6dZ",
                 &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec,
                 &usec) == 7);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const time_t written = timegm(&tm);
  CHECK(written >= before);
  CHECK(written <= time(nullptr));
  CHECK(usec >= 0);
  CHECK(lines[3]["monotonic_s"].get<double>() >= lines[0]["monotonic_s"].get<double>());
  // The error names the first folder that is missing (base::SafeDir walks the path).
  const std::string missing = dir.path() + "/no: No such file or directory";
  CHECK_THROWS_WITH(wd::EventLog(dir.path() + "/no/such/dir/events.jsonl"),
                    doctest::Contains(missing.c_str()));
}

TEST_CASE("hang report names the stalled rank, its step, and the flag to change") {
  TempDir dir;
  ddprun::base::ManualClock clock;
  wd::WatchdogOptions opt;
  opt.heartbeat_timeout = 200ms;
  opt.heartbeat_grace = 5s;
  opt.stuck_timeout = 0ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(clock, opt, [&](const wd::HangEvent& e) { hang = e; });
  const pid_t a = 4242, b = 4243;  // never looked up: no process-state detector
  dog.add_worker(0, 0, a);
  dog.add_worker(1, 1, b);
  dog.on_beat(wd::testing::beat(0, 9, clock.now()));
  dog.on_beat(wd::testing::beat(1, 8, clock.now()));
  clock.advance(200ms);
  REQUIRE(hang);
  auto report = wd::make_hang_report(dog, *hang, 2);
  wd::StackCapture s;
  s.global_rank = 1;
  s.pid = b;
  s.method = wd::StackMethod::kProc;
  s.path = dir.path() + "/stack_rank1.txt";
  s.text = "thread 1 state S\n\xff bad utf8";
  report.stacks.push_back(s);
  report.write(dir.path());
  std::ifstream in(dir.path() + "/hang_report.json");
  const auto j = nlohmann::json::parse(in);
  CHECK(j["attempt"] == 2);
  CHECK(j["kind"] == "heartbeat_timeout");
  CHECK(j["suspect_ranks"] == nlohmann::json::array({1}));
  CHECK(j["workers"][1]["step"] == 8);
  CHECK(j["stacks"][0]["path"] == s.path);
  CHECK(j["flags_to_change"][0].get<std::string>().find("--heartbeat-timeout=0.2") == 0);
  std::ifstream txt(dir.path() + "/hang_report.txt");
  std::string text((std::istreambuf_iterator<char>(txt)), {});
  CHECK(text.find("Hang in attempt 2") == 0);
  CHECK(text.find("thread 1 state S") != std::string::npos);
  const auto summary = report.summary(dir.path());
  // Rank 0's deadline passed first (same beat time, lower rank), but rank 1
  // is behind in steps: the culprit, named first, in the JSON too.
  CHECK(summary.find("Hang detected in attempt 2: rank 1 stopped first") == 0);
  CHECK(j["culprit_rank"] == 1);
  CHECK(summary.find("--heartbeat-timeout") != std::string::npos);
}

TEST_CASE("the rank outside a collective is the culprit, ranks waiting in one are victims") {
  CHECK(wd::stack_in_collective(
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 3152 "
      "in barrier\n"));
  CHECK(wd::stack_in_collective("#3 0x00 in c10d::ProcessGroupGloo::allreduce(...)\n"));
  CHECK(wd::stack_in_collective("#1 ddprun::trainer::ShmCommunicator::allreduce_mean_async\n"));
  // train --hang-at-step: the ranks waiting for the one that stopped.
  CHECK(wd::stack_in_collective(
      "#0 0x00007f705351f829 syscall\n"
      "#1 0x0000558f5a306b17 ddprun::trainer::(anonymous namespace)::ShmCommunicator::"
      "complete_through(unsigned long)\n"
      "#2 0x0000558f5a2f91e7 ddprun::trainer::DistributedDataParallel::finish_backward()\n"));
  CHECK_FALSE(wd::stack_in_collective(
      "#0 0x00007f7126cf1df2 pause\n"
      "#1 0x000055ea762b640d ddprun::trainer::run_training(ddprun::trainer::TrainOptions const&)\n"));
  CHECK_FALSE(wd::stack_in_collective("  File \"train.py\", line 40 in load_batch\n"));

  wd::HangReport r;
  r.workers.resize(3);
  const auto t0 = wd::Clock::now();
  for (int i = 0; i < 3; ++i) {
    r.workers[i].global_rank = i;
    r.workers[i].beats = 4;
    r.workers[i].step = 3;
    r.workers[i].last_beat = t0 + std::chrono::milliseconds(10 * i);
  }
  auto stack = [](int rank, const std::string& text) {
    wd::StackCapture s;
    s.global_rank = rank;
    s.text = text;
    return s;
  };
  r.event.global_rank = 0;
  r.stacks = {stack(0, "in all_reduce"), stack(1, "in load_batch"), stack(2, "in barrier")};
  r.find_culprit();
  CHECK(r.stack_culprit == 1);
  CHECK(r.in_collective == std::vector<int>{0, 2});
  CHECK(r.culprit == 1);  // the stacks' verdict, before any headline, blames
  CHECK(r.summary().find("Hang detected in attempt 0: rank 1 stopped first (its stack") == 0);
  // Two ranks outside: the one whose last beat is oldest stopped first.
  r.stacks = {stack(0, "in all_reduce"), stack(1, "in load_batch"), stack(2, "in step")};
  r.find_culprit();
  CHECK(r.stack_culprit == 1);
  r.workers[2].step = 2;  // behind in steps wins over beat times
  r.find_culprit();
  CHECK(r.stack_culprit == 2);
  // Every stack in a collective, or none: the stacks cannot tell.
  r.stacks = {stack(0, "in all_reduce"), stack(1, "in barrier")};
  r.find_culprit();
  CHECK(r.stack_culprit == -1);
  r.stacks = {stack(0, "in step"), stack(1, "")};
  r.find_culprit();
  CHECK(r.stack_culprit == -1);
  r.culprit = 0;
  r.culprit_by_stacks = false;
  CHECK(r.summary().find("Hang detected in attempt 0: rank 0 (pid 0)") == 0);
  // Tracebacks that arrive after the headline never re-blame.
  r.stacks = {stack(0, "in all_reduce"), stack(1, "in load_batch")};
  r.find_culprit(false);
  CHECK(r.stack_culprit == 1);
  CHECK(r.culprit == 0);
  // A rank's Python stack decides over its native one, which shows the
  // communicator's idle threads on every Gloo rank.
  auto with = [&](int rank, wd::StackMethod m, const std::string& text) {
    auto s = stack(rank, text);
    s.method = m;
    return s;
  };
  r.stacks = {with(0, wd::StackMethod::kPySpy, "    all_reduce (torch/distributed/distributed_c10d.py:1)"),
              with(0, wd::StackMethod::kEuStack, "#2 c10d::ProcessGroupGloo::runLoop(int)"),
              with(1, wd::StackMethod::kPySpy, "    hang_in_python (stuck.py:13)"),
              with(1, wd::StackMethod::kEuStack, "#2 c10d::ProcessGroupGloo::runLoop(int)")};
  r.find_culprit();
  CHECK(r.stack_culprit == 1);
  CHECK(r.in_collective == std::vector<int>{0});
  // Native only, every rank with Gloo's idle threads (train --backend gloo
  // --hang-at-step): the main threads tell, in eu-stack's and gdb's layout.
  auto native = [&](int rank, pid_t pid, const std::string& text) {
    auto s = with(rank, wd::StackMethod::kEuStack, text);
    s.pid = pid;
    return s;
  };
  const std::string gloo_idle =
      "TID 9001:\n#0 epoll_wait\n#1 gloo::transport::tcp::Loop::run()\n"
      "TID 9002:\n#2 c10d::ProcessGroupGloo::runLoop(int)\n";
  r.stacks = {native(0, 100, "PID 100 - process\nTID 100:\n#0 pthread_cond_wait\n"
                             "#1 c10d::Work::wait()\n"
                             "#2 ddprun::trainer::DistributedDataParallel::finish_backward()\n" +
                                 gloo_idle),
              native(1, 101, "PID 101 - process\nTID 101:\n#0 pause\n"
                             "#1 ddprun::trainer::run_training()\n" + gloo_idle),
              native(2, 102, "Thread 2 (Thread 0x7f (LWP 9003) \"pt_main\"):\n"
                             "#0 c10d::ProcessGroupGloo::runLoop(int)\n"
                             "Thread 1 (Thread 0x7e (LWP 102) \"train\"):\n"
                             "#0 ddprun::trainer::ShmCommunicator::complete_through()\n")};
  r.find_culprit();
  CHECK(r.stack_culprit == 1);
  CHECK(r.in_collective == std::vector<int>{0, 2});
  CHECK(wd::main_thread_stack("no threads here", 100) == "no threads here");
  CHECK(wd::main_thread_stack("TID 5:\n#0 x\n", 100) == "TID 5:\n#0 x\n");  // not found: all
}
