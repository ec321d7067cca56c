/* The trivial native worker of bench/launch_bench.py, the same program under
 * ddprun and torchrun (--no_python). On start it appends
 * "<restart> <rank> <CLOCK_MONOTONIC ns> start" to $BENCH_TS with one
 * O_APPEND write.
 *   launch: exit 0.
 *   crash:  on restart 0, rank 1 waits until both ranks have started, writes
 *           "... crash" and exits 1 while rank 0 blocks; later attempts exit 0. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v ? atoi(v) : -1;
}

static void record(int fd, int restart, int rank, const char* what) {
  char line[128];
  int n = snprintf(line, sizeof line, "%d %d %lld %s\n", restart, rank, now_ns(), what);
  if (write(fd, line, (size_t)n) != n) _exit(3);
}

static int count_lines(const char* path) {
  char buf[4096];
  int fd = open(path, O_RDONLY), n = 0;
  ssize_t got;
  if (fd < 0) return 0;
  while ((got = read(fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < got; ++i) n += buf[i] == '\n';
  close(fd);
  return n;
}

int main(int argc, char** argv) {
  const char* path = getenv("BENCH_TS");
  int rank = env_int("RANK"), restart = env_int("TORCHELASTIC_RESTART_COUNT");
  int fd = path ? open(path, O_WRONLY | O_APPEND | O_CREAT, 0644) : -1;
  if (fd < 0 || argc < 2) return 2;
  record(fd, restart, rank, "start");
  if (strcmp(argv[1], "crash") != 0 || restart != 0) return 0;
  if (rank != 1) for (;;) pause();
  while (count_lines(path) < 2) usleep(200); /* rank 0 of attempt 0 has started */
  record(fd, restart, rank, "crash");
  return 1;
}
