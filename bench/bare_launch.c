/* The floor a launcher cannot beat: fork+exec of N workers with the two
 * variables bench/launch_worker.c reads, then wait for them. No process
 * group, no pipes, no environment beyond that: bench/launch_bench.py's
 * "fork+exec (the limit)" row, the figure issue 24 holds ddprun's launch
 * against (within 1.5x).
 *   bare_launch <N> <program> [args...]   exit 0 when every worker exits 0 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bare_launch N program [args...]\n");
    return 2;
  }
  int n = atoi(argv[1]), failed = 0;
  setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
  for (int i = 0; i < n; ++i) {
    char rank[16];
    snprintf(rank, sizeof rank, "%d", i);
    setenv("RANK", rank, 1);
    pid_t pid = fork();
    if (pid == 0) {
      execv(argv[2], argv + 2);
      _exit(127);
    }
    if (pid < 0) return 1;
  }
  for (int status; wait(&status) > 0;) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  return failed;
}
