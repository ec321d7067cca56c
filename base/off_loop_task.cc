#include "base/off_loop_task.h"

#include <condition_variable>
#include <mutex>
#include <stdexcept>

namespace ddprun::base {

struct OffLoopTask::State {
  Token token;
  std::mutex mu;
  std::condition_variable ended;
  bool returned = false;  // the work returned (and `done` was posted or not)
  bool dropped = false;   // cancel() or abandon(): no `done`, no post after
};

OffLoopTask::~OffLoopTask() {
  if (!active()) return;
  cancel();
  if (!join_until(std::chrono::steady_clock::now() + kDestructorWait)) abandon();
}

void OffLoopTask::start(std::function<void(const Token&)> work, Post post,
                        std::function<void()> done) {
  if (active()) throw std::logic_error("OffLoopTask::start: the previous task is still active");
  state_ = std::make_shared<State>();
  thread_ = std::thread([st = state_, work = std::move(work), post = std::move(post),
                         done = std::move(done)]() mutable {
    work(st->token);
    std::lock_guard<std::mutex> lk(st->mu);
    // Under the mutex: abandon() cannot slip in between this check and the
    // post, after which the loop `post` reaches may be gone.
    if (!st->dropped && post && done)
      post([st, done = std::move(done)] {
        bool dropped;
        {
          std::lock_guard<std::mutex> lk(st->mu);
          dropped = st->dropped;
        }
        if (!dropped) done();  // cancelled after the post: not run
      });
    st->returned = true;
    st->ended.notify_all();
  });
}

void OffLoopTask::cancel() {
  if (!state_) return;
  state_->token.cancelled_ = true;
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->dropped = true;
}

bool OffLoopTask::join_until(std::chrono::steady_clock::time_point deadline) {
  if (!active()) return true;
  {
    std::unique_lock<std::mutex> lk(state_->mu);
    if (!state_->ended.wait_until(lk, deadline, [&] { return state_->returned; })) return false;
  }
  thread_.join();  // it has returned: only its last instructions are left
  return true;
}

void OffLoopTask::abandon() {
  if (!active()) return;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->dropped = true;
  }
  thread_.detach();  // it holds its own share of the state
}

}  // namespace ddprun::base
