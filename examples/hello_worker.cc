// A native ddprun worker: reads the torchrun variables ddprun sets and
// prints one line. Any executable works the same way (no --no-python
// needed):
//
//   build/bin/ddprun --nproc-per-node=4 build/bin/hello_worker --fail-rank 2
//
// With --fail-rank N, rank N exits 1 on the first attempt, so you can watch
// ddprun tear the group down and restart it (add --max-restarts=1).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "?";
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a pipe to ddprun: flush each line
  int fail_rank = -1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--fail-rank") == 0) fail_rank = std::atoi(argv[i + 1]);
  int rank = std::atoi(env("RANK").c_str());
  int restart = std::atoi(env("TORCHELASTIC_RESTART_COUNT").c_str());
  std::printf("hello from rank %d of %s (local rank %s, restart %d, master %s:%s)\n", rank,
              env("WORLD_SIZE").c_str(), env("LOCAL_RANK").c_str(), restart,
              env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str());
  if (rank == fail_rank && restart == 0) {
    std::fprintf(stderr, "rank %d: failing on purpose\n", rank);
    return 1;
  }
  return 0;
}
