// bench/rendezvous_scale: N simulated nodes forming and re-forming a round
// (bench/rendezvous_sim.h); one JSON object a run on stdout.
//   rendezvous_scale --backend store|etcd --nodes N [--etcd 127.0.0.1:2379] [--no-reform]
// bench/rendezvous_scale.sh runs the table of docs/BENCHMARKS.md (etcd and
// torch's c10d rendezvous beside it).
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "bench/rendezvous_sim.h"

int main(int argc, char** argv) {
  ddprun::bench::SimOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rendezvous_scale: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--backend") o.backend = value();
    else if (a == "--nodes") o.nodes = std::stoi(value());
    else if (a == "--etcd") o.etcd_endpoints = value();
    else if (a == "--no-reform") o.reform = false;
    else {
      std::fprintf(stderr, "rendezvous_scale: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (o.nodes < 2) {
    std::fprintf(stderr, "rendezvous_scale: --nodes must be at least 2\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);  // one "round formed" line a node otherwise
  auto r = ddprun::bench::simulate(o);
  std::cout << ddprun::bench::to_json(o, r) << std::endl;
  return r.error.empty() ? 0 : 1;
}
