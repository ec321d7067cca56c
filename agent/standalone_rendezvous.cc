#include "agent/standalone_rendezvous.h"

namespace ddprun::agent {

StandaloneRendezvous::StandaloneRendezvous(const Options& options) : run_id_(options.run_id) {
  round_.local_world_size = options.nproc_per_node;
  round_.world_size = options.nproc_per_node;
  round_.master_addr = options.master_addr;
  if (options.master_port) {
    round_.master_port = *options.master_port;
  } else {
    try {
      port_ = std::make_unique<PortReservation>(options.master_addr);
    } catch (const std::exception& e) {
      throw RendezvousError(e.what());
    }
    round_.master_port = port_->port();
  }
}

RoundInfo StandaloneRendezvous::next_round(int) { return round_; }

}  // namespace ddprun::agent
