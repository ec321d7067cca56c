#include "introspect/node_board.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>

#include <unistd.h>

#include "rendezvous/canceller.h"
#include "rendezvous/lazy_client.h"

namespace ddprun::introspect {

namespace rdzv = ddprun::rendezvous;

std::string board_key(const std::string& store_prefix, int node) {
  return store_prefix + "node/" + std::to_string(node);
}

NodeBoard::NodeBoard(BoardPlace place, Requested on_request)
    : place_(std::move(place)),
      canceller_(std::make_shared<rdzv::Canceller>()),
      on_request_(std::move(on_request)) {
  // A call blocked on a store that is gone returns at the cancel.
  service_.start([this] { run(); }, [c = canceller_] { c->cancel(); });
}

NodeBoard::~NodeBoard() {
  service_.stop();
  // Requests still waiting get an answer: their callers must not hang.
  for (auto& done : waiting_) done({}, "the round ended before the other nodes were read");
  for (auto& ask : new_asks_) ask.done({}, {"the round ended before the other nodes were asked"});
}

std::string NodeBoard::key(const std::string& name) const {
  return place_.store_prefix + name;
}

void NodeBoard::ask_stacks(int rank, Asked done) {
  service_.hand_over([&] {
    Ask a;
    a.rank = rank;
    a.done = std::move(done);
    new_asks_.push_back(std::move(a));
  });
}

void NodeBoard::answer(const std::string& id, nlohmann::json reply) {
  service_.hand_over([&] { answers_.emplace_back(id, std::move(reply)); });
}

void NodeBoard::publish(nlohmann::json status) {
  service_.hand_over([&] {
    entry_ = std::move(status);
    has_entry_ = true;
  });
}

void NodeBoard::fetch(Fetched done) {
  service_.hand_over([&] { waiting_.push_back(std::move(done)); });
}

void NodeBoard::run() {
  rdzv::LazyStore store([this] { return place_.open_store(kStoreDeadline, canceller_); }, canceller_,
                        [](const std::string& error) { spdlog::debug("status board: {}", error); });
  using SteadyClock = std::chrono::steady_clock;
  std::vector<Ask> asks;       // sent, waiting for replies
  int64_t seen_requests = 0;   // this node's requests handed on so far
  uint64_t asked = 0;
  auto next_poll = SteadyClock::now();
  for (;;) {
    nlohmann::json entry;
    bool have_entry = false;
    std::vector<Fetched> waiting;
    std::vector<Ask> fresh;
    std::vector<std::pair<std::string, nlohmann::json>> answers;
    // Requests from other nodes are looked for once a second, replies to
    // our own asks every 100 ms while some are out.
    const auto wake = asks.empty() ? next_poll : SteadyClock::now() + std::chrono::milliseconds(100);
    const bool go_on = service_.wait_until(
        wake,
        [&] { return has_entry_ || !waiting_.empty() || !new_asks_.empty() || !answers_.empty(); },
        [&] {
          if (has_entry_) {
            entry = std::move(entry_);
            has_entry_ = false;
            have_entry = true;
          }
          waiting.swap(waiting_);
          fresh.swap(new_asks_);
          answers.swap(answers_);
        });
    if (!go_on) break;
    if (have_entry) {
      entry["node"] = place_.node;
      entry["published_unix"] =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      const std::string text = entry.dump();
      store.call([&](rdzv::Store& c) {
        c.set(board_key(place_.store_prefix, place_.node), rdzv::to_bytes(text));
      });
    }
    for (auto& [id, reply] : answers) {
      const std::string text = reply.dump();
      store.call([&](rdzv::Store& c) {
        c.set(key("stacks/reply/" + id + "/" + std::to_string(place_.node)), rdzv::to_bytes(text));
      });
    }
    for (auto& a : fresh) {
      a.id = std::to_string(::getpid()) + "-" + std::to_string(place_.node) + "-" +
             std::to_string(++asked);
      a.deadline = SteadyClock::now() + kAskDeadline;
      const std::string request = nlohmann::json{{"id", a.id}, {"rank", a.rank}}.dump();
      for (int n = 0; n < place_.nodes; ++n) {
        if (n == place_.node) continue;
        const bool sent = store.call([&](rdzv::Store& c) {
          const int64_t seq = c.add(key("stacks/count/" + std::to_string(n)), 1);
          c.set(key("stacks/req/" + std::to_string(n) + "/" + std::to_string(seq)),
                rdzv::to_bytes(request));
        });
        if (sent) a.left.push_back(n);
        else a.replies.push_back({{"node", n}, {"error", "could not ask it: " + store.last_error()}});
      }
      asks.push_back(std::move(a));
    }
    if (SteadyClock::now() >= next_poll) {
      next_poll = SteadyClock::now() + std::chrono::seconds(1);
      const std::string count_key = key("stacks/count/" + std::to_string(place_.node));
      int64_t count = seen_requests;
      store.call([&](rdzv::Store& c) { count = c.add(count_key, 0); });
      for (; seen_requests < count; ++seen_requests) {
        rdzv::Bytes value;
        const std::string req_key = key("stacks/req/" + std::to_string(place_.node) + "/" +
                                        std::to_string(seen_requests + 1));
        // The asker counts first and writes the request right after.
        if (!store.call([&](rdzv::Store& c) { value = c.get(req_key, kStoreDeadline); })) break;
        try {
          on_request_(nlohmann::json::parse(rdzv::to_string(value)));
        } catch (const std::exception& e) {
          spdlog::debug("status board: request {}: {}", req_key, e.what());
        }
      }
    }
    for (auto it = asks.begin(); it != asks.end();) {
      Ask& a = *it;
      for (auto n = a.left.begin(); n != a.left.end();) {
        const std::string reply_key = key("stacks/reply/" + a.id + "/" + std::to_string(*n));
        bool present = false;
        rdzv::Bytes value;
        store.call([&](rdzv::Store& c) {
          present = c.check({reply_key});
          if (present) value = c.get(reply_key, std::chrono::milliseconds(0));
        });
        if (!present) {
          ++n;
          continue;
        }
        try {
          auto r = nlohmann::json::parse(rdzv::to_string(value));
          r["node"] = *n;
          a.replies.push_back(std::move(r));
        } catch (const std::exception& e) {
          a.replies.push_back({{"node", *n}, {"error", std::string("malformed reply: ") + e.what()}});
        }
        n = a.left.erase(n);
      }
      if (!a.left.empty() && SteadyClock::now() < a.deadline) {
        ++it;
        continue;
      }
      std::vector<std::string> errors;
      for (int n : a.left)
        errors.push_back("node " + std::to_string(n) + " did not answer within " +
                         std::to_string(kAskDeadline.count()) + " s");
      a.done(std::move(a.replies), std::move(errors));
      it = asks.erase(it);
    }
    if (waiting.empty()) continue;
    std::vector<nlohmann::json> peers;
    std::string error;
    for (int n = 0; n < place_.nodes; ++n) {
      if (n == place_.node) continue;
      const std::string key = board_key(place_.store_prefix, n);
      bool present = false;
      rdzv::Bytes value;
      const bool ok = store.call([&](rdzv::Store& c) {
        // A node that has not published yet is left out, not waited for.
        present = c.check({key});
        if (present) value = c.get(key, std::chrono::milliseconds(0));
      });
      if (!ok) {
        error = "the job's store at " + place_.store_name + ": " + store.last_error();
        break;
      }
      if (!present) continue;
      try {
        peers.push_back(nlohmann::json::parse(rdzv::to_string(value)));
      } catch (const std::exception& e) {
        error = "node " + std::to_string(n) + "'s entry is not JSON: " + e.what();
      }
    }
    const double now_unix =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (auto& p : peers) {
      // By this node's clock: meaningful when the clocks agree (ddprun doctor's clock check).
      if (p.contains("published_unix") && p["published_unix"].is_number())
        p["age_s"] = now_unix - p["published_unix"].get<double>();
    }
    for (auto& done : waiting) done(peers, error);
  }
  for (auto& a : asks) a.done(std::move(a.replies), {"the round ended before every node answered"});
}

}  // namespace ddprun::introspect
