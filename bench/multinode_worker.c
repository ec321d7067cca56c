/* The native worker of bench/multinode_bench.py, the same program under
 * ddprun and torchrun (--no_python). On start it appends
 * "<restart> <rank> <CLOCK_MONOTONIC ns> start" to $BENCH_TS with one
 * O_APPEND write (one file shared by every namespace).
 *   launch: exit 0.
 *   wait:   exit 0 once $BENCH_STOP exists (inotify; 60 s deadline, exit 3).
 *   fifo:   exit 0 at the end of file of $BENCH_STOP, a FIFO whose write end
 *           the bench holds open from before the agents start until it
 *           wants every worker gone (bench/agents_scale.py): no inotify
 *           instance a worker (fs.inotify.max_user_instances is 128 by
 *           default, and a 256-node run then waited out the deadline). */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char** argv) {
  long long t = now_ns();
  const char* ts = getenv("BENCH_TS");
  const char* restart = getenv("TORCHELASTIC_RESTART_COUNT");
  const char* rank = getenv("RANK");
  if (!ts || !restart || !rank || argc < 2) return 2;
  char line[128];
  int n = snprintf(line, sizeof line, "%s %s %lld start\n", restart, rank, t);
  int fd = open(ts, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0 || write(fd, line, (size_t)n) != n) return 3;
  close(fd);
  const char* stop = getenv("BENCH_STOP");
  if (strcmp(argv[1], "fifo") == 0) {
    if (!stop) return 2;
    int f = open(stop, O_RDONLY | O_CLOEXEC);  /* a writer is open: no wait */
    if (f < 0) return 3;
    char buf[64];
    ssize_t r;
    while ((r = read(f, buf, sizeof buf)) != 0)
      if (r < 0) return 3;
    return 0;
  }
  if (strcmp(argv[1], "wait") != 0) return 0;
  if (!stop) return 2;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", stop);
  char* slash = strrchr(dir, '/');
  if (!slash) return 2;
  *slash = '\0';
  int in = inotify_init1(IN_CLOEXEC);
  inotify_add_watch(in, dir, IN_CREATE | IN_MOVED_TO);
  long long deadline = now_ns() + 60LL * 1000000000LL;
  while (access(stop, F_OK) != 0) {
    long long left = (deadline - now_ns()) / 1000000;
    if (left <= 0) return 3;
    struct pollfd p = {in, POLLIN, 0};
    if (poll(&p, 1, (int)left) > 0) {
      char buf[4096];
      if (read(in, buf, sizeof buf) < 0) return 3;
    }
  }
  return 0;
}
