// `train`'s end of the recovery channel (--restart-scope=rank,
// docs/RECOVERY.md): the agent's failed/ready/fallback packets in, this
// rank's joined packet out, over the inherited DDPRUN_RECOVERY_FD
// (base/recovery_wire.h has the bytes).
//
// RecoveryChannel is the trainer's AbortSource: requested() turns true once
// the agent announced a failure of this rank's generation (event=failed
// with a higher generation) or gave up on rank-scoped recovery
// (event=fallback), so communicators abandon the collective in flight.
// wait_failed() then gives the generation to re-form as. A standby
// (--standby-workers, DDPRUN_STANDBY) first waits in wait_assigned() for
// its rank and generation (event=assign). Reads never block
// (MSG_DONTWAIT); waits poll() the descriptor with a deadline. A packet
// that does not parse is logged in one line and ignored; the agent's end
// closing (EOF) ends the channel quietly: nothing more can arrive.
//
// Move-only owner of the descriptor; not thread-safe (the training
// thread only, as abort_source.h requires).
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/scoped_fd.h"
#include "trainer/abort_source.h"

namespace ddprun::trainer {

// The worker's recovery environment, as the agent sets it.
struct RecoveryEnv {
  bool rank_scope = false;  // DDPRUN_RESTART_SCOPE=rank
  int fd = -1;              // DDPRUN_RECOVERY_FD (rank scope only)
  int64_t generation = 0;   // DDPRUN_GENERATION: 0, or G for generation G's replacement
  int standby = 0;          // DDPRUN_STANDBY: its number (1, 2, ...); 0: started as a rank
};

// From the variables' values (nullptr or "" = unset). Scope "group" or
// unset: rank_scope false, the others ignored. Scope "rank" needs a
// descriptor that is an open SOCK_SEQPACKET socket and a generation >= 0;
// `standby`, when set, a number >= 1 (and rank scope).
// Throws TrainerError with one line naming the variable and its value.
RecoveryEnv parse_recovery_env(const char* scope, const char* fd, const char* generation,
                               const char* standby = nullptr);

// A standby's rank, as event=assign gave it.
struct Assignment {
  int rank = 0;
  int local_rank = 0;
  int64_t generation = 0;  // the generation it joins as the failed rank's replacement
};

class RecoveryChannel : public AbortSource {
 public:
  using Clock = std::chrono::steady_clock;

  // Owns `fd` (made close-on-exec); `generation` is the one this process
  // starts in; `standby`: its DDPRUN_STANDBY number, 0 for a rank.
  RecoveryChannel(int fd, int64_t generation, int standby = 0);

  // A standby until wait_assigned() returned: its number, else 0.
  int standby() const { return standby_; }
  // A standby's wait for its rank: returns at event=assign (its generation
  // becomes generation(), standby() 0), or nullopt once *stop is non-zero
  // (the agent's SIGTERM: the group is ending). No deadline of its own:
  // the agent ends a standby it has no use for. Throws TrainerError when
  // the agent's end closed (no assignment can come).
  std::optional<Assignment> wait_assigned(const volatile std::sig_atomic_t* stop);

  int fd() const override { return closed_ ? -1 : fd_.get(); }
  bool requested() override;

  // The generation this rank trains in, or is forming (once wait_failed()
  // returned it): only a failure beyond it asks for an abort.
  int64_t generation() const { return generation_; }
  // The ranks the newest failed packet named (empty before one).
  const std::vector<int>& failed_ranks() const { return failed_ranks_; }

  // The generation to re-form as: returns once event=failed for a
  // generation above generation() arrived (at once when it already has),
  // and makes it generation(). Throws TrainerError when `deadline` passes
  // first (naming `what`, the deadline's flag), on event=fallback, and when
  // the agent's end closed.
  int64_t wait_failed(Clock::time_point deadline, const std::string& what);

  // This rank formed generation() and holds its state: event=joined goes
  // to the agent (a full socket drops it, as the contract allows; logged).
  void joined(int rank);

 private:
  void drain();
  void take(const std::string& packet);

  base::ScopedFd fd_;
  int64_t generation_ = 0;
  int64_t failed_generation_ = -1;  // highest generation an event=failed named
  std::vector<int> failed_ranks_;
  std::string fallback_reason_;     // set once event=fallback arrived
  bool fallback_ = false;
  bool closed_ = false;             // the agent's end closed, or recv failed
  int standby_ = 0;
  std::optional<Assignment> assigned_;  // event=assign arrived (a standby's)
};

}  // namespace ddprun::trainer
