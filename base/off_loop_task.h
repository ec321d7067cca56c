// OffLoopTask: one call that may block (a join that waits for other nodes,
// a store call, a capture tool) run on a thread of its own, so the event
// loop goes on; its end is posted back to the loop through the owner's post
// function, waited for with a deadline, and a call past that deadline is
// left behind safely instead of holding the exit.
//
// The lifetime rules, which are why this type exists:
//   - `done` runs through `post` (on the loop) unless cancel() or abandon()
//     came first; the check is made under the task's mutex when the work
//     returns and again on the loop when `done` runs, so `done` may capture
//     the owner's stack and `this`, and after abandon() the thread never
//     calls `post` again (the loop may be gone by then).
//   - the work may run on after its owner once abandoned: it must capture by
//     value, or what outlives the task (a shared_ptr, or an object the owner
//     leaks on abandon, see Agent::off_loop), never the owner's stack.
//   - the destructor cancels, waits up to kDestructorWait for the work, and
//     abandons it past that.
//
// Thread safety: start, cancel, join_until, abandon and the destructor on
// the owner's thread; the work reads its Token from its own.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

namespace ddprun::base {

class OffLoopTask {
 public:
  static constexpr std::chrono::seconds kDestructorWait{5};

  // What the work sees of cancel(): poll it between blocking steps.
  class Token {
   public:
    bool cancelled() const { return cancelled_.load(); }

   private:
    friend class OffLoopTask;
    std::atomic<bool> cancelled_{false};
  };
  using Post = std::function<void(std::function<void()>)>;

  OffLoopTask() = default;
  ~OffLoopTask();
  OffLoopTask(const OffLoopTask&) = delete;
  OffLoopTask& operator=(const OffLoopTask&) = delete;

  // Runs `work` on a new thread; a task started before must have been
  // joined or abandoned. When it returns, `done` is handed to `post`.
  void start(std::function<void(const Token&)> work, Post post, std::function<void()> done);
  // Asks the work to stop (its Token says so); `done` will not run.
  void cancel();
  // Started and not yet joined or abandoned.
  bool active() const { return thread_.joinable(); }
  // Waits until the work has returned, or `deadline`; true when it has (the
  // thread is joined then, and also when nothing was started).
  bool join_until(std::chrono::steady_clock::time_point deadline);
  // Leaves a work still running: its thread is detached and ends when the
  // work returns or with the process; `done` never runs.
  void abandon();

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ddprun::base
