// Bookkeeping that keeps the store server fair and bounded under attack:
// connection slots per peer address, and a warning log that cannot be
// flooded. Single-threaded: the server's event loop owns both.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstddef>
#include <string>
#include <unordered_map>

namespace ddprun::rendezvous {

// The /24 of an IPv4 address ("10.0.0"), the /64 of an IPv6 one; the
// address itself when it parses as neither.
std::string subnet_of(const std::string& address);

// Connection counts per peer address ("10.0.0.2", port left out), in all
// and not yet authenticated, and unauthenticated ones per subnet.
class PeerSlots {
 public:
  struct Count {
    size_t connections = 0;
    size_t unauthenticated = 0;
  };
  const Count& of(const std::string& peer) const;
  size_t unauthenticated() const { return unauthenticated_; }
  size_t unauthenticated_in(const std::string& subnet) const;
  void add(const std::string& peer, bool authenticated);
  void authenticated(const std::string& peer);
  void remove(const std::string& peer, bool authenticated);

 private:
  void unauth_gone(const std::string& peer);
  std::unordered_map<std::string, Count> counts_;
  std::unordered_map<std::string, size_t> subnet_unauth_;
  size_t unauthenticated_ = 0;
};

// spdlog::warn, at most kVerbatimPerSecond lines a second; the lines held
// back are counted and reported as one line a second. A client flood
// (refused connections, bad frames, wrong tokens) then costs a few lines a
// second, not one a connection.
class RateLimitedLog {
 public:
  static constexpr size_t kVerbatimPerSecond = 3;
  explicit RateLimitedLog(const boost::asio::any_io_executor& ex) : timer_(ex) {}
  void warn(const std::string& line);
  void cancel() { timer_.cancel(); }

 private:
  void arm();
  boost::asio::steady_timer timer_;
  bool armed_ = false;
  size_t shown_ = 0;       // verbatim lines in the current second
  size_t suppressed_ = 0;  // lines held back in the current second
};

}  // namespace ddprun::rendezvous
