// The single-node rendezvous: this node is the whole job.
//
// Group rank 0 of 1, world size = nproc, MASTER_ADDR from --master-addr and
// MASTER_PORT either from --master-port or a port reserved for the whole job
// (port_reservation.h), so every restart reuses the same free port.
#pragma once

#include <memory>
#include <string>

#include "agent/options.h"
#include "agent/port_reservation.h"
#include "agent/rendezvous_handler.h"

namespace ddprun::agent {

class StandaloneRendezvous : public RendezvousHandler {
 public:
  // Reserves the port now; throws RendezvousError naming the address.
  explicit StandaloneRendezvous(const Options& options);

  RoundInfo next_round(int restart_count) override;
  void group_ended(GroupOutcome) override {}
  std::string run_id() const override { return run_id_; }

 private:
  RoundInfo round_;
  std::string run_id_;
  std::unique_ptr<PortReservation> port_;
};

}  // namespace ddprun::agent
