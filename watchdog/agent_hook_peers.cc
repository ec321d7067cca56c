// WatchdogHook's side of the other nodes: the guards each node shares
// (peer_guards.h) and, with --restart-scope=rank, a hang blamed on the node
// whose rank stopped first (peer_stall.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "watchdog/agent_hook.h"
#include "watchdog/peer_stall.h"

namespace ddprun::watchdog {

void WatchdogHook::share_guards(const agent::AttemptInfo& attempt) {
  peers_.reset();
  ++peers_generation_;
  shared_ = {};
  peer_stalls_.clear();
  const auto& round = attempt.round;
  // Learned timeouts judge sections job-wide; rank scope also asks the
  // other nodes before blaming a rank of this node's (defer_hang).
  if (!(dog_->learning() || options_.rank_scope) || round.group_world_size < 2 ||
      round.store_addr.empty())
    return;
  auto changed = [this, alive = alive_.token(),
                  generation = peers_generation_](std::vector<NodeGuards> fresh) {
    boost::asio::post(io_, [this, alive, generation, fresh = std::move(fresh)] {
      if (!alive || generation != peers_generation_ || !dog_) return;
      for (const auto& n : fresh) on_peer_record(n);
    });
  };
  try {
    peers_ = open_peers_(GuardPlace{round.store_addr, round.store_token, round.store_prefix,
                                    round.group_rank, round.group_world_size},
                         std::move(changed));
  } catch (const std::exception& e) {
    spdlog::warn("sections are judged on this node only in attempt {}: {}", attempt_, e.what());
    return;
  }
  dog_->on_guards_changed([this](const std::vector<Guard>& g) { publish_guards(g); });
}

void WatchdogHook::on_peer_record(const NodeGuards& read) {
  const NodeRecord& n = read.record;
  const int node = read.node;
  // Time left by the other node's clock, from when we read it: a record
  // that is not renewed keeps this bound (PeerGuards says why).
  const auto now = clock_.now();
  std::vector<Guard> guards;
  for (const auto& g : n.guards) {
    Guard x;
    x.rank = g.rank;
    x.section = g.section;
    x.until = now + g.remaining;
    guards.push_back(std::move(x));
  }
  note_peer_sections(node, guards);
  dog_->on_peer_guards(node, std::move(guards));

  if (!replaces_culprit()) return;
  if (n.stall) {
    peer_stalls_[node] = *n.stall;
  } else {
    peer_stalls_.erase(node);
  }
  if (n.stall && held_hang_) {
    // Both nodes hold a hang: the one whose rank is behind acts.
    const auto& workers = dog_->workers();
    const int mine = shared_.stall ? shared_.stall->rank : -1;
    auto w = std::find_if(workers.begin(), workers.end(), [&](const auto& x) { return x.global_rank == mine; });
    if (w != workers.end() && w->step < n.stall->step)
      end_deferral(true, fmt::format("node {}'s ranks stalled further on (rank {} at step {})", node,
                                     n.stall->rank, n.stall->step));
  } else if (n.stall && !dog_->fired()) {
    const auto behind = local_ranks_behind(dog_->workers(), *n.stall, now);
    if (!behind.empty()) {
      const auto& w = *std::find_if(dog_->workers().begin(), dog_->workers().end(),
                                    [&](const auto& x) { return x.local_rank == behind.front(); });
      dog_->blame(w.local_rank, node,
                  fmt::format("behind node {}'s stalled ranks: last step {}, silent {:.2f} s, while node "
                              "{}'s rank {} waits at step {} (silent {:.2f} s there)",
                              node, w.step, std::chrono::duration<double>(silent_for(w, now)).count(),
                              node, n.stall->rank, n.stall->step,
                              std::chrono::duration<double>(n.stall->silent).count()));
    }
  }
  if (!n.blamed.empty() && held_hang_ && !held_for_peer_) {
    // That node acts on a rank of its own: wait for the generation it opens
    // (once: a later record of that node must not push the bound again).
    held_for_peer_ = true;
    spdlog::info("node {} acts on its hung rank {}: the ranks here wait for its replacement (up to {} s)",
                 node, n.blamed.front(), kAwaitPeerGeneration.count() / 1000);
    held_timer_->arm(now + kAwaitPeerGeneration, [this, node] {
      end_deferral(true, fmt::format("node {} named a rank of its own but opened no generation within {} s",
                                     node, kAwaitPeerGeneration.count() / 1000));
    });
  }
}

bool WatchdogHook::defer_hang(const HangEvent& event) {
  if (!replaces_culprit() || !peers_ || event.peer_node >= 0) return false;
  const int culprit = dog_->culprit(event);
  const auto& workers = dog_->workers();
  auto w = std::find_if(workers.begin(), workers.end(), [&](const auto& x) { return x.global_rank == culprit; });
  // A rank that never beat has no step to compare.
  if (w == workers.end() || w->beats == 0 || w->step < 0) return false;
  for (const auto& [node, stall] : peer_stalls_)
    if (stall.step > w->step) return false;  // stalled further on there: ours is behind
  const auto now = clock_.now();
  shared_.stall = PeerStall{culprit, w->step, silent_for(*w, now)};
  peers_->publish(shared_);
  held_hang_ = event;
  held_for_peer_ = false;
  if (!held_timer_) held_timer_ = clock_.make_timer();
  held_timer_->arm(now + kAskPeers, [this] {
    end_deferral(true, fmt::format("no other node has a rank behind it within {:.0f} s",
                                   std::chrono::duration<double>(kAskPeers).count()));
  });
  spdlog::info("rank {} stalled at step {} ({}); asking the other nodes whether a rank of theirs "
               "stopped first (up to {:.0f} s)",
               culprit, w->step, event.detail, std::chrono::duration<double>(kAskPeers).count());
  if (events_)
    events_->write("hang_held", attempt_, {culprit}, event.detail, {{"step", w->step}});
  return true;
}

void WatchdogHook::end_deferral(bool act, const std::string& why) {
  if (!held_hang_) return;
  const HangEvent event = *held_hang_;
  held_hang_.reset();
  if (held_timer_) held_timer_->cancel();
  shared_.stall.reset();
  if (peers_) peers_->publish(shared_);
  if (!act) {
    spdlog::info("rank {}'s stall is explained: {}; watching on", event.global_rank, why);
    if (dog_) dog_->withdraw();
    return;
  }
  spdlog::info("acting on rank {}'s stall: {}", event.global_rank, why);
  act_on_hang(event);
}

void WatchdogHook::say_blamed(int rank) {
  if (!peers_ || !options_.rank_scope) return;
  shared_.stall.reset();
  shared_.blamed = {rank};
  peers_->publish(shared_);
}

void WatchdogHook::note_peer_sections(int node, const std::vector<Guard>& guards) {
  // Said when this node's ranks start waiting for other nodes' sections,
  // not for each one: with every rank saving (torch.distributed.checkpoint)
  // a checkpoint would be a line per rank of the job.
  auto is_section = [](const Guard& g) { return g.section != TimeoutLearner::kSetup; };
  const auto before = dog_->peer_guards();
  if (std::any_of(before.begin(), before.end(), is_section)) return;
  const auto g = std::find_if(guards.begin(), guards.end(), is_section);
  if (g == guards.end()) return;
  const double left = std::chrono::duration<double>(g->until - clock_.now()).count();
  const std::string line = fmt::format(
      "node {}'s rank {} is inside section \"{}\": ranks here waiting for it are not hung "
      "(for up to {:.0f} s, its timeout there)", node, g->rank, g->section, left);
  // Once per job on the console (a checkpoint every few minutes would
  // repeat it), and not for the end of the job (the bootstrap's
  // "teardown"); every time in the event log.
  if (!said_peer_section_ && g->section != "teardown") {
    spdlog::info("{}", line);
    said_peer_section_ = true;
  }
  if (events_)
    events_->write("peer_section", attempt_, all_ranks(), line,
                   {{"node", node}, {"rank", g->rank}, {"section", g->section}, {"left_s", left}});
}

void WatchdogHook::publish_guards(const std::vector<Guard>& guards) {
  if (!peers_) return;
  const auto now = clock_.now();
  std::vector<SharedGuard> out;
  for (const auto& g : guards) {
    const auto left = std::chrono::duration_cast<Millis>(g.until - now);
    if (left.count() > 0) out.push_back({g.rank, g.section, left});
  }
  shared_.guards = std::move(out);
  peers_->publish(shared_);
}

}  // namespace ddprun::watchdog
