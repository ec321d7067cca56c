#include "rendezvous/server_limits.h"

#include <spdlog/spdlog.h>

namespace ddprun::rendezvous {

const PeerSlots::Count& PeerSlots::of(const std::string& peer) const {
  static const Count kNone;
  auto it = counts_.find(peer);
  return it == counts_.end() ? kNone : it->second;
}

void PeerSlots::add(const std::string& peer, bool authenticated) {
  Count& c = counts_[peer];
  ++c.connections;
  if (!authenticated) ++c.unauthenticated, ++unauthenticated_;
}

void PeerSlots::authenticated(const std::string& peer) {
  auto it = counts_.find(peer);
  if (it == counts_.end() || it->second.unauthenticated == 0) return;
  --it->second.unauthenticated;
  --unauthenticated_;
}

void PeerSlots::remove(const std::string& peer, bool authenticated) {
  auto it = counts_.find(peer);
  if (it == counts_.end()) return;
  if (!authenticated && it->second.unauthenticated > 0) {
    --it->second.unauthenticated;
    --unauthenticated_;
  }
  if (--it->second.connections == 0) counts_.erase(it);
}

void RateLimitedLog::warn(const std::string& line) {
  if (shown_ < kVerbatimPerSecond) {
    ++shown_;
    spdlog::warn("{}", line);
  } else {
    ++suppressed_;
  }
  arm();
}

void RateLimitedLog::arm() {
  if (armed_) return;
  armed_ = true;
  timer_.expires_after(std::chrono::seconds(1));
  timer_.async_wait([this](boost::system::error_code ec) {
    armed_ = false;
    if (ec) return;
    if (suppressed_ > 0) {
      spdlog::warn("store: {} more warnings like the above in the last second (not shown)",
                   suppressed_);
    }
    // A new second starts only after a quiet one, so a steady flood shows
    // its first lines once and then one count a second.
    bool busy = suppressed_ > 0;
    suppressed_ = 0;
    if (busy) {
      shown_ = kVerbatimPerSecond;
      arm();
    } else {
      shown_ = 0;
    }
  });
}

}  // namespace ddprun::rendezvous
