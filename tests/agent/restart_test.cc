// Failures tear the whole group down and restart it, up to --max-restarts.
#include <doctest/doctest.h>
#include <signal.h>

#include "tests/agent/ddprun_process.h"

using namespace ddprun::testing;

TEST_CASE("a crashed worker restarts the whole group with the count incremented") {
  auto r = run_ddprun({"--nproc-per-node=2", "--max-restarts=3", "--term-timeout=5", TEST_WORKER,
                       "crash-first", "1", "3"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  // Attempt 1 started both ranks again with TORCHELASTIC_RESTART_COUNT=1;
  // rank 0 of attempt 0 blocks forever, so the job only ends because the
  // agent stopped it.
  CHECK(lines_with(r.out, "[default0]:start rank=0 restart=1").size() == 1);
  CHECK(lines_with(r.out, "[default1]:start rank=1 restart=1").size() == 1);
  CHECK(count_of(r.out, "restart=2") == 0);
  CHECK(count_of(r.err, "rank 1 (local rank 1, pid ") == 1);
  CHECK(count_of(r.err, "failed with exit code 3; restarting the group (restart 1 of 3)") == 1);
}

TEST_CASE("restarts stop at the limit with the root cause's status and a summary") {
  auto r = run_ddprun({"--nproc-per-node=2", "--max-restarts=2", "--term-timeout=5", TEST_WORKER,
                       "fail", "1", "7"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 7);
  for (int restart = 0; restart <= 2; ++restart)
    CHECK(count_of(r.out, "[default1]:start rank=1 restart=" + std::to_string(restart)) == 1);
  CHECK(count_of(r.out, "restart=3") == 0);
  CHECK(count_of(r.err, "attempt 2 failed on") == 1);
  CHECK(count_of(r.err, "--max-restarts=2") == 1);  // the policy says why it stopped
  CHECK(count_of(r.err, "root cause: rank 1 (local rank 1, pid ") == 1);
  CHECK(count_of(r.err, "failed with exit code 7") == 3);
  // The other rank was stopped by the teardown and is listed with it.
  CHECK(count_of(r.err, "rank 0 (local rank 0, pid ") == 1);
  CHECK(count_of(r.err, "): signal SIGTERM") == 1);
}

TEST_CASE("death by signal is named and ddprun exits 128+N") {
  DdprunProcess p({"--nproc-per-node=2", "--term-timeout=5", TEST_WORKER, "block"},
                  ddprun::testing::sanitizers_leave_segv());
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return count_of(out, "ready") == 2; },
                            Seconds(20)));
  auto ready = lines_with(p.out(), "[default1]:ready");
  REQUIRE(ready.size() == 1);
  REQUIRE(kill(static_cast<pid_t>(field(ready[0], "pid")), SIGSEGV) == 0);
  auto r = p.finish(Seconds(30));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 128 + SIGSEGV);
  CHECK(count_of(r.err, "root cause: rank 1 (local rank 1, pid ") == 1);
  CHECK(count_of(r.err, "failed with signal SIGSEGV") == 1);
}

TEST_CASE("the worker's error file appears in the summary with its traceback") {
  auto r = run_ddprun({"--nproc-per-node=1", TEST_WORKER, "error-file", "loss is NaN"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 1);
  CHECK(count_of(r.err, "  error: loss is NaN\n") == 1);
  CHECK(count_of(r.err, "  traceback:\n    Traceback (most recent call last):\n") == 1);
  CHECK(count_of(r.err, "    RuntimeError: loss is NaN\n") == 1);
}

TEST_CASE("a program that cannot be executed is one clear line, not a crash loop") {
  auto r = run_ddprun({"--nproc-per-node=2", "--max-restarts=5", "/nonexistent/train"});
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 127);
  CHECK(r.err == "ddprun: cannot execute '/nonexistent/train': No such file or directory\n");
  r = run_ddprun({"--nproc-per-node=2", "no-such-program-xyz"});
  CHECK(r.status == 127);
  CHECK(r.err == "ddprun: cannot execute 'no-such-program-xyz': not found in PATH\n");
}
