// N simulated nodes running the real rendezvous code (rendezvous.h), one
// thread and two store connections each and no workers, against an
// in-process ddprun store or an etcd: how long a round takes to form, to
// re-form after one node dies, and what each node asks of the store.
// Used by bench/rendezvous_scale (the table in docs/BENCHMARKS.md) and by
// tests/rendezvous/rendezvous_scale_test.cc (the request count at N = 256).
#pragma once

#include <cstdint>
#include <string>

#include "rendezvous/store.h"

namespace ddprun::bench {

struct SimOptions {
  std::string backend = "store";  // "store" (in-process Server) or "etcd"
  std::string etcd_endpoints;     // backend etcd: "127.0.0.1:2379"
  int nodes = 64;
  bool reform = true;  // then one node's keep-alive connection is cut
  rendezvous::Duration join_timeout{300000};
};

struct SimResult {
  int nodes = 0;
  // Before the clock: the N threads started, each node's Rendezvous made
  // (its store connection opened and greeted).
  double setup_s = 0;
  // All N released at once -> the last has its round: the rendezvous
  // protocol's requests only (no connecting, no thread start).
  double formation_s = 0;
  // Of formation_s, the release itself: until the last thread is running.
  double release_s = 0;
  // Node 0's keep-alive connection cut -> the last survivor has the next
  // round: the death noticed (the store's on-close writes), every
  // KeepAlive ended, the next round formed.
  double reformation_s = 0;
  // Of reformation_s: until the last survivor's KeepAlive reported the end,
  // and until the last had torn its KeepAlive down (then: the next round).
  double reform_ended_s = 0;
  double reform_left_s = 0;
  // Requests each node made for the round (its rendezvous connection, not
  // the keep-alive's): the mean and the most any node made.
  double requests_per_node = 0;
  int64_t max_requests = 0;
  // Payload bytes (keys and values, both ways) a node moved for the round.
  double bytes_per_node = 0;
  double reform_requests_per_node = 0;
  int64_t reform_max_requests = 0;
  double reform_bytes_per_node = 0;
  // CPU the store's event loop used (backend store): the store's own cost,
  // apart from the simulated nodes sharing the machine's cores, in the
  // set-up (accepting and greeting the N connections), the formation, and
  // the re-formation (with the keep-alive beats and their ends).
  double store_cpu_setup_s = 0;
  // CPU the whole process (N nodes and the store, user and kernel) used in
  // the formation and the re-formation: their cost to this machine, apart
  // from what else ran on its cores meanwhile (on 2 idle cores a phase
  // takes at least half of it).
  double cpu_formation_s = 0;
  double cpu_reformation_s = 0;
  double store_cpu_formation_s = 0;
  double store_cpu_reformation_s = 0;
  std::string error;  // the first node's failure, empty when all formed
};

SimResult simulate(const SimOptions& options);

// One JSON object (the bench's output line).
std::string to_json(const SimOptions& options, const SimResult& result);

}  // namespace ddprun::bench
