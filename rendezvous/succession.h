// Who takes the store over when the agent hosting it dies, and what its new
// store starts with (docs/multinode.md, "The store's host dies").
//
// Every formed round names a successor in each member's assignment: the
// lowest group rank that does not host the store (assignments()). That
// member keeps a Standby of the round as it forms: the members, the
// host's id and the job-wide restart count (O(N) bytes, one node a
// round). When the host's agent dies its kernel refuses new connections
// (StoreGoneError): the successor then serves a store on the endpoint's
// port at its own address, preloaded with takeover_records(), and the
// other members, who read the successor in their assignment, join it
// there. The new store holds the round that was running, ended by the
// host's death (its restart spent), so the survivors re-form as after any
// member's death: ranks stable, closing as soon as every live member is
// back.
//
// Only a host that is gone is replaced: one that does not answer (paused,
// partitioned, a machine off) is waited for, so no two stores ever serve
// one job (no split brain).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "rendezvous/job_protocol.h"
#include "rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

struct Standby {
  int64_t round = 0;
  int64_t closer = 0;
  std::vector<NodeInfo> members;  // group-rank order
  std::string store_host;         // the node id of the host it stands by for
  int64_t restarts = 0;           // job-wide restart count as the round formed
};

// The successor's read once `round` is formed: its members, the host's id
// and the restart count (three requests). Throws StoreError, TimeoutError
// or RendezvousError.
Standby read_standby(Store& store, const JobKeys& keys, const RoundResult& round);

// The records a successor's store starts with: the job's round counter,
// the last round formed (its size, closer and members, its join counter
// marked formed), that round ended by the host's death (marked dead, one
// restart spent) and `successor` as the store's new host.
std::vector<std::pair<std::string, Bytes>> takeover_records(const JobKeys& keys,
                                                            const Standby& standby,
                                                            const NodeInfo& successor);

}  // namespace ddprun::rendezvous
