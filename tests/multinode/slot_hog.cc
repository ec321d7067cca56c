// slot_hog HOST PORT PER_ADDRESS SOURCE...: from each SOURCE address, holds
// PER_ADDRESS connections to the store at HOST:PORT that never
// authenticate, reconnecting within 10 ms whatever the store closes
// (tests/rendezvous/hostile.h's Attacker), until it is killed. Prints
// "slot_hog: holding" once every connection has been opened.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tests/rendezvous/hostile.h"

int main(int argc, char** argv) {
  using namespace ddprun::rendezvous::hostile;
  if (argc < 5) {
    std::fprintf(stderr, "usage: slot_hog HOST PORT PER_ADDRESS SOURCE...\n");
    return 2;
  }
  std::vector<std::unique_ptr<Attacker>> attackers;
  for (int i = 4; i < argc; ++i) {
    AttackOptions o;
    o.dest = argv[1];
    o.port = static_cast<uint16_t>(std::atoi(argv[2]));
    o.connections = static_cast<size_t>(std::atoi(argv[3]));
    o.source = argv[i];
    attackers.push_back(std::make_unique<Attacker>(o));
  }
  for (;;) {
    bool all = true;
    for (const auto& a : attackers) all = all && a->established();
    if (all) break;
    usleep(10000);
  }
  std::printf("slot_hog: holding\n");
  std::fflush(stdout);
  // Killed by the test (SIGKILL); until then the attackers run.
  sigset_t none;
  sigemptyset(&none);
  for (;;) sigsuspend(&none);
}
