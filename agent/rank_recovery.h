// Rank-scoped recovery (--restart-scope=rank, docs/RECOVERY.md) for one
// attempt: replacing one failed or hung rank while the others keep running.
//
// One recovery at a time. It begins when a worker fails while the group
// runs (or a hook blames a hung one) with a restart left: the generation
// goes up, the survivors get `failed` at once (they may be waiting on the
// dead rank in a collective), the slot's process group is SIGKILLed (what
// it started dies with it), a replacement takes the slot (a standby told
// its rank, or a process started then) with the same ranks and
// DDPRUN_GENERATION=G, and the survivors get `ready`. It ends when every
// local rank has sent `joined` for G; then every rank gets `recovered`.
// Anything that makes that impossible (a second failure, no restart left,
// the spawn failing, --recovery-timeout) falls back to the group teardown,
// which the workers hear of as `fallback`.
//
// A hang (on_hang) differs only in its start: the culprit may first get
// its traceback signal, for up to the hook's wait, then SIGKILL; its reaped
// end starts the replacement.
//
// On several nodes (rank_recovery_peers.cc) the agents keep the generation
// in step through the store (peer_recovery.h): the failing node opens it,
// every other node tells its survivors (nothing is replaced there), and the
// recovery is over once every node's ranks have joined.
//
// The attempt stays the owner of the workers: recovery reaches them only
// through RecoveryHost (signal a slot, replace a slot, tell the workers,
// stop the group). Not thread-safe: everything runs on the agent's loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/attempt_types.h"
#include "agent/hooks.h"
#include "agent/options.h"
#include "base/recovery_wire.h"
#include "agent/peer_recovery.h"
#include "agent/rendezvous_handler.h"
#include "agent/spawn.h"
#include "base/clock.h"
#include "base/liveness.h"

namespace ddprun::agent {

// What recovery needs of the attempt that owns the workers. Slots are
// local ranks, 0 .. slot_count() - 1.
class RecoveryHost {
 public:
  virtual ~RecoveryHost() = default;
  // The group is running: no teardown under way.
  virtual bool running() const = 0;
  virtual int slot_count() const = 0;
  // The slot's current worker, and whether it is not yet reaped.
  virtual const WorkerInfo& slot(int local_rank) const = 0;
  virtual bool slot_alive(int local_rank) const = 0;
  // `sig` to the slot's worker, or to its whole process group.
  virtual void signal_slot(int local_rank, int sig, bool whole_group) = 0;
  // Ends the slot's worker for good (its group SIGKILLed) and puts another
  // in the slot: a standby told its rank in `generation`, else a process
  // started now. Returns the standby's number (0: a new process), or the
  // error that kept a replacement from starting.
  struct Replaced {
    int standby = 0;
    std::optional<SpawnError> error;
  };
  virtual Replaced replace_slot(int local_rank, int generation) = 0;
  // `packet` to every live worker's recovery channel but `except`'s.
  virtual void tell_workers(const std::string& packet, int except = -1) = 0;
  // Recovery fell back: the group stops with `root` as the attempt's failure.
  virtual void stop_group(Failure root) = 0;
  // The recovery is over: a standby used for it may be started again.
  virtual void recovery_over() = 0;
};

// What identifies this agent's place in the job, for the rank budget and
// the other nodes.
struct RecoveryPlace {
  int restart_count = 0;
  // Restarts spent on single ranks in earlier attempts.
  int rank_restarts = 0;
  RoundInfo round;
  std::string run_id;
};

class RankRecovery {
 public:
  // `host`, `clock`, `options`, `io` and the hooks must outlive it.
  RankRecovery(RecoveryHost& host, base::Clock& clock, const Options& options, RecoveryPlace place,
               std::vector<AgentHooks*> hooks, boost::asio::io_context& io);
  RankRecovery(const RankRecovery&) = delete;
  RankRecovery& operator=(const RankRecovery&) = delete;

  bool enabled() const { return options_.restart_scope == RestartScope::kRank; }
  // The generation the ranks are in (or re-forming into).
  int generation() const { return generation_; }
  // The job's restarts spent on single ranks, this attempt's included.
  int rank_restarts() const { return rank_restarts_; }
  int restarts_left() const;
  bool under_way() const { return recovery_.has_value(); }

  // The group started: on several nodes, watch the other nodes' failures.
  void start();
  // A worker ended while the group runs: true when recovery took care of
  // it (a replacement is starting), false for the group path.
  bool on_exit(const WorkerEnd& end);
  // A hook's fail_attempt with replace_local_rank: true when that rank is
  // being replaced, false for the group path.
  bool on_hang(const FailRequest& request);
  // A packet from the worker in slot `local_rank`.
  void on_packet(int local_rank, std::string_view packet);
  // The group stops for another reason: a recovery under way gives up.
  void group_stopping(const std::string& why);
  // The attempt is over: no timer fires, the other nodes are not watched.
  void stop();

 private:
  struct Recovery {
    int generation = 0;
    int local_rank = 0;  // the slot being replaced; -1: none (another node's ranks)
    // The failed global ranks: the slot's, or another node's (maybe several).
    std::vector<int> ranks;
    // Several nodes: every local rank joined; the other nodes' are awaited.
    bool joined_here = false;
    base::recovery_wire::Cause cause = base::recovery_wire::Cause::kExit;
    base::TimePoint began{};
    std::set<int> joined;  // local ranks that joined `generation`
    bool spawned = false;  // the replacement exists
    // A hung rank being killed: its end starts the replacement.
    pid_t victim = 0;
    // What failed, the root cause should the recovery fall back.
    Failure failure;
  };

  void begin(int local_rank, base::recovery_wire::Cause cause, const std::string& what,
             Failure failure);
  void respawn(int local_rank);
  // The replacement in `local_rank`'s slot exists: the hooks' kReplaced,
  // `ready` to the survivors.
  void replaced(int local_rank, const WorkerInfo& old, int standby);
  void check_joined();
  // Every rank (of every node) joined: `recovered` to the ranks, the hooks.
  void complete();
  // The generation just opened: `failed` naming `ranks` to every live
  // worker but `except`, the hooks' kFailed, --recovery-timeout.
  void announce_failure(const std::vector<int>& ranks, int except, const std::string& line);
  void on_timeout(int generation);
  // Gives up: the fallback message to every worker, one console line, the
  // event; the caller stops the group (give_up does both).
  void fall_back(base::recovery_wire::Fallback reason, const std::string& why);
  void give_up(base::recovery_wire::Fallback reason, const std::string& why, Failure root);
  void hooks(RecoveryEvent event);

  // rank_recovery_peers.cc: several nodes.
  bool multi_node() const;
  void start_peers();
  void peer_failed(const rendezvous::RankFailure& failure);
  void generation_published(int64_t generation, bool opened);
  void generation_formed(int64_t generation);
  void peers_lost(const std::string& why);

  RecoveryHost& host_;
  base::Clock& clock_;
  const Options& options_;
  RecoveryPlace place_;
  std::vector<AgentHooks*> hooks_;
  boost::asio::io_context& io_;
  int generation_ = 0;
  int rank_restarts_ = 0;
  std::optional<Recovery> recovery_;
  std::unique_ptr<base::Timer> recovery_timer_;  // --recovery-timeout
  std::unique_ptr<base::Timer> victim_timer_;    // a hung rank's traceback wait, then SIGKILL
  std::unique_ptr<PeerRecovery> peers_;          // several nodes only
  // Posted peer news checks it. Last, so it clears before the other members go.
  base::Liveness alive_;
};

}  // namespace ddprun::agent
