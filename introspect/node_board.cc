#include "introspect/node_board.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>

#include "rendezvous/canceller.h"
#include "rendezvous/client.h"

namespace ddprun::introspect {

namespace rdzv = ddprun::rendezvous;

std::string board_key(const std::string& store_prefix, int node) {
  return "ddprun-introspect/" + store_prefix + "node/" + std::to_string(node);
}

NodeBoard::NodeBoard(BoardPlace place)
    : place_(std::move(place)), canceller_(std::make_shared<rdzv::Canceller>()) {
  thread_ = std::thread([this] { run(); });
}

NodeBoard::~NodeBoard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  canceller_->cancel();  // a call blocked on a store that is gone returns now
  thread_.join();
  // Requests still waiting get an answer: their callers must not hang.
  for (auto& done : waiting_) done({}, "the round ended before the other nodes were read");
}

void NodeBoard::publish(nlohmann::json status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entry_ = std::move(status);
    has_entry_ = true;
  }
  cv_.notify_all();
}

void NodeBoard::fetch(Fetched done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_.push_back(std::move(done));
  }
  cv_.notify_all();
}

void NodeBoard::run() {
  std::optional<rdzv::Client> client;
  std::string last_error;
  // One store call; a failure drops the connection (the next call makes a
  // new one) and is logged once until a call succeeds again.
  auto with_store = [&](const auto& call) -> bool {
    try {
      if (!client) {
        rdzv::ClientOptions o;
        std::tie(o.host, o.port) = rdzv::parse_host_port(place_.store_addr, "store address");
        o.token = place_.store_token;
        o.connect_timeout = kStoreDeadline;
        o.op_timeout = kStoreDeadline;
        o.reply_grace = kStoreDeadline;
        o.canceller = canceller_;
        client.emplace(o);
      }
      call(*client);
      last_error.clear();
      return true;
    } catch (const std::exception& e) {
      client.reset();
      if (canceller_->cancelled()) return false;
      if (last_error != e.what()) spdlog::debug("status board: {}", e.what());
      last_error = e.what();
      return false;
    }
  };
  for (;;) {
    nlohmann::json entry;
    bool have_entry = false;
    std::vector<Fetched> waiting;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || has_entry_ || !waiting_.empty(); });
      if (stop_) break;
      if (has_entry_) {
        entry = std::move(entry_);
        has_entry_ = false;
        have_entry = true;
      }
      waiting.swap(waiting_);
    }
    if (have_entry) {
      entry["node"] = place_.node;
      entry["published_unix"] =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      const std::string text = entry.dump();
      with_store([&](rdzv::Client& c) {
        c.set(board_key(place_.store_prefix, place_.node), rdzv::to_bytes(text));
      });
    }
    if (waiting.empty()) continue;
    std::vector<nlohmann::json> peers;
    std::string error;
    for (int n = 0; n < place_.nodes; ++n) {
      if (n == place_.node) continue;
      const std::string key = board_key(place_.store_prefix, n);
      bool present = false;
      rdzv::Bytes value;
      const bool ok = with_store([&](rdzv::Client& c) {
        // A node that has not published yet is left out, not waited for.
        present = c.check({key});
        if (present) value = c.get(key, std::chrono::milliseconds(0));
      });
      if (!ok) {
        error = "the job's store at " + place_.store_addr + ": " + last_error;
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
}

}  // namespace ddprun::introspect
