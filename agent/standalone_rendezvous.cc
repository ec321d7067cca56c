#include "agent/standalone_rendezvous.h"

#include "base/safe_file.h"

namespace ddprun::agent {

std::string random_token() { return base::random_hex(16); }

StandaloneRendezvous::StandaloneRendezvous(const Options& options) : run_id_(options.run_id) {
  round_.local_world_size = options.nproc_per_node;
  round_.world_size = options.nproc_per_node;
  round_.master_addr = options.master_addr;
  try {
    // Also --master-port's port is bound now: the agent hosts the job's
    // TCPStore there, as torchrun's does.
    port_ = options.master_port
                ? std::make_unique<PortReservation>(options.master_addr, *options.master_port)
                : std::make_unique<PortReservation>(options.master_addr);
    round_.master_port = port_->port();
    StoreHostOptions so;
    so.token = options.rdzv_token.empty() ? random_token() : options.rdzv_token;
    so.tcpstore_fd = port_->take_socket();
    store_ = std::make_unique<StoreHost>(so);
    round_.store_addr = so.bind_host + ":" + std::to_string(store_->port());
    round_.store_token = so.token;
  } catch (const std::exception& e) {
    throw RendezvousError(e.what());
  }
}

RoundInfo StandaloneRendezvous::next_round(int restart_count) {
  // The last attempt's workers are gone: the new ones start from an empty
  // TCPStore (store_host.h). The first round's store was just made: no
  // round trip to the store thread before the first workers.
  if (rounds_++ > 0) store_->clear_tcpstore();
  RoundInfo r = round_;
  // Store keys (DDPRUN_STORE_PREFIX), only alike to the attempt folder's
  // name: not-a-contract-name
  r.store_prefix = run_id_ + "/attempt_" + std::to_string(restart_count) + "/";
  return r;
}

}  // namespace ddprun::agent
