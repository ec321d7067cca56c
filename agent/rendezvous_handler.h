// How the agent learns its place in the job before each attempt.
//
// The agent calls next_round() before every attempt (the first one and each
// restart) and reports how the local group ended. The single-node version
// is standalone_rendezvous.h; the multi-node one is elastic_rendezvous.h
// (over rendezvous/rendezvous.h), which also implements AgentHooks
// (hooks.h) so that a failure on another node can fail the local group
// through AttemptControl::fail_attempt.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "rendezvous/canceller.h"
#include "rendezvous/rendezvous_error.h"
#include "rendezvous/store.h"

namespace ddprun::agent {

// This node's view of one round.
struct RoundInfo {
  int group_rank = 0;        // this node's rank among nodes (GROUP_RANK)
  int group_world_size = 1;  // nodes in the round (GROUP_WORLD_SIZE)
  int world_size = 1;        // workers in the whole job (WORLD_SIZE)
  int rank_base = 0;         // global rank of this node's local rank 0
  int local_world_size = 1;  // workers on this node (LOCAL_WORLD_SIZE)
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT
  // ddprun's own store (DDPRUN_STORE_*); empty when the job has none.
  std::string store_addr;
  std::string store_prefix;
  std::string store_token;
  // The agents' own store, whatever the backend (ddprun's TCP store or
  // etcd), for agent-side helpers that talk across nodes (introspect's
  // NodeBoard): opens a fresh connection, each call's deadline `deadline`,
  // abandoned when `canceller` fires (may be null); throws StoreError.
  // Callable from any thread; empty for a single-node job.
  using StoreOpener = std::function<std::unique_ptr<rendezvous::Store>(
      rendezvous::Duration deadline, std::shared_ptr<rendezvous::Canceller> canceller)>;
  StoreOpener open_agents_store;
  // The round's introspection prefix there ("rdzv/<run_id>/introspect/round_<n>/").
  std::string agents_store_prefix;
  // How errors name that store ("HOST:PORT", "etcd at EP").
  std::string agents_store_name;
  // Multi-node: the rendezvous round (job_protocol.h's r<N>) and this
  // node's id in it, where the agents' records of a rank-scoped recovery
  // go (agent/peer_recovery.h); 0 and "" for a single-node job.
  int64_t round = 0;
  std::string node_id;
  // TORCHELASTIC_RESTART_COUNT when the handler keeps a job-wide count
  // (multi-node); -1: the agent counts its own attempts.
  int restart_count = -1;
};

enum class GroupOutcome { kSucceeded, kFailed, kInterrupted };

// What the agent does once the local group has ended.
struct GroupVerdict {
  enum Action {
    kDefault,  // success ends the job; a failure asks the restart policy
    kRestart,  // run the next round without asking the policy (a scale-up)
    kExit,     // end the job with exit_code (the job-wide outcome)
  } action = kDefault;
  int exit_code = 0;
  std::string why;  // logged for kRestart; printed for a non-zero kExit
};

// Thrown when a round cannot be formed; the agent prints it and exits 1.
// One type for the whole job: the rendezvous layer's.
using rendezvous::RendezvousError;

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  // Blocks (with the handler's own deadline) until the round is formed.
  // `restart_count` is 0 for the first attempt. A multi-node agent calls it
  // on a thread of its own, so the loop goes on handling signals.
  virtual RoundInfo next_round(int restart_count) = 0;
  // The local group of the round just run has ended (may block, e.g. the
  // exit barrier; called like next_round).
  virtual GroupVerdict group_ended(GroupOutcome outcome) = 0;
  // Called from the agent's loop thread while next_round or group_ended
  // blocks on another: ddprun got stop signal `signal`. Must not block; the
  // blocked call then returns (or throws) within milliseconds, and the
  // handler is only used to end the job afterwards.
  virtual void abandon(int signal) { (void)signal; }
  // The job is over (ddprun is about to exit, not after a stop signal): a
  // multi-node handler's exit hand-shake, bounded by its own deadline;
  // called like next_round, and abandon() cuts it short.
  virtual void finish_job() {}
  // TORCHELASTIC_RUN_ID.
  virtual std::string run_id() const = 0;
};

}  // namespace ddprun::agent
