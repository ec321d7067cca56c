// Runs the multi-node tests, or exits 77 (ctest: skipped) with the reason
// when this process cannot create network namespaces.
#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/common/skip.h"

#include <cstdio>

#include "tests/multinode/netns.h"

int main(int argc, char** argv) {
  std::string why = ddprun::testing::netns_unavailable();
  if (!why.empty()) {
    std::printf("multinode tests skipped: %s\n", why.c_str());
    return 77;
  }
  ddprun::testing::remove_stale_namespaces();
  return ddprun::testing::main_with_skips(argc, argv);
}
