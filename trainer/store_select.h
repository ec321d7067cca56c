// Chooses how the ranks meet, and hands c10d a store.
//
// Under ddprun (DDPRUN_STORE_ADDR set) the job's one rendezvous endpoint is
// our store: connect with rendezvous::connect_from_env() and wrap it in
// C10dStoreAdapter. Otherwise (torchrun, or ranks started by hand) use
// c10d::TCPStore at MASTER_ADDR:MASTER_PORT, hosted by rank 0 unless the
// launcher's agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True). Keys are
// scoped per restart attempt so a restarted group never reads stale keys.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddprun::trainer {

struct StoreChoice {
  bool ddprun_store = false;        // DDPRUN_STORE_ADDR is set
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_hosts_store = false;   // TORCHELASTIC_USE_AGENT_STORE=True
  int rank = 0;
  int world_size = 1;
  int restart_count = 0;
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

c10::intrusive_ptr<c10d::Store> make_store(const StoreChoice& choice);

}  // namespace ddprun::trainer
