// The rendezvous layer's one error type, shared by the agent's handlers
// (agent/rendezvous_handler.h): the message says how many nodes came and
// from where, or which store address failed; the agent prints it and
// exits 1.
#pragma once

#include <stdexcept>

namespace ddprun::rendezvous {

class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ddprun::rendezvous
