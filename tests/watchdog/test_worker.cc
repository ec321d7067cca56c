// Native worker for the watchdog tests: beats through heartbeat.h and then
// misbehaves in a chosen way. Usage:
//   watchdog_test_worker beat <count> <interval_ms> <then>
// where <then> is "exit" (exit 0), "hang" (stop beating, block in
// ddprun_test_hang_here forever) or "print" (print forever, never beat).
//   watchdog_test_worker hang        (print "ready", block forever)
// "ready\n" on stdout marks the moment the worker entered its final state.
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

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "hang") == 0) ddprun_test_hang_here();
  if (argc < 5 || std::strcmp(argv[1], "beat") != 0) {
    std::fprintf(stderr, "usage: %s beat <count> <interval_ms> exit|hang|print | hang\n", argv[0]);
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
