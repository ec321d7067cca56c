#include "rendezvous/server_limits.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/address.hpp>

namespace ddprun::rendezvous {

std::string subnet_of(const std::string& address) {
  boost::system::error_code ec;
  auto a = boost::asio::ip::make_address(address, ec);
  if (ec) return address;
  if (a.is_v4()) {
    auto b = a.to_v4().to_bytes();
    return std::to_string(b[0]) + "." + std::to_string(b[1]) + "." + std::to_string(b[2]);
  }
  auto b = a.to_v6().to_bytes();
  std::string s;
  for (size_t i = 0; i < 8; ++i) s += std::to_string(b[i]) + (i < 7 ? ":" : "");
  return s;
}

size_t PeerSlots::unauthenticated_in(const std::string& subnet) const {
  auto it = subnet_unauth_.find(subnet);
  return it == subnet_unauth_.end() ? 0 : it->second;
}

void PeerSlots::unauth_gone(const std::string& peer) {
  --unauthenticated_;
  auto it = subnet_unauth_.find(subnet_of(peer));
  if (it != subnet_unauth_.end() && --it->second == 0) subnet_unauth_.erase(it);
}

const PeerSlots::Count& PeerSlots::of(const std::string& peer) const {
  static const Count kNone;
  auto it = counts_.find(peer);
  return it == counts_.end() ? kNone : it->second;
}

void PeerSlots::add(const std::string& peer, bool authenticated) {
  Count& c = counts_[peer];
  ++c.connections;
  if (!authenticated) ++c.unauthenticated, ++unauthenticated_, ++subnet_unauth_[subnet_of(peer)];
}

void PeerSlots::authenticated(const std::string& peer) {
  auto it = counts_.find(peer);
  if (it == counts_.end() || it->second.unauthenticated == 0) return;
  --it->second.unauthenticated;
  unauth_gone(peer);
}

void PeerSlots::remove(const std::string& peer, bool authenticated) {
  auto it = counts_.find(peer);
  if (it == counts_.end()) return;
  if (!authenticated && it->second.unauthenticated > 0) {
    --it->second.unauthenticated;
    unauth_gone(peer);
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
