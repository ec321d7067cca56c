// KeepAlive: heartbeats one round and watches it (see rendezvous.h).
#include <spdlog/spdlog.h>

#include <map>

#include "rendezvous/job_protocol.h"
#include "rendezvous/peer_watch.h"
#include "rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

namespace {
using Clock = std::chrono::steady_clock;
// The watcher's longest blocking call, so destruction is prompt.
constexpr Duration kMaxBlock{500};
// How often a watcher applies ended members' notices where the store
// leaves that to the participants (settle_closed).
constexpr Duration kSettleSlice{100};

RoundEnd store_lost(const std::string& why, bool gone = false) {
  RoundEnd e;
  e.kind = RoundEnd::kStoreLost;
  e.reason = why;
  e.store_gone = gone;
  return e;
}
}  // namespace

KeepAlive::KeepAlive(std::unique_ptr<Store> store, const Rendezvous& rdzv, RoundResult round,
                     std::function<void(const RoundEnd&)> on_end)
    : store_(std::move(store)),
      options_(rdzv.options()),
      keys_(rdzv.keys()),
      prefix_(keys_.round(round.round)),
      round_(std::move(round)),
      on_end_(std::move(on_end)) {
  // The store learns which connection carries this node's heartbeats: if
  // it closes while the round runs (the agent was killed, its host lost the
  // link), the store ends the round at once, marks this node dead and
  // counts the restart, so the peers need not wait out the keep-alive
  // window. The heartbeats stay for deaths a socket does not show.
  RoundEnd death;
  death.kind = RoundEnd::kPeerDead;
  death.node = options_.node_id;
  death.reason = "node " + options_.node_id + " at " + options_.local_addr +
                 " (group rank " + std::to_string(round_.group_rank) + ") " +
                 std::string(kConnectionClosed) + " (its agent died or lost the link)";
  // A reply may take the whole window (interval x max_attempt) before the
  // store counts as lost, not the client's default grace: loss the settings
  // allow must not end the job. Set first: etcd's lease TTL is this window.
  store_->set_reply_window(options_.keep_alive_interval * options_.keep_alive_max_attempt);
  try {
    on_close_armed_ = store_->set_on_close(
        {keys_.end(round_.round), keys_.dead(round_.round, options_.node_id), keys_.dead_closed(round_.round)},
        {encode_round_end(death), to_bytes("1"), to_bytes(options_.node_id)}, keys_.restarts());
  } catch (const StoreError& e) {
    spdlog::debug("rendezvous '{}': no death notice on close: {}", options_.run_id, e.what());
  }
  thread_ = std::thread([this] { run(); });
}

KeepAlive::~KeepAlive() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  // Leaving on purpose is no death: disarm before the connection closes,
  // even once the round's end is written (the notice still marks the
  // member dead then, store.h, and the next round would not wait for it).
  if (!on_close_armed_) return;
  try {
    store_->set_on_close({}, {}, "");
  } catch (const std::exception& e) {
    // The connection is gone already, and with it the armed writes (which
    // find the round ended, or end it as a lost member would).
    spdlog::debug("rendezvous '{}': disarming the death notice: {}", options_.run_id, e.what());
  }
}

void KeepAlive::run() {
  const std::string my_hb = keys_.heartbeat(round_.round, options_.node_id);
  const Duration dead_after = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  // The peers the closer assigned this node (its successors in group-rank
  // order, kWatchedPeers of them): every node is watched by that many.
  std::vector<std::string> peer_keys;
  std::vector<const NodeInfo*> peers;
  std::vector<int> peer_rank;
  for (const auto& p : round_.watched) {
    peer_keys.push_back(keys_.heartbeat(round_.round, p.node.node_id));
    peers.push_back(&p.node);
    peer_rank.push_back(p.group_rank);
  }
  PeerWatch watch(peers.size(), dead_after, Clock::now());
  BeatSchedule beats(options_.keep_alive_interval, Clock::now());

  auto end = [&](RoundEnd e) {
    if (!stop_) on_end_(e);
  };
  try {
    while (!stop_) {
      auto now = Clock::now();
      if (beats.due(now)) {
        store_->add(my_hb, 1);
        beats.beaten(now);
        if (!peer_keys.empty()) {
          auto values = store_->multi_get(peer_keys, kMaxBlock);
          now = Clock::now();
          if (auto dead = watch.update(values, now)) {
            const size_t i = *dead;
            auto silent = watch.silent_for(i, now);
            RoundEnd dead_end;
            dead_end.kind = RoundEnd::kPeerDead;
            dead_end.node = peers[i]->node_id;
            // The reporter's id in the reason: two watchers writing the same
            // record would both see their own value and both count a restart.
            dead_end.reason = "node " + peers[i]->node_id + " at " + peers[i]->addr +
                              " (group rank " + std::to_string(peer_rank[i]) +
                              ") missed heartbeats for " + std::to_string(silent.count()) +
                              " ms (seen by " + options_.node_id + ")";
            // Marked dead first (it is, whoever ends the round): the next
            // round then closes as soon as the live members are back.
            store_->set(keys_.dead(round_.round, peers[i]->node_id), to_bytes("1"));
            store_->append(keys_.dead_seen(round_.round), to_bytes(peers[i]->node_id + "\n"));
            if (publish_end(*store_, keys_, round_.round, dead_end)) {
              spdlog::warn("rendezvous '{}': {}", options_.run_id, dead_end.reason);
              return end(dead_end);
            }
            // Someone else ended the round first: report theirs below.
          }
        }
      }
      // Where members' death notices wait for a participant to apply them
      // (etcd: an ended lease), every watcher looks for them often.
      const bool settles = store_->settle_closed(prefix_);
      auto wait = std::min(settles ? kSettleSlice : kMaxBlock,
                           std::chrono::duration_cast<Duration>(beats.next() - Clock::now()));
      if (wait.count() < 1) wait = Duration(1);
      try {
        // Read with an acknowledgement: a host that stops lingers for it
        // before its store goes (farewell).
        RoundEnd e;
        try {
          e = await_end(*store_, keys_, round_.round, options_.node_id, wait);
        } catch (const RecordError& bad) {
          e.kind = RoundEnd::kFailed;
          e.reason = std::string("the round ended with a record this node cannot read: ") + bad.what();
        }
        return end(e);
      } catch (const TimeoutError&) {
        // the round goes on
      }
    }
  } catch (const StoreGoneError& e) {
    return end(store_lost(e.what(), true));
  } catch (const StoreError& e) {
    return end(store_lost(e.what()));
  } catch (const TimeoutError& e) {
    return end(store_lost(e.what()));
  }
}

}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {

bool KeepAlive::farewell(const std::optional<RoundEnd>& end, bool host, Duration linger_limit) {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  try {
    if (end && !publish_end(*store_, keys_, round_.round, *end)) return false;
    if (host) {
      // The host waits for every member: their list (O(N), one node).
      std::vector<std::string> peers;
      for (const auto& n : read_members(*store_, keys_, round_))
        if (n.node_id != options_.node_id) peers.push_back(n.node_id);
      linger(*store_, keys_, round_.round, peers, linger_limit);
    }
    return true;
  } catch (const std::exception& e) {
    spdlog::warn("rendezvous '{}': could not tell the other nodes that this one stops: {}",
                 options_.run_id, e.what());
    return false;
  }
}

}  // namespace ddprun::rendezvous
