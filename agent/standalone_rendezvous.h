// The single-node rendezvous: this node is the whole job.
//
// Group rank 0 of 1, world size = nproc, MASTER_ADDR from --master-addr and
// MASTER_PORT either from --master-port or a port reserved for the whole job
// (port_reservation.h), so every restart reuses the same free port. The
// agent hosts c10d's TCPStore on that port for the whole job, and ddprun's
// store on 127.0.0.1 (store_host.h) for the workers: DDPRUN_STORE_ADDR, a
// prefix per run and attempt, and a token (random unless one is
// configured) so other local users cannot use it.
#pragma once

#include <memory>
#include <string>

#include "agent/options.h"
#include "agent/port_reservation.h"
#include "agent/rendezvous_handler.h"
#include "agent/store_host.h"

namespace ddprun::agent {

class StandaloneRendezvous : public RendezvousHandler {
 public:
  // Reserves the port and starts the store now; throws RendezvousError
  // naming the address.
  explicit StandaloneRendezvous(const Options& options);

  RoundInfo next_round(int restart_count) override;
  GroupVerdict group_ended(GroupOutcome) override { return {}; }
  std::string run_id() const override { return run_id_; }

 private:
  RoundInfo round_;
  int rounds_ = 0;  // next_round() calls so far
  std::string run_id_;
  std::unique_ptr<PortReservation> port_;
  std::unique_ptr<StoreHost> store_;
};

// 32 random hex digits, for a store nobody configured a token for.
std::string random_token();

}  // namespace ddprun::agent
