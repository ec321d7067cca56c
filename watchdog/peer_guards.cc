#include "watchdog/peer_guards.h"

#include <spdlog/spdlog.h>

#include <map>
#include <optional>
#include <stdexcept>

#include "rendezvous/canceller.h"
#include "rendezvous/client.h"
#include "rendezvous/job_keys.h"
#include "rendezvous/lazy_client.h"
#include "rendezvous/record.h"

namespace ddprun::watchdog {

namespace rdzv = ddprun::rendezvous;

PeerGuards::PeerGuards(GuardPlace place, Changed changed)
    : place_(std::move(place)),
      changed_(std::move(changed)),
      canceller_(std::make_shared<rdzv::Canceller>()) {
  // A call blocked on a store that is gone returns at the cancel.
  service_.start([this] { run(); }, [c = canceller_] { c->cancel(); });
}

PeerGuards::~PeerGuards() { service_.stop(); }

void PeerGuards::publish(NodeRecord record) {
  service_.hand_over([&] {
    entry_ = std::move(record);
    has_entry_ = true;
  });
}

void PeerGuards::run() {
  auto store = rdzv::LazyStore::tcp(
      place_.store_addr, place_.store_token, kStoreDeadline, canceller_,
      [&](const std::string& error) {
        spdlog::warn("cannot share sections with the other nodes through the store at {} "
                     "(retrying): {}", place_.store_addr, error);
      });
  using Steady = std::chrono::steady_clock;
  const rdzv::GuardKeys keys(place_.store_prefix);
  const std::string changes_key = keys.changes();
  uint64_t seq = 0;
  std::optional<rdzv::Bytes> unsent;  // our newest record, until the store has it
  bool bump_due = false;              // the counter still needs our bump
  int64_t seen_changes = -1;
  std::map<int, uint64_t> seen_seq;  // by node
  auto next_poll = Steady::now();
  for (;;) {
    if (!service_.wait_until(next_poll, [&] { return has_entry_; }, [&] {
          if (!has_entry_) return;
          has_entry_ = false;
          try {
            unsent = encode_guards(++seq, entry_);
          } catch (const rdzv::RecordError& e) {  // a bug: say it, keep the thread
            spdlog::error("watchdog: this node's sections cannot be shared: {}", e.what());
          }
        }))
      break;
    if (unsent && store.call([&](rdzv::Store& c) {
          c.set(keys.node(place_.node), *unsent);
        })) {
      unsent.reset();
      bump_due = true;
    }
    // add() is not retried by the client (a lost reply may have counted):
    // bumped again at the next poll, at worst one needless read for the peers.
    if (bump_due && store.call([&](rdzv::Store& c) { c.add(changes_key, 1); })) bump_due = false;
    if (Steady::now() < next_poll) continue;
    next_poll = Steady::now() + kPollInterval;
    int64_t changes = seen_changes;
    if (!store.call([&](rdzv::Store& c) { changes = c.add(changes_key, 0); })) continue;
    if (changes == seen_changes) continue;
    bool all_read = true;
    std::vector<NodeGuards> fresh;
    for (int n = 0; n < place_.nodes; ++n) {
      if (n == place_.node) continue;
      const std::string key = keys.node(n);
      bool present = false;
      rdzv::Bytes value;
      if (!store.call([&](rdzv::Store& c) {
            // A node that has not published yet is left out, not waited for.
            present = c.check({key});
            if (present) value = c.get(key, std::chrono::milliseconds(0));
          })) {
        all_read = false;
        break;
      }
      if (!present) continue;
      try {
        auto g = decode_guards(n, value);
        auto [it, first] = seen_seq.emplace(n, g.seq);
        if (!first && it->second == g.seq) continue;  // unchanged: its times stand
        it->second = g.seq;
        fresh.push_back(std::move(g));
      } catch (const rdzv::RecordError& e) {
        spdlog::debug("{}", e.what());
      }
    }
    // Read again at the next poll when some record could not be.
    if (all_read) seen_changes = changes;
    if (!fresh.empty()) changed_(std::move(fresh));
  }
}

}  // namespace ddprun::watchdog
