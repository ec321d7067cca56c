// KeepAlive: heartbeats one round and watches it (see rendezvous.h).
#include <spdlog/spdlog.h>

#include <map>

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
// Peers each node watches: its successors in group-rank order, in a ring.
// Every node is watched by this many, and one watcher ending the round is
// enough; watching all N-1 peers made each beat read N-1 counters, O(N^2)
// bytes a beat across the job (at 4,096 nodes, 16 M keys every interval).
constexpr size_t kWatchedPeers = 4;
}  // namespace

KeepAlive::KeepAlive(std::unique_ptr<Store> store, const Rendezvous& rdzv, RoundResult round,
                     std::function<void(const RoundEnd&)> on_end)
    : store_(std::move(store)),
      options_(rdzv.options()),
      prefix_(rdzv.round_key(round.round, "")),
      restarts_key_(rdzv.key("restarts")),
      round_(std::move(round)),
      on_end_(std::move(on_end)) {
  // The store learns which connection carries this node's heartbeats: if
  // it closes while the round runs (the agent was killed, its host lost the
  // link), the store ends the round at once, marks this node dead and
  // counts the restart, so the peers need not wait out the keep-alive
  // window. The heartbeats stay for deaths a socket does not show.
  const NodeInfo* me = nullptr;
  for (const auto& n : round_.nodes)
    if (n.node_id == options_.node_id) me = &n;
  std::string reason = "node " + options_.node_id + " at " + (me ? me->addr : options_.local_addr) +
                       " (group rank " + std::to_string(round_.group_rank) + ") " +
                       std::string(kConnectionClosed) + " (its agent died or lost the link)";
  // A reply may take the whole window (interval x max_attempt) before the
  // store counts as lost, not the client's default grace: loss the settings
  // allow must not end the job. Set first: etcd's lease TTL is this window.
  store_->set_reply_window(options_.keep_alive_interval * options_.keep_alive_max_attempt);
  try {
    on_close_armed_ = store_->set_on_close(
        {prefix_ + "end", prefix_ + "dead/" + options_.node_id, prefix_ + "dead_closed"},
        {to_bytes("failed: " + reason), to_bytes("1"), to_bytes(options_.node_id)}, restarts_key_);
  } catch (const StoreError& e) {
    spdlog::debug("rendezvous '{}': no death notice on close: {}", options_.run_id, e.what());
  }
  thread_ = std::thread([this] { run(); });
}

KeepAlive::~KeepAlive() {
  stop_ = true;
  thread_.join();
  // Leaving on purpose is no death: disarm before the connection closes.
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
  const std::string end_key = prefix_ + "end";
  const std::string my_hb = prefix_ + "hb/" + options_.node_id;
  const Duration dead_after = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  std::vector<std::string> peer_keys;
  std::vector<const NodeInfo*> peers;
  std::vector<size_t> peer_rank;
  const size_t n = round_.nodes.size();
  const size_t me = static_cast<size_t>(round_.group_rank) < n ? round_.group_rank : 0;
  for (size_t step = 1; step < n && step <= kWatchedPeers; ++step) {
    const size_t i = (me + step) % n;
    peer_keys.push_back(prefix_ + "hb/" + round_.nodes[i].node_id);
    peers.push_back(&round_.nodes[i]);
    peer_rank.push_back(i);
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
            std::string reason = "node " + peers[i]->node_id + " at " + peers[i]->addr +
                                 " (group rank " + std::to_string(peer_rank[i]) +
                                 ") missed heartbeats for " + std::to_string(silent.count()) +
                                 " ms (seen by " + options_.node_id + ")";
            // The reporter's id keeps `desired` unique: two watchers with the
            // same text would both see their own value and both count a restart.
            // Marked dead first (it is, whoever ends the round): the next
            // round then closes as soon as the live members are back.
            store_->set(prefix_ + "dead/" + peers[i]->node_id, to_bytes("1"));
            store_->append(prefix_ + "dead_seen", to_bytes(peers[i]->node_id + "\n"));
            Bytes desired = to_bytes("failed: " + reason);
            Bytes after = store_->compare_set(end_key, {}, desired);
            if (after == desired) {
              store_->add(restarts_key_, 1);
              spdlog::warn("rendezvous '{}': {}", options_.run_id, reason);
              return end({RoundEnd::kPeerDead, reason});
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
        std::string why = to_string(store_->get(end_key, wait));
        RoundEnd e;
        e.reason = why.rfind("failed: ", 0) == 0 ? why.substr(8) : why;
        if (why.rfind("scale-up", 0) == 0) e.kind = RoundEnd::kScaleUp;
        else if (why.find("missed heartbeats") != std::string::npos ||
                 why.find(kConnectionClosed) != std::string::npos)
          e.kind = RoundEnd::kPeerDead;
        else e.kind = RoundEnd::kFailed;
        // Read: a host that stops waits for this before its store goes
        // (agent/elastic_rendezvous.cc, farewell).
        try {
          store_->set(prefix_ + "end_seen/" + options_.node_id, to_bytes("1"));
        } catch (const StoreError&) {
        }
        return end(e);
      } catch (const TimeoutError&) {
        // the round goes on
      }
    }
  } catch (const StoreError& e) {
    return end({RoundEnd::kStoreLost, e.what()});
  } catch (const TimeoutError& e) {
    return end({RoundEnd::kStoreLost, e.what()});
  }
}

}  // namespace ddprun::rendezvous
