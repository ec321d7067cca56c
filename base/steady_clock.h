// The production Clock (clock.h): std::chrono::steady_clock, with timers on
// a Boost.Asio io_context, so their callbacks run on that loop.
//
// A separate library from the rest of base/ (ddprun_base_asio), which stays
// free of Boost.
//
// Not thread-safe: use from the io_context's thread.
#pragma once

#include <boost/asio/io_context.hpp>

#include "base/clock.h"

namespace ddprun::base {

class SteadyClock : public Clock {
 public:
  explicit SteadyClock(boost::asio::io_context& io) : io_(io) {}
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  std::unique_ptr<Timer> make_timer() override;

 private:
  boost::asio::io_context& io_;
};

}  // namespace ddprun::base
