#include "base/off_loop_task.h"

#include <stdexcept>

#include "base/mutex.h"

namespace ddprun::base {

struct OffLoopTask::State {
  Token token;
  Mutex mu;
  CondVar ended;
  // The work returned (and `done` was posted or not).
  bool returned GUARDED_BY(mu) = false;
  // cancel() or abandon(): no `done`, no post after.
  bool dropped GUARDED_BY(mu) = false;
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
    MutexLock lk(st->mu);
    // Under the mutex: abandon() cannot slip in between this check and the
    // post, after which the loop `post` reaches may be gone.
    if (!st->dropped && post && done)
      post([st, done = std::move(done)] {
        bool dropped;
        {
          MutexLock lk(st->mu);
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
  MutexLock lk(state_->mu);
  state_->dropped = true;
}

bool OffLoopTask::join_until(std::chrono::steady_clock::time_point deadline) {
  if (!active()) return true;
  {
    MutexLock lk(state_->mu);
    while (!state_->returned) {
      if (!state_->ended.wait_until(state_->mu, deadline) && !state_->returned) return false;
    }
  }
  thread_.join();  // it has returned: only its last instructions are left
  return true;
}

void OffLoopTask::abandon() {
  if (!active()) return;
  {
    MutexLock lk(state_->mu);
    state_->dropped = true;
  }
  thread_.detach();  // it holds its own share of the state
}

}  // namespace ddprun::base
