// Native worker for the introspect tests: beats a step every 50 ms through
// heartbeat.h, waiting in introspect_test_wait_here between steps, until the
// file named by argv[1] exists; prints "ready" after its second beat and
// "done" at the end.
#include <sys/stat.h>
#include <time.h>

#include <cstdio>

#include "watchdog/heartbeat.h"

extern "C" __attribute__((noinline, used)) void introspect_test_wait_here() {
  timespec ts{0, 50 * 1000 * 1000};
  ::nanosleep(&ts, nullptr);  // the step's "work"; `ddprun stacks` finds it here
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: introspect_native_worker <until-file>\n");
    return 2;
  }
  struct stat st;
  long step = 0;
  while (::stat(argv[1], &st) != 0) {
    ddprun::watchdog::beat(step);
    if (step++ == 1) std::printf("ready\n"), std::fflush(stdout);
    introspect_test_wait_here();
  }
  std::printf("done\n");
  return 0;
}
