#include "trainer/blas_setup.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/contract.h"

namespace ddprun::trainer {

void reexec_if_openblas_misdetects(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  // dlsym, not a link-time reference: the BLAS may be another library.
  using CoreName = char* (*)();
  auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return;
  const char* core = corename();
  if (core == nullptr || strcasecmp(core, "prescott") != 0) return;
  // __builtin_cpu_supports also checks that the OS saves the AVX-512 state.
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr) return;
  setenv("OPENBLAS_CORETYPE", better, 1);  // also stops a second re-exec
  const char* rank = std::getenv(base::kEnvRank);
  // Once per job: rank 0, or a program outside a launcher (a standby has
  // no rank yet, and rank 0 says it).
  if ((rank == nullptr && std::getenv(base::kEnvStandby) == nullptr) ||
      (rank != nullptr && std::strcmp(rank, "0") == 0)) {
    std::fprintf(stderr,
                 "train: OpenBLAS chose its Prescott kernels on a CPU with %s; restarting with "
                 "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose yourself)\n",
                 better[0] == 'S' ? "AVX-512" : "AVX2", better);
  }
  // The resolved path, not /proc/self/exe: the program keeps its name in ps.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  execv(self, argv);
  // exec failed: carry on with the slow kernels.
}

void set_openblas_threads(int threads) {
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set != nullptr) set(threads);
}

}  // namespace ddprun::trainer
