// ElasticRendezvous (elastic_rendezvous.h): how this node leaves a round.
// The group's verdict once the local workers ended (group_ended: the exit
// barrier on success, the failure's record otherwise), the exit hand-shake
// that keeps the store up until every node read the outcome (finish_job),
// and the farewell of a node stopped by a signal.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/elastic_rendezvous.h"
#include "agent/rendezvous_store.h"
#include "rendezvous/client.h"
#include "rendezvous/job_protocol.h"

namespace ddprun::agent {
namespace {

namespace rdzv = rendezvous;
using rdzv::Duration;

// A stopping node's fresh connection for its farewell (its others were
// cancelled): short, it is leaving, but long enough that a loaded
// machine's scheduling delay does not lose the record.
constexpr Duration kFarewellConnect{3000};

}  // namespace

void ElasticRendezvous::forget_finished_job() {
  // etcd outlives the job: the last node out of a finished job deletes its
  // keys, so the same --rdzv-id can run again from round 0 with a fresh
  // restart budget. (Two nodes that both see everyone out both delete:
  // harmless.) A job that did not finish leaves them; see docs/multinode.md.
  const int64_t r = round_->round;
  control_->set(keys_.exited(r, rdzv_->node_id()), rdzv::to_bytes("1"));
  if (!drain_) return;
  for (const auto& n : rdzv::read_members(*control_, keys_, *round_))
    if (!control_->check({keys_.exited(r, n.node_id)})) return;
  if (control_->remove_prefix(keys_.job()) >= 0)
    spdlog::debug("rendezvous '{}': the job's keys are deleted from the store", options_.run_id);
}

void ElasticRendezvous::finish_job() {
  if (notifier_.joinable()) notifier_.join();
  keep_alive_.reset();
  // The store's host left with its store: nobody waits for this node's
  // hand-shake, and a connection to the departed store would only be
  // refused until its deadline (10 s).
  if (!round_ || !control_ || store_closed_) return;
  // This node's outcome is recorded: a stop signal from here on must not
  // end the finished round for the others (farewell()).
  round_over_ = true;
  // The exit hand-shake: the host keeps the store up until every node of a
  // finished round has read its outcome (bounded), so none sees it vanish.
  // It runs off the agent's loop, and a stop signal cancels it (abandon()).
  const int64_t r = round_->round;
  try {
    if (spec_.etcd) {
      forget_finished_job();
    } else if (!host_) {
      // On a connection of its own, bounded like the host's wait below:
      // past that the host has gone, and control_'s reconnects would retry
      // the departed store for join_timeout (600 s by default), keeping a
      // finished agent alive that long (seen after a 15 s hang teardown).
      const Duration limit = std::min<Duration>(rdzv_->options().close_timeout, Duration(10000));
      auto store = open_rendezvous_store(spec_, limit, limit, canceller_);
      store->set(keys_.exited(r, rdzv_->node_id()), rdzv::to_bytes("1"));
    } else if (drain_) {
      std::vector<std::string> keys;
      for (const auto& n : rdzv::read_members(*control_, keys_, *round_))
        if (n.node_id != rdzv_->node_id()) keys.push_back(keys_.exited(r, n.node_id));
      if (keys.empty()) return;
      const Duration limit = std::min<Duration>(rdzv_->options().close_timeout, Duration(10000));
      spdlog::info("waiting up to {} s for the other nodes to read the job's outcome",
                   limit.count() / 1000.0);
      control_->wait(keys, limit);
    }
  } catch (const std::exception& e) {
    spdlog::debug("exit hand-shake: {}", e.what());
  }
}

void ElasticRendezvous::farewell() {
  // Stopped by a signal in the middle of a join or an exit barrier: this
  // node's record (signalled, 128 + the signal) ends the running round for
  // the others, rather than leaving them to find out from missing
  // heartbeats. Its hosted store goes with this process: the host then
  // lingers (bounded) until the others have read the record or are gone, or
  // a peer between two polls finds the store gone and reports that instead
  // of the signal (multinode.barrierint). A host whose own failure record is
  // already out (attempt_interrupted) lingers for it the same way.
  if (!round_) return;
  std::optional<rdzv::RoundEnd> publish;
  if (!round_over_ && canceller_->cancelled()) {
    round_over_ = true;
    rdzv::RoundEnd end;
    end.kind = rdzv::RoundEnd::kSignalled;
    end.signal = stop_signal_;
    end.exit_status = 128 + stop_signal_;
    end.node = rdzv_->node_id();
    end.reason = me() + ": its agent was stopped by " + signal_name(stop_signal_);
    end.store_closes = host_ != nullptr;
    publish = end;
  } else if (!(host_ && local_end_ && local_end_->store_closes)) {
    return;
  }
  const bool host = host_ != nullptr;
  const Duration linger = std::clamp(keep_alive_window_ * 2, Duration(5000), Duration(15000));
  if (keep_alive_) {  // its connection was never cancelled: no connect needed
    keep_alive_->farewell(publish, host, linger);
    return;
  }
  try {
    auto store = open_rendezvous_store(spec_, kFarewellConnect, kFarewellConnect, nullptr);
    if (publish && !rdzv::publish_end(*store, keys_, round_->round, *publish)) return;
    if (host) {
      std::vector<std::string> peers;
      for (const auto& n : rdzv::read_members(*store, keys_, *round_))
        if (n.node_id != rdzv_->node_id()) peers.push_back(n.node_id);
      rdzv::linger(*store, keys_, round_->round, peers, linger);
    }
  } catch (const std::exception& e) {
    spdlog::warn("could not tell the other nodes that this one stops: {}", e.what());
  }
}

bool ElasticRendezvous::exit_barrier() {
  // torchrun's exit barrier: wait (300 s, or close_timeout if longer) for
  // every node's outcome, in slices, so that a peer found dead by KeepAlive
  // or a lost store ends the wait at once instead of at the deadline.
  using Clock = std::chrono::steady_clock;
  const Duration limit = std::max(rdzv_->options().close_timeout, Duration(300000));
  const auto deadline = Clock::now() + limit;
  const int64_t r = round_->round;
  // Every member's outcome: their list, read here (a round's formation
  // gives each node its own assignment only, rendezvous.h).
  const auto members = rdzv::read_members(*control_, keys_, *round_);
  std::vector<std::string> nodes;
  for (const auto& n : members) nodes.push_back(n.node_id);
  control_->set(keys_.outcome(r, rdzv_->node_id()), rdzv::outcome_ok());
  spdlog::info("local workers succeeded; waiting for the other nodes to finish");
  std::string store_error;
  for (;;) {
    auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    try {
      if (auto all_ok = rdzv::outcomes_within(*control_, keys_, r, nodes,
                                              std::clamp(left, Duration(1), Duration(1000))))
        return *all_ok;
      store_error.clear();  // reachable again: the deadline's report names the missing nodes
    } catch (const rdzv::AuthError&) {
      throw;
    } catch (const rdzv::StoreError& e) {
      // The store is unreachable for now (a reconnect is bounded by the
      // slice): the KeepAlive decides when it is lost (below), so the
      // reason is the same as anywhere else in the round.
      if (canceller_->cancelled()) throw;
      store_error = e.what();
    }
    {
      base::MutexLock lock(mu_);
      if (remote_end_ && (remote_end_->kind == rdzv::RoundEnd::kPeerDead ||
                          remote_end_->kind == rdzv::RoundEnd::kStoreLost))
        throw RendezvousError("while waiting for the other nodes to finish: " +
                              fail_request(*remote_end_).reason);
    }
    if (Clock::now() >= deadline) {
      if (!store_error.empty())
        throw RendezvousError("no outcome within " + std::to_string(limit.count() / 1000) +
                              " s: " + store_error);
      std::string missing;
      for (size_t i = 0; i < nodes.size(); ++i)
        if (!control_->check({keys_.outcome(r, nodes[i])}))
          missing += " " + members[i].node_id + " at " + members[i].addr;
      throw RendezvousError("no outcome within " + std::to_string(limit.count() / 1000) +
                            " s from" + missing);
    }
  }
}

GroupVerdict ElasticRendezvous::group_ended(GroupOutcome outcome) {
  if (notifier_.joinable()) notifier_.join();
  control_attempt_ = nullptr;
  // On the way out, reports of this round still queued in the loop become
  // stale: the next join runs on another thread and must not race them.
  struct Bump {
    ElasticRendezvous* self;
    ~Bump() {
      base::MutexLock lock(self->mu_);
      ++self->generation_;
    }
  } bump{this};
  std::optional<rdzv::RoundEnd> end;
  {
    base::MutexLock lock(mu_);
    end = remote_end_;
  }
  auto record_failed = [&] {
    try {
      control_->set(keys_.outcome(round_->round, rdzv_->node_id()), rdzv::outcome_failed());
    } catch (const std::exception&) {
    }
  };
  if (outcome == GroupOutcome::kInterrupted) {
    keep_alive_.reset();
    record_failed();
    return {};
  }
  if (outcome == GroupOutcome::kSucceeded) {
    // Heartbeats go on while waiting for the other nodes' outcomes.
    bool all_ok = false;
    try {
      all_ok = exit_barrier();
    } catch (const std::exception& e) {
      // Abandoned by a stop signal: the keep-alive's connection stays for
      // the farewell (the destructor), the one this node's others were not.
      if (!canceller_->cancelled()) keep_alive_.reset();
      throw RendezvousError(e.what());
    }
    keep_alive_.reset();
    drain_ = true;
    if (all_ok) return {GroupVerdict::kExit, 0, ""};
    // Another node failed in this round: the job restarts or fails as one.
    rdzv::RoundEnd why;
    why.reason = "another node's workers failed";
    try {
      if (auto ended = rdzv::read_end(*control_, keys_, round_->round)) why = *ended;
      if (why.store_closes) {
        store_closed_ = true;
        return {GroupVerdict::kExit, why.exit_status, why.reason};
      }
      int64_t count = rdzv_->restart_count();
      if (count <= options_.max_restarts) return {GroupVerdict::kRestart, 0, why.reason};
    } catch (const std::exception& e) {
      throw RendezvousError(e.what());
    }
    return {GroupVerdict::kExit, why.exit_status > 0 ? why.exit_status : 1,
            why.reason + "; restart limit reached"};
  }
  // kFailed: stop heartbeating, tell nodes waiting in finish(), then decide.
  keep_alive_.reset();
  // A lost store outranks this node's own failure: the workers may have
  // failed because the store's host died with its ranks (a collective
  // broke) before the keep-alive saw the store go.
  const bool lost = end && end->kind == rdzv::RoundEnd::kStoreLost;
  // The host stopped on purpose (a signal) and its store goes with it: the
  // job ends with it (below), no successor takes over.
  const bool host_left = end && end->store_closes;
  if (local_end_ && !lost && (!end || end->kind != rdzv::RoundEnd::kScaleUp)) end = local_end_;
  // With no restart left the job ends here whatever the store does (its
  // host may have ended it already): the restart policy says how, below.
  if (!lost && !host_left && !host_ && round_ && round_->successor && restart_left() &&
      probe_store_port(Duration(1000)) == Reach::kGone) {
    end = rdzv::RoundEnd{};
    end->kind = rdzv::RoundEnd::kStoreLost;
    end->store_gone = true;
    end->reason = "store at " + store_addr_ + " is gone: its host refuses connections";
  }
  if (end && end->kind == rdzv::RoundEnd::kStoreLost) return after_store_lost(*end);
  record_failed();
  if (end && end->kind == rdzv::RoundEnd::kScaleUp) return {GroupVerdict::kRestart, 0, end->reason};
  // The store's host stopped and its store goes with it: no round to join.
  store_closed_ = end && end->store_closes && end->node != rdzv_->node_id();
  if (store_closed_)
    return {GroupVerdict::kExit, end->exit_status > 0 ? end->exit_status : 1,
            fail_request(*end).reason + "; the job ends with it (it hosted the store)"};
  return {};  // the restart policy decides, on the job-wide restart count
}

}  // namespace ddprun::agent
