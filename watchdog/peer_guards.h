// PeerGuards: each node's sections and setups (Watchdog::guards()) shared
// through the job's rendezvous store, so that freeze detection is judged
// job-wide: in the usual script rank 0 (node 0) alone saves a checkpoint
// while every other rank, on every node, waits in the next all-reduce; the
// other nodes' watchdogs must see that section as their own.
//
// Keys, in the round's prefix (a new round starts clean):
//   ddprun-watchdog/<store prefix>guards/<node>  this node's record (JSON)
//   ddprun-watchdog/<store prefix>guards/changes a counter every publisher bumps
// A record is {"seq": n, "guards": [{"rank", "section", "remaining_s"}]}:
// the time each guard has left by the publisher's clock, so no two nodes'
// clocks are compared. With --restart-scope=rank it may also say
// "stall": {"rank", "step", "silent_s"} (this node's ranks are past their
// deadline, the one blamed here at that step: is a rank elsewhere behind
// it?) and "blamed": [ranks] (this node acts on a hang of these ranks of its
// own), so that a hang is blamed on the node whose rank stopped first
// (peer_stall.h). Readers look at the counter every kPollInterval and
// read the records only when it moved, so the store's load grows with the
// nodes, not their square.
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

namespace ddprun::rendezvous {
class Canceller;
}

namespace ddprun::watchdog {

// A guard as it travels: rank, section ("setup" for a setup), time left.
struct SharedGuard {
  int rank = -1;
  std::string section;
  std::chrono::milliseconds remaining{0};
  bool operator==(const SharedGuard& o) const {
    return rank == o.rank && section == o.section && remaining == o.remaining;
  }
};

// A node's stalled ranks, as it tells the others: the rank it would blame,
// that rank's last step, and how long it has been silent (by its clock).
struct PeerStall {
  int rank = -1;
  int64_t step = -1;
  std::chrono::milliseconds silent{0};
  bool operator==(const PeerStall& o) const {
    return rank == o.rank && step == o.step && silent == o.silent;
  }
};

// What one node publishes.
struct NodeRecord {
  std::vector<SharedGuard> guards;
  std::optional<PeerStall> stall;
  std::vector<int> blamed;  // global ranks this node acts on as hung
};

// Another node's record as read.
struct NodeGuards {
  int node = -1;
  uint64_t seq = 0;
  NodeRecord record;
};

// The record's codec (one place knows the bytes); decode throws
// std::runtime_error naming what is wrong.
std::string encode_guards(uint64_t seq, const NodeRecord& record);
NodeGuards decode_guards(int node, const std::string& text);

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
