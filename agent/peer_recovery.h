// --restart-scope=rank on several nodes: the agents' half (docs/RECOVERY.md).
//
// The node whose rank failed opens the next generation with a RankFailure
// record in the round's keys (rendezvous/job_protocol.h: the first writer
// wins, so two nodes failing at once is a second failure for one of them);
// every other node's agent watches for that record and tells its own
// survivors, which then re-form with the replacement through the workers'
// store; each node records when its local ranks have joined, and the
// generation is formed once every node has.
//
// Every store call runs off the agent's loop (base::OffLoopTask), on a
// connection of its own opened through RoundInfo::open_agents_store; the
// results come back on the loop through `post`. stop() (and the destructor)
// cancels them all at once through one Canceller: a waiting get returns at
// the moment, it does not wait out its slice.
//
// Not thread-safe: the agent's loop thread only (the handlers run there).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "agent/rendezvous_handler.h"
#include "base/off_loop_task.h"
#include "rendezvous/canceller.h"
#include "rendezvous/job_protocol.h"

namespace ddprun::agent {

class PeerRecovery {
 public:
  // Where the records go: the round's keys in the agents' store.
  struct Place {
    RoundInfo::StoreOpener open;
    std::string run_id;
    int64_t round = 0;
    int nodes = 1;  // the round's group world size
  };
  struct Handlers {
    // Generation failure.generation's record, whoever wrote it (this node's
    // own included: compare failure.node).
    std::function<void(const rendezvous::RankFailure& failure)> failed;
    // This node's record for generation g is in (opened) or lost to another
    // node's (a second failure: the caller falls back).
    std::function<void(int64_t g, bool opened)> published;
    // Every node's ranks joined generation g.
    std::function<void(int64_t g)> formed;
    // A store call failed or a record could not be read: `why` names it;
    // rank recovery across nodes cannot go on (the caller falls back).
    std::function<void(const std::string& why)> lost;
  };
  // Each store call's deadline; a waiting get waits in slices of kSlice
  // (shorter, so a connection that died silently is noticed).
  static constexpr rendezvous::Duration kCallDeadline{10000};
  static constexpr rendezvous::Duration kSlice{2000};

  PeerRecovery(Place place, base::OffLoopTask::Post post, Handlers handlers);
  ~PeerRecovery();
  PeerRecovery(const PeerRecovery&) = delete;
  PeerRecovery& operator=(const PeerRecovery&) = delete;

  // Watches for generation g's record (handlers.failed); replaces a watch
  // still waiting for an older one.
  void watch(int64_t g);
  // Writes this node's record of failure.generation (handlers.published).
  void open_generation(const rendezvous::RankFailure& failure);
  // Records that this node's ranks joined generation g and waits until
  // every node's have (handlers.formed).
  void joined(int64_t g);
  // Cancels every call; no handler runs after it.
  void stop();

 private:
  // The result of one call, written by its thread and read by `done` on
  // the loop (after the thread has returned).
  struct Outcome;
  // Starts `work` on `task` (a previous call there is left to end on its
  // own: it captured only by value) and hands its Outcome to `done`.
  void run(base::OffLoopTask& task, std::function<void(rendezvous::Store&, Outcome&,
                                                       const base::OffLoopTask::Token&)> work,
           std::function<void(Outcome&)> done);

  Place place_;
  rendezvous::JobKeys keys_;
  base::OffLoopTask::Post post_;
  Handlers handlers_;
  std::shared_ptr<rendezvous::Canceller> canceller_ = std::make_shared<rendezvous::Canceller>();
  base::OffLoopTask watch_task_;
  base::OffLoopTask publish_task_;
  base::OffLoopTask join_task_;
  bool stopped_ = false;
};

}  // namespace ddprun::agent
