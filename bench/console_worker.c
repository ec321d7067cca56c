/* Console bench worker: prints N lines of 200 bytes (199 + '\n') as fast as
 * it can, fully buffered (64 KiB writes) on a pipe and a terminal alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 100000;
  static char buf[1 << 16];
  setvbuf(stdout, buf, _IOFBF, sizeof buf);
  char line[201];
  memset(line, 'x', 199);
  line[199] = '\n';
  line[200] = 0;
  for (long i = 0; i < n; ++i) {
    int k = snprintf(line, 24, "%09ld", i);
    line[k] = ' ';
    fwrite(line, 1, 200, stdout);
  }
  return fflush(stdout) == 0 ? 0 : 1;
}
