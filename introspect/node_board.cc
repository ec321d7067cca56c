#include "introspect/node_board.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>
#include <optional>

#include <unistd.h>

#include "rendezvous/canceller.h"
#include "rendezvous/record.h"

namespace ddprun::introspect {

namespace rdzv = ddprun::rendezvous;

namespace {

constexpr rdzv::RecordKind kStacksRequestRecord{"stacks request record", {'D', 'S', 'R'}, 1};
constexpr size_t kRequestHeader = 3 + 1 + 8;  // magic, version, rank
constexpr size_t kMaxRequestId = 64;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

rdzv::Bytes encode_stacks_request(const StacksRequest& request) {
  return rdzv::RecordWriter(kStacksRequestRecord)
      .i64(request.rank)
      .text(request.id, kMaxRequestId)
      .take();
}

StacksRequest decode_stacks_request(const rdzv::Bytes& bytes) {
  rdzv::RecordReader r(bytes, kStacksRequestRecord, kRequestHeader);
  StacksRequest out;
  const int64_t rank = r.i64("rank");
  if (rank < -1 || rank > std::numeric_limits<int>::max()) r.fail("rank " + std::to_string(rank));
  out.rank = static_cast<int>(rank);
  out.id = r.text(kMaxRequestId, "id");
  r.finish();
  return out;
}

NodeBoard::NodeBoard(BoardPlace place, Requested on_request)
    : place_(std::move(place)),
      keys_(place_.store_prefix),
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
  rdzv::LazyStore store([this] { return place_.open_store(kStoreDeadline, canceller_); },
                        canceller_,
                        [](const std::string& error) { spdlog::debug("status board: {}", error); });
  Loop loop;
  loop.next_poll = SteadyClock::now();
  for (;;) {
    Taken taken;
    // Requests from other nodes are looked for once a second, replies to
    // our own asks every 100 ms while some are out.
    const auto wake =
        loop.asks.empty() ? loop.next_poll : SteadyClock::now() + std::chrono::milliseconds(100);
    const bool go_on = service_.wait_until(
        wake,
        [&] { return has_entry_ || !waiting_.empty() || !new_asks_.empty() || !answers_.empty(); },
        [&] {
          if (has_entry_) {
            taken.entry = std::move(entry_);
            has_entry_ = false;
          }
          taken.waiting.swap(waiting_);
          taken.asks.swap(new_asks_);
          taken.answers.swap(answers_);
        });
    if (!go_on) break;
    if (taken.entry) publish_entry(store, std::move(*taken.entry));
    for (auto& [id, reply] : taken.answers) {
      const rdzv::Bytes text = rdzv::to_bytes(reply.dump());
      store.call([&](rdzv::Store& c) { c.set(keys_.stacks_reply(id, place_.node), text); });
    }
    for (auto& a : taken.asks) loop.asks.push_back(send_ask(store, std::move(a), ++loop.asked));
    if (SteadyClock::now() >= loop.next_poll) {
      loop.next_poll = SteadyClock::now() + std::chrono::seconds(1);
      take_requests(store, loop.seen_requests);
    }
    collect_replies(store, loop.asks);
    if (!taken.waiting.empty()) read_peers(store, taken.waiting);
  }
  for (auto& a : loop.asks)
    a.done(std::move(a.replies), {"the round ended before every node answered"});
}

void NodeBoard::publish_entry(rdzv::LazyStore& store, nlohmann::json entry) {
  entry["node"] = place_.node;
  entry["published_unix"] = unix_now();
  const rdzv::Bytes text = rdzv::to_bytes(entry.dump());
  store.call([&](rdzv::Store& c) { c.set(keys_.node(place_.node), text); });
}

NodeBoard::Ask NodeBoard::send_ask(rdzv::LazyStore& store, Ask a, uint64_t number) {
  a.id =
      std::to_string(::getpid()) + "-" + std::to_string(place_.node) + "-" + std::to_string(number);
  a.deadline = SteadyClock::now() + kAskDeadline;
  const rdzv::Bytes request = encode_stacks_request({a.id, a.rank});
  for (int n = 0; n < place_.nodes; ++n) {
    if (n == place_.node) continue;
    const bool sent = store.call([&](rdzv::Store& c) {
      const int64_t seq = c.add(keys_.stacks_count(n), 1);
      c.set(keys_.stacks_request(n, seq), request);
    });
    if (sent)
      a.left.push_back(n);
    else
      a.replies.push_back({{"node", n}, {"error", "could not ask it: " + store.last_error()}});
  }
  return a;
}

void NodeBoard::take_requests(rdzv::LazyStore& store, int64_t& seen) {
  int64_t count = seen;
  store.call([&](rdzv::Store& c) { count = c.add(keys_.stacks_count(place_.node), 0); });
  for (; seen < count; ++seen) {
    rdzv::Bytes value;
    const std::string key = keys_.stacks_request(place_.node, seen + 1);
    // The asker counts first and writes the request right after.
    if (!store.call([&](rdzv::Store& c) { value = c.get(key, kStoreDeadline); })) break;
    try {
      on_request_(decode_stacks_request(value));
    } catch (const rdzv::RecordError& e) {
      spdlog::debug("status board: {}: {}", key, e.what());
    }
  }
}

void NodeBoard::collect_replies(rdzv::LazyStore& store, std::vector<Ask>& asks) {
  for (auto it = asks.begin(); it != asks.end();) {
    Ask& a = *it;
    for (auto n = a.left.begin(); n != a.left.end();) {
      const std::string key = keys_.stacks_reply(a.id, *n);
      std::optional<rdzv::Bytes> value;
      store.call([&](rdzv::Store& c) {
        if (c.check({key})) value = c.get(key, std::chrono::milliseconds(0));
      });
      if (!value) {
        ++n;
        continue;
      }
      try {
        auto r = nlohmann::json::parse(rdzv::to_string(*value));
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
}

void NodeBoard::read_peers(rdzv::LazyStore& store, std::vector<Fetched>& waiting) {
  std::vector<nlohmann::json> peers;
  std::string error;
  for (int n = 0; n < place_.nodes; ++n) {
    if (n == place_.node) continue;
    const std::string key = keys_.node(n);
    std::optional<rdzv::Bytes> value;
    const bool ok = store.call([&](rdzv::Store& c) {
      // A node that has not published yet is left out, not waited for.
      if (c.check({key})) value = c.get(key, std::chrono::milliseconds(0));
    });
    if (!ok) {
      error = "the job's store at " + place_.store_name + ": " + store.last_error();
      break;
    }
    if (!value) continue;
    try {
      peers.push_back(nlohmann::json::parse(rdzv::to_string(*value)));
    } catch (const std::exception& e) {
      error = "node " + std::to_string(n) + "'s entry is not JSON: " + e.what();
    }
  }
  const double now = unix_now();
  for (auto& p : peers) {
    // By this node's clock: meaningful when the clocks agree (ddprun doctor's clock check).
    if (p.contains("published_unix") && p["published_unix"].is_number())
      p["age_s"] = now - p["published_unix"].get<double>();
  }
  for (auto& done : waiting) done(peers, error);
}

}  // namespace ddprun::introspect
