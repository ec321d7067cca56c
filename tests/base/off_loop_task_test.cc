// base/off_loop_task.h with a real loop (Boost.Asio) and a real blocking
// call (read() on a pipe nobody writes, as a name lookup that does not
// answer): the result is posted back, cancel() keeps `done` from running,
// and a work past its deadline is abandoned: join_until returns, and the
// thread, once freed, never posts to the loop. Waits are polls with a
// deadline on what the loop and the task show.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <memory>
#include <thread>

#include "base/off_loop_task.h"
#include "base/scoped_fd.h"

using ddprun::base::OffLoopTask;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

OffLoopTask::Post post_to(boost::asio::io_context& io) {
  return [&io](std::function<void()> f) { boost::asio::post(io, std::move(f)); };
}

}  // namespace

TEST_CASE("off-loop task: the work runs on its own thread and `done` comes back on the loop") {
  boost::asio::io_context io;
  auto busy = boost::asio::make_work_guard(io);  // as the agent's signal sets keep its loop
  OffLoopTask task;
  auto result = std::make_shared<std::thread::id>();
  bool done = false;
  task.start([result](const OffLoopTask::Token&) { *result = std::this_thread::get_id(); },
             post_to(io), [&] { done = true; });
  const auto deadline = Clock::now() + 30s;
  while (!done && Clock::now() < deadline) io.run_one_for(100ms);
  REQUIRE(done);
  CHECK(*result != std::this_thread::get_id());
  CHECK(task.join_until(Clock::now() + 30s));
  CHECK_FALSE(task.active());
}

TEST_CASE("off-loop task: cancel() reaches the work's token and `done` never runs") {
  boost::asio::io_context io;
  OffLoopTask task;
  bool done = false;
  auto saw_cancel = std::make_shared<std::atomic<bool>>(false);
  task.start(
      [saw_cancel](const OffLoopTask::Token& token) {
        const auto deadline = Clock::now() + 30s;
        while (!token.cancelled() && Clock::now() < deadline) std::this_thread::yield();
        *saw_cancel = token.cancelled();
      },
      post_to(io), [&] { done = true; });
  task.cancel();
  REQUIRE(task.join_until(Clock::now() + 30s));
  CHECK(*saw_cancel);
  io.restart();
  io.poll();  // anything posted runs now: `done` must not
  CHECK_FALSE(done);
}

TEST_CASE("off-loop task: a work stuck past its deadline is abandoned and never posts") {
  auto pipe = ddprun::base::make_pipe();
  const int read_fd = pipe.read.get();
  std::atomic<int> posted{0};  // outlives the thread: the test waits for its end
  auto sentinel = std::make_shared<int>(0);
  std::weak_ptr<int> alive = sentinel;
  {
    OffLoopTask task;
    task.start(
        [read_fd](const OffLoopTask::Token&) {
          char c;
          (void)::read(read_fd, &c, 1);  // blocks until the test writes
        },
        [&posted, sentinel](std::function<void()>) { ++posted; }, [] {});
    CHECK_FALSE(task.join_until(Clock::now() + 100ms));  // stuck: the deadline passes
    task.abandon();
    CHECK_FALSE(task.active());
  }  // the owner is gone; the work still runs
  sentinel.reset();
  REQUIRE(::write(pipe.write.get(), "x", 1) == 1);  // frees the work
  // The thread's closure (holding the sentinel) goes when the thread ends.
  const auto deadline = Clock::now() + 30s;
  while (!alive.expired() && Clock::now() < deadline) std::this_thread::yield();
  REQUIRE(alive.expired());
  CHECK(posted == 0);
}
