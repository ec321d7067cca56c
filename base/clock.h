// The clock seam: time for the components whose rules are about time (the
// watchdog's deadlines, the attempt's teardown grace, the restart back-off,
// the keep-alive window), so their unit tests move time by hand instead of
// waiting on the wall clock.
//
// Clock hands out the current steady time and one-shot timers. Production
// code uses SteadyClock (steady_clock.h: std::chrono::steady_clock, timers on
// the component's Boost.Asio loop); tests use ManualClock below, whose time
// stands still until advance() or jump() moves it and which runs the due
// timers' callbacks from inside that call. This is the clock half of what
// ninja's FakeCommandRunner and Chromium's TickClock give their tests.
//
// Unlike an Asio timer, a Timer never calls back after cancel(), re-arming
// or its destruction, so an owner needs no "still alive" flag for it.
//
// Not thread-safe: a Clock and its timers belong to one thread (the owner's
// event loop, or the test).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>

namespace ddprun::base {

using TimePoint = std::chrono::steady_clock::time_point;
using Duration = std::chrono::steady_clock::duration;

// A duration as the seconds messages print.
inline double in_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

class Timer {
 public:
  virtual ~Timer() = default;
  // Calls `fire` once `when` has come (at once, from the owner's loop, when
  // it already has). Replaces a pending call.
  virtual void arm(TimePoint when, std::function<void()> fire) = 0;
  // The pending call, if any, never happens.
  virtual void cancel() = 0;
  virtual bool armed() const = 0;
};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
  // A timer on this clock; it may outlive nothing of the clock's.
  virtual std::unique_ptr<Timer> make_timer() = 0;
};

// Time that moves only when a test says so. Starts at an arbitrary point
// (not the epoch, so "a while ago" stays representable).
class ManualClock : public Clock {
 public:
  ManualClock();
  ~ManualClock() override;
  ManualClock(const ManualClock&) = delete;
  ManualClock& operator=(const ManualClock&) = delete;

  TimePoint now() const override { return now_; }
  std::unique_ptr<Timer> make_timer() override;

  // Moves time forward by `d` as a running program sees it: each timer due
  // on the way fires at its own due time (now() then says that time), in
  // due order, also timers armed by another's callback. advance(0) fires
  // what is already due.
  void advance(Duration d);
  // Moves time forward by `d` at once, then fires what is due, late: what a
  // program sees after it did not run for `d` (SIGSTOPped, descheduled).
  void jump(Duration d);
  // Moves to the earliest armed timer and fires it (and whatever else is
  // due then); false when no timer is armed.
  bool advance_to_next();
  // Timers armed and not yet fired or cancelled.
  int armed_timers() const;

 private:
  class ManualTimer;
  friend class ManualTimer;
  // Fires, one by one, every timer due at or before `until`.
  void fire_due(TimePoint until, bool late);
  ManualTimer* earliest() const;

  TimePoint now_;
  uint64_t next_seq_ = 0;  // arming order breaks ties between equal due times
  std::set<ManualTimer*> timers_;
};

}  // namespace ddprun::base
