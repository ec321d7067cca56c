// PeerGuards: each node's sections and setups (Watchdog::guards()) shared
// through the job's rendezvous store, so that freeze detection is judged
// job-wide: in the usual script rank 0 (node 0) alone saves a checkpoint
// while every other rank, on every node, waits in the next all-reduce; the
// other nodes' watchdogs must see that section as their own.
//
// Each node writes its NodeRecord (watchdog/guard_record.h: the time each
// guard has left by the publisher's clock; with --restart-scope=rank also
// the stall it sees, the rank blamed here at that step, so that a hang is
// blamed on the node whose rank stopped first (peer_stall.h), and the ranks
// it acts on as hung) under rendezvous::GuardKeys in the round's prefix (a
// new round starts clean), and bumps a counter. Readers look at the
// counter every kPollInterval and read the records only when it moved, so
// the store's load grows with the nodes, not their square.
//
// The store is reached only from this object's own thread, with its own
// client (store calls block; the agent's loop never does): publish() hands
// the guards over and returns at once. Every store call has a deadline
// (kStoreDeadline); a failed call is retried at the next poll, and a node
// whose record cannot be read keeps the guards it had, each bounded by its
// own time. `changed` runs on the thread with the records whose seq moved
// (the caller posts them to its loop). The destructor cancels a blocked
// call and joins.
//
// Why not introspect's NodeBoard: watchdog/ must not depend on introspect/
// (introspect links watchdog), and freeze detection must not depend on
// `ddprun status` being set up.
//
// Thread safety: publish and the destructor from one thread (the agent's
// loop); `changed` on the PeerGuards' thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/service_thread.h"
#include "watchdog/guard_record.h"

namespace ddprun::rendezvous {
class Canceller;
}

namespace ddprun::watchdog {

struct GuardPlace {
  std::string store_addr;    // "host:port" of the job's store
  std::string store_token;   // its HMAC token ("" none)
  std::string store_prefix;  // the round's prefix
  int node = 0;              // this agent's group rank
  int nodes = 1;             // group world size of the round
};

// This node's side of the exchange of NodeRecords, as the watchdog hook
// sees it: publish() hands this node's newest record over without
// blocking; the other nodes' records arrive through the `changed` callback
// given when it was opened, on a thread of the channel's (the caller posts
// them to its loop). PeerGuards below goes through the job's store; tests
// use an in-memory channel.
class PeerChannel {
 public:
  using Changed = std::function<void(std::vector<NodeGuards>)>;
  virtual ~PeerChannel() = default;
  virtual void publish(NodeRecord record) = 0;
};

// Opens this node's channel for a round (throws when it cannot).
using OpenPeerChannel = std::function<std::unique_ptr<PeerChannel>(GuardPlace, PeerChannel::Changed)>;

class PeerGuards : public PeerChannel {
 public:

  static constexpr std::chrono::seconds kStoreDeadline{3};
  // How soon another node's new section is seen here: far below the
  // smallest step timeout (the 1 s minimum of --hang-timeout-floor), at one
  // counter read per poll and node.
  static constexpr std::chrono::milliseconds kPollInterval{200};

  PeerGuards(GuardPlace place, Changed changed);
  ~PeerGuards() override;
  PeerGuards(const PeerGuards&) = delete;
  PeerGuards& operator=(const PeerGuards&) = delete;

  // This node's record now; the thread publishes the newest at once.
  void publish(NodeRecord record) override;

 private:
  void run();

  GuardPlace place_;
  Changed changed_;
  std::shared_ptr<rendezvous::Canceller> canceller_;
  bool has_entry_ = false;             // guarded by service_'s mutex
  NodeRecord entry_;                   // guarded by service_'s mutex
  base::ServiceThread service_;
};

}  // namespace ddprun::watchdog
