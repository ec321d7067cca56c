// Worker for bench/watchdog_bench.py. Records CLOCK_MONOTONIC on entry in
// $BENCH_DIR/start_<attempt>_<rank>; beats every 10 ms. In attempt 0 rank 1
// stops after 20 beats (its last send time goes to $BENCH_DIR/lastbeat) and
// blocks forever while staying alive; rank 0 keeps beating. Later attempts
// beat 5 times and exit 0.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "watchdog/heartbeat.h"

static long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void record(const std::string& name, long long ns) {
  const char* dir = std::getenv("BENCH_DIR");
  if (!dir) return;
  const std::string tmp = std::string(dir) + "/." + name, final_path = std::string(dir) + "/" + name;
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%lld\n", ns);
    std::fclose(f);
    std::rename(tmp.c_str(), final_path.c_str());  // readers never see half a number
  }
}

int main() {
  const long long start = now_ns();
  const char* a = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* r = std::getenv("RANK");
  const std::string attempt = a ? a : "0", rank = r ? r : "0";
  record("start_" + attempt + "_" + rank, start);
  const timespec step{0, 10 * 1000 * 1000};
  for (long long i = 0;; ++i) {
    ddprun::watchdog::beat(i);
    if (attempt != "0" && i == 4) return 0;
    if (attempt == "0" && rank == "1" && i == 19) {
      record("lastbeat", now_ns());
      for (;;) pause();
    }
    nanosleep(&step, nullptr);
  }
}
