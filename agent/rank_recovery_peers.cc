// RankRecovery (rank_recovery.h) on several nodes: keeping
// the generation in step with the other nodes' agents (peer_recovery.h,
// docs/RECOVERY.md).
//
// This node's failure (RankRecovery::begin) also opens
// the generation in the store. Another node's record makes this node's
// survivors re-form without replacing anything here: the generation goes
// up, they get `failed` naming the other node's ranks, --recovery-timeout
// is armed. On either side, once every local rank has joined the
// generation the node says so in the store, and the recovery ends
// (`recovered`) when every node has. Whatever breaks that (two nodes
// opening the same generation, a failure on another node during a
// recovery, the agents' store lost) falls back to the group path, which
// on several nodes ends the round for every node (elastic_rendezvous.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>

#include "agent/rank_recovery.h"

namespace ddprun::agent {

bool RankRecovery::multi_node() const {
  return enabled() && place_.round.group_world_size > 1 &&
         static_cast<bool>(place_.round.open_agents_store);
}

void RankRecovery::start_peers() {
  if (!multi_node()) return;
  PeerRecovery::Place place{place_.round.open_agents_store, place_.run_id, place_.round.round,
                            place_.round.group_world_size};
  auto post = [&io = io_, alive = alive_.token()](std::function<void()> fn) {
    boost::asio::post(io, [alive, fn = std::move(fn)] {
      if (alive) fn();
    });
  };
  PeerRecovery::Handlers h;
  h.failed = [this](const rendezvous::RankFailure& f) { peer_failed(f); };
  h.published = [this](int64_t g, bool opened) { generation_published(g, opened); };
  h.formed = [this](int64_t g) { generation_formed(g); };
  h.lost = [this](const std::string& why) { peers_lost(why); };
  peers_ = std::make_unique<PeerRecovery>(std::move(place), std::move(post), std::move(h));
  peers_->watch(generation_ + 1);
}

void RankRecovery::peer_failed(const rendezvous::RankFailure& f) {
  if (!host_.running()) return;
  // The next generation's record, whoever writes it.
  peers_->watch(f.generation + 1);
  if (f.node == place_.round.node_id) return;  // ours: generation_published says how it went
  const std::string what =
      fmt::format("rank {} on node {} {}", fmt::join(f.ranks, ","), f.node,
                  f.cause == rendezvous::RankFailure::kHang ? "hung" : "failed");
  Failure root;
  root.reason = "rank-scoped recovery across nodes: " + what;
  root.exit_code = 1;
  root.when = clock_.now();
  if (recovery_ || f.generation != generation_ + 1) {
    give_up(base::recovery_wire::Fallback::kSecondFailure,
            what + " during the recovery of generation " + std::to_string(generation_),
            std::move(root));
    return;
  }
  if (restarts_left() <= 0) {
    // Its own node checked the same budget: only a job whose nodes count
    // differently gets here.
    give_up(base::recovery_wire::Fallback::kNoRestartLeft,
            what + " and no restart is left (--max-restarts=" +
                std::to_string(options_.max_restarts) + ")",
            std::move(root));
    return;
  }
  ++generation_;
  ++rank_restarts_;
  Recovery r;
  r.generation = generation_;
  r.local_rank = -1;
  r.ranks = f.ranks;
  r.cause = f.cause == rendezvous::RankFailure::kHang ? base::recovery_wire::Cause::kHang
                                                       : base::recovery_wire::Cause::kExit;
  r.began = clock_.now();
  r.spawned = true;  // the replacement is that node's to start
  r.failure = std::move(root);
  recovery_ = std::move(r);
  const std::string line =
      what + "; the ranks here re-form with its replacement, generation " +
      std::to_string(generation_) + " (--restart-scope=rank; " +
      std::to_string(std::max(0, restarts_left())) + " of " +
      std::to_string(options_.max_restarts) + " restarts left)";
  spdlog::warn("{}", line);
  announce_failure(recovery_->ranks, -1, line);
}

void RankRecovery::generation_published(int64_t g, bool opened) {
  if (opened || !host_.running() || !recovery_ || recovery_->generation != g) return;
  give_up(base::recovery_wire::Fallback::kSecondFailure,
          "another node opened generation " + std::to_string(g) +
              " first: ranks failed on two nodes at once",
          recovery_->failure);
}

void RankRecovery::generation_formed(int64_t g) {
  if (!host_.running() || !recovery_ || recovery_->generation != g ||
      !recovery_->joined_here)
    return;
  complete();
}

void RankRecovery::peers_lost(const std::string& why) {
  if (!host_.running()) return;
  // Without the store no node hears of another's failure: the group path,
  // which the round's end (the store lost) takes anyway.
  Failure root;
  if (recovery_) {
    root = recovery_->failure;
  } else {
    root.reason = "rank-scoped recovery across nodes lost the agents' store: " + why;
    root.exit_code = 1;
    root.when = clock_.now();
  }
  give_up(base::recovery_wire::Fallback::kStoreLost, "the agents' store: " + why, std::move(root));
}

}  // namespace ddprun::agent
