// Native worker for the watchdog tests: beats through heartbeat.h and then
// misbehaves in a chosen way. Usage:
//   watchdog_test_worker beat <count> <interval_ms> <then>
// where <then> is "exit" (exit 0), "hang" (stop beating, block in
// ddprun_test_hang_here forever) or "print" (print forever, never beat).
//   watchdog_test_worker hang        (print "ready", block forever)
//   watchdog_test_worker spin        (print "ready", burn CPU forever)
//   watchdog_test_worker dstate      (print "ready", sit in state D forever)
//   watchdog_test_worker deaf        (beat until SIGINT, ignore SIGTERM)
//   watchdog_test_worker scenario nobeat|stop|silent|stall|crash   (under ddprun)
//   watchdog_test_worker collective <marker file>   (under ddprun, 2 ranks)
//   watchdog_test_worker sections    (sections through heartbeat.h, then exit 0)
// "ready\n" on stdout marks the moment the worker entered its final state.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "watchdog/heartbeat.h"

extern "C" __attribute__((noinline, used)) void ddprun_test_hang_here() {
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) ::pause();  // what a worker stuck in a collective looks like
}

// Under ddprun: in attempt 0, rank 1 misbehaves (`how`) while rank 0 keeps
// beating and printing like a healthy peer; in later attempts every rank
// beats a few steps, prints "done" and exits 0.
int scenario(const char* how) {
  const char* rc = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* rank = std::getenv("RANK");
  // "stall": every attempt hangs the same way (rank 1 at step 2, rank 0 at
  // step 5), so no attempt gets further than the one before.
  const bool stall = std::strcmp(how, "stall") == 0;
  const bool crash = std::strcmp(how, "crash") == 0;
  const bool first = stall || crash || rc == nullptr || std::strcmp(rc, "0") == 0;
  const bool culprit = rank != nullptr && std::strcmp(rank, "1") == 0;
  for (int64_t step = 0;; ++step) {
    ddprun::watchdog::beat(step);
    std::printf("step %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
    if (stall && !culprit && step == 5) ddprun_test_hang_here();
    // "crash": rank 1 fails; rank 0 ignores SIGTERM and goes quiet, so the
    // teardown has to wait for --term-timeout.
    if (crash && culprit && step == 2) return 1;
    if (crash && !culprit && step == 0) ::signal(SIGTERM, SIG_IGN);
    if (crash && !culprit && step == 5) ddprun_test_hang_here();
    if (!first && step == 4) break;
    if (first && culprit && step == 2) {
      if (std::strcmp(how, "stop") == 0) ::raise(SIGSTOP);
      ddprun_test_hang_here();  // nobeat, silent: alive, no beats, no output
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("done\n");
  return 0;
}

// Sends, in order: ss checkpoint (the nested start and end of the same name
// are not sent), ss my_eval (its space made '_'), se my_eval, se checkpoint,
// then hb 7 from after the guard's scope that ended on an exception.
int sections() {
  try {
    ddprun::watchdog::Section outer("checkpoint");
    ddprun::watchdog::start_section("checkpoint");
    ddprun::watchdog::end_section("checkpoint");
    ddprun::watchdog::Section eval("my eval");
    throw 1;
  } catch (int) {
  }
  ddprun::watchdog::end_section("never started");
  ddprun::watchdog::beat(7);
  return 0;
}

// A victim: what a rank blocked in all_reduce for a peer looks like.
extern "C" __attribute__((noinline, used)) void ddprun_test_allreduce_wait(const char* marker) {
  if (FILE* f = std::fopen(marker, "w")) std::fclose(f);
  for (;;) ::pause();
}

// Rank 1 stops outside any collective; rank 0, its victim, waits in
// "all_reduce" and beats last BEFORE rank 1 does, so rank 0 passes its
// heartbeat deadline first. Both stop at step 3.
int collective(const char* marker) {
  const char* rank = std::getenv("RANK");
  const bool culprit = rank != nullptr && std::strcmp(rank, "1") == 0;
  for (int64_t step = 0; step <= 3; ++step) {
    ddprun::watchdog::beat(step);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!culprit) ddprun_test_allreduce_wait(marker);
  while (::access(marker, F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ddprun::watchdog::beat(3);  // still computing step 3 after rank 0 went to wait
  ddprun_test_hang_here();
  return 0;
}

static volatile sig_atomic_t g_interrupted = 0;

// Beats until SIGINT, then goes quiet; ignores SIGTERM, so only SIGKILL
// (after ddprun's --term-timeout) ends it.
int deaf() {
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGINT, [](int) { g_interrupted = 1; });
  std::printf("ready\n");
  std::fflush(stdout);
  for (int64_t step = 0;; ++step) {
    if (!g_interrupted) ddprun::watchdog::beat(step);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "deaf") == 0) return deaf();
  if (argc >= 2 && std::strcmp(argv[1], "sections") == 0) return sections();
  if (argc >= 2 && std::strcmp(argv[1], "forward") == 0) {
    ddprun::watchdog::HeartbeatClient client;
    client.forward();
    client.beat(3);
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "hang") == 0) ddprun_test_hang_here();
  if (argc >= 3 && std::strcmp(argv[1], "scenario") == 0) return scenario(argv[2]);
  if (argc >= 3 && std::strcmp(argv[1], "collective") == 0) return collective(argv[2]);
  if (argc >= 2 && std::strcmp(argv[1], "dstate") == 0) {
    // A vfork parent waits in uninterruptible (killable) sleep, state D,
    // until the child execs or exits; this child never does.
    std::printf("ready\n");
    std::fflush(stdout);
    if (::vfork() == 0) {
      for (;;) ::pause();
    }
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "spin") == 0) {
    std::printf("ready\n");
    std::fflush(stdout);
    for (volatile uint64_t x = 0;; x = x + 1) {
    }
  }
  if (argc >= 4 && std::strcmp(argv[1], "until") == 0) {
    // Prints "beating" once, then beats silently every <interval_ms> until
    // <file> exists, then exits 0: a healthy worker that needs the agent
    // for nothing but its heartbeats.
    std::printf("beating\n");
    std::fflush(stdout);
    const auto interval = std::chrono::milliseconds(std::atol(argv[3]));
    for (int64_t step = 0; ::access(argv[2], F_OK) != 0; ++step) {
      ddprun::watchdog::beat(step);
      std::this_thread::sleep_for(interval);  // the "training step"
    }
    return 0;
  }
  if (argc >= 3 && std::strcmp(argv[1], "quiet") == 0) {
    // No beat until <file> exists, then one beat and exit 0: a native
    // program with a long setup (the test makes the file when it is ready).
    while (::access(argv[2], F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ddprun::watchdog::beat(0);
    return 0;
  }
  if (argc < 5 || std::strcmp(argv[1], "beat") != 0) {
    std::fprintf(stderr, "usage: %s beat <count> <interval_ms> exit|hang|print | hang | quiet <file>\n", argv[0]);
    return 2;
  }
  const long count = std::atol(argv[2]);
  const auto interval = std::chrono::milliseconds(std::atol(argv[3]));
  for (long step = 0; step < count; ++step) {
    ddprun::watchdog::beat(step);
    std::this_thread::sleep_for(interval);  // the "training step"
  }
  if (std::strcmp(argv[4], "hang") == 0) ddprun_test_hang_here();
  if (std::strcmp(argv[4], "print") == 0) {
    std::printf("ready\n");
    for (;;) {
      std::printf("still printing\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(interval);
    }
  }
  return 0;
}
