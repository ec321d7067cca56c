#include "trainer/store_select.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "trainer/error.h"

#include "rendezvous/client.h"
#include "trainer/c10d_store_adapter.h"

namespace ddprun::trainer {

c10::intrusive_ptr<c10d::Store> make_store(const StoreChoice& c) {
  if (c.ddprun_store) {
    std::unique_ptr<rendezvous::Store> ours = rendezvous::connect_from_env();
    if (!ours) throw TrainerError("DDPRUN_STORE_ADDR is set but the store client found no address");
    // The agent's prefix already scopes keys to this run and attempt.
    return c10::make_intrusive<C10dStoreAdapter>(std::move(ours), c.timeout);
  }
  if (c.master_port <= 0 || c.master_port > 65535) {
    throw TrainerError("MASTER_PORT " + std::to_string(c.master_port) + " is not a port");
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(c.master_port);
  opts.isServer = c.rank == 0 && !c.agent_hosts_store;
  opts.numWorkers = c.world_size;
  opts.waitWorkers = false;  // gloo's connect waits, with its own deadline
  opts.timeout = c.timeout;
  auto tcp = c10::make_intrusive<c10d::TCPStore>(c.master_addr, opts);
  return c10::make_intrusive<c10d::PrefixStore>(
      "ddprun_train/attempt_" + std::to_string(c.restart_count), tcp);
}

}  // namespace ddprun::trainer
