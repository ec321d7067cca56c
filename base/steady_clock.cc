#include "base/steady_clock.h"

#include <boost/asio/steady_timer.hpp>

namespace ddprun::base {
namespace {

class AsioTimer : public Timer {
 public:
  explicit AsioTimer(boost::asio::io_context& io) : timer_(io) {}
  ~AsioTimer() override { cancel(); }

  void arm(TimePoint when, std::function<void()> fire) override {
    cancel();
    pending_ = std::make_shared<std::function<void()>>(std::move(fire));
    timer_.expires_at(when);
    // An Asio timer that expired just before cancel() still runs its
    // handler with success; the handler holds only a weak reference to this
    // arming's callback, which cancel(), a new arm() and the destructor
    // drop, so such a late handler finds nothing to call.
    std::weak_ptr<std::function<void()>> weak = pending_;
    timer_.async_wait([weak](const boost::system::error_code& ec) {
      auto call = weak.lock();
      if (ec || !call) return;
      auto fire = std::move(*call);
      *call = nullptr;  // armed() is false from here on
      fire();
    });
  }
  void cancel() override {
    pending_.reset();
    timer_.cancel();
  }
  bool armed() const override { return pending_ && *pending_; }

 private:
  boost::asio::steady_timer timer_;
  std::shared_ptr<std::function<void()>> pending_;
};

}  // namespace

std::unique_ptr<Timer> SteadyClock::make_timer() { return std::make_unique<AsioTimer>(io_); }

}  // namespace ddprun::base
