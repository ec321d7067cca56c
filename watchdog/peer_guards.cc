#include "watchdog/peer_guards.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <optional>
#include <stdexcept>

#include "rendezvous/canceller.h"
#include "rendezvous/client.h"
#include "rendezvous/lazy_client.h"

namespace ddprun::watchdog {

namespace rdzv = ddprun::rendezvous;

std::string encode_guards(uint64_t seq, const NodeRecord& record) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& g : record.guards)
    list.push_back({{"rank", g.rank}, {"section", g.section},
                    {"remaining_s", static_cast<double>(g.remaining.count()) / 1000.0}});
  nlohmann::json j{{"seq", seq}, {"guards", list}};
  if (record.stall)
    j["stall"] = {{"rank", record.stall->rank}, {"step", record.stall->step},
                  {"silent_s", static_cast<double>(record.stall->silent.count()) / 1000.0}};
  if (!record.blamed.empty()) j["blamed"] = record.blamed;
  return j.dump();
}

NodeGuards decode_guards(int node, const std::string& text) {
  NodeGuards out;
  out.node = node;
  try {
    const auto j = nlohmann::json::parse(text);
    out.seq = j.at("seq").get<uint64_t>();
    for (const auto& g : j.at("guards")) {
      SharedGuard s;
      s.rank = g.at("rank").get<int>();
      s.section = g.at("section").get<std::string>();
      s.remaining = std::chrono::milliseconds(
          static_cast<int64_t>(g.at("remaining_s").get<double>() * 1000.0));
      out.record.guards.push_back(std::move(s));
    }
    // Both optional: a node that says neither has no stalled rank.
    if (const auto st = j.find("stall"); st != j.end()) {
      PeerStall p;
      p.rank = st->at("rank").get<int>();
      p.step = st->at("step").get<int64_t>();
      p.silent = std::chrono::milliseconds(static_cast<int64_t>(st->at("silent_s").get<double>() * 1000.0));
      out.record.stall = p;
    }
    if (const auto b = j.find("blamed"); b != j.end()) out.record.blamed = b->get<std::vector<int>>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("node " + std::to_string(node) + "'s guard record: " + e.what());
  }
  return out;
}

namespace {

std::string key_of(const GuardPlace& p, const std::string& name) {
  return "ddprun-watchdog/" + p.store_prefix + "guards/" + name;
}

}  // namespace

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
  const std::string changes_key = key_of(place_, "changes");
  uint64_t seq = 0;
  std::optional<std::string> unsent;  // our newest record, until the store has it
  bool bump_due = false;              // the counter still needs our bump
  int64_t seen_changes = -1;
  std::map<int, uint64_t> seen_seq;  // by node
  auto next_poll = Steady::now();
  for (;;) {
    if (!service_.wait_until(next_poll, [&] { return has_entry_; }, [&] {
          if (!has_entry_) return;
          unsent = encode_guards(++seq, entry_);
          has_entry_ = false;
        }))
      break;
    if (unsent && store.call([&](rdzv::Store& c) {
          c.set(key_of(place_, std::to_string(place_.node)), rdzv::to_bytes(*unsent));
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
      const std::string key = key_of(place_, std::to_string(n));
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
        auto g = decode_guards(n, rdzv::to_string(value));
        auto [it, first] = seen_seq.emplace(n, g.seq);
        if (!first && it->second == g.seq) continue;  // unchanged: its times stand
        it->second = g.seq;
        fresh.push_back(std::move(g));
      } catch (const std::exception& e) {
        spdlog::debug("{}", e.what());
      }
    }
    // Read again at the next poll when some record could not be.
    if (all_read) seen_changes = changes;
    if (!fresh.empty()) changed_(std::move(fresh));
  }
}

}  // namespace ddprun::watchdog
