// ServiceThread: the long-lived counterpart of OffLoopTask. One thread that
// serves its owner for the owner's whole life: it sleeps until the owner
// hands it something or its own deadline comes (a poll), does the blocking
// work there (store calls), and is stopped by the owner before the owner's
// members go. PeerGuards and NodeBoard run on it.
//
// The lifetime rules, which are why this type exists:
//   - the owner's data that both sides touch stays in the owner, changed
//     only inside hand_over() (owner) and the `take` of wait_until()
//     (thread): both run under the service's one mutex, so there is no
//     second lock to order and no wake-up lost between a change and a wait.
//   - stop() sets the flag under that mutex, wakes the thread, then calls
//     `interrupt` (given at start: it cancels a blocked call, e.g. a
//     rendezvous::Canceller) and joins. wait_until() returns false from
//     then on, so the body's loop ends at its next wait; every blocking call
//     in the body must honour `interrupt` or have a deadline of its own,
//     which is what bounds the join.
//   - the owner calls stop() first thing in its destructor (the body uses
//     the owner's members); the ServiceThread's own destructor calls it too.
//
// Thread safety: start, hand_over and stop from the owner's threads;
// wait_until from the body only.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "base/mutex.h"

namespace ddprun::base {

class ServiceThread {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  ServiceThread() = default;
  ~ServiceThread();
  ServiceThread(const ServiceThread&) = delete;
  ServiceThread& operator=(const ServiceThread&) = delete;

  // Runs `body` on a new thread (once per object). `interrupt` makes a call
  // the body is blocked in return; stop() calls it after setting the flag.
  void start(std::function<void()> body, std::function<void()> interrupt = {});
  // Runs `change` under the service's mutex, then wakes the body.
  void hand_over(const std::function<void()>& change) EXCLUDES(mu_);
  // In the body: sleeps until `ready()` (checked under the mutex), stop(),
  // or `deadline`; then, unless stopping, runs `take` under the mutex and
  // returns true. False once stop() was called (`take` does not run).
  bool wait_until(TimePoint deadline, const std::function<bool()>& ready,
                  const std::function<void()>& take) EXCLUDES(mu_);
  // Ends the body at its next wait (interrupting a blocked call) and joins.
  // Idempotent; a no-op when never started.
  void stop() EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::function<void()> interrupt_;
  std::thread thread_;
};

}  // namespace ddprun::base
