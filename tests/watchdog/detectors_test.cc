// The Watchdog's detectors against real workers: heartbeat timeout (and its
// absence while beats keep coming under CPU load), silence, a SIGSTOPped
// process, and the laggard rule.
#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <optional>
#include <thread>

#include "tests/watchdog/test_util.h"
#include "watchdog/heartbeat_server.h"
#include "watchdog/watchdog.h"

namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using wd::test::Child;
using wd::test::run_until;
using wd::test::TempDir;

TEST_CASE("heartbeat timeout fires once beats stop while the worker stays alive") {
  TempDir dir;
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.heartbeat_timeout = 300ms;
  opt.heartbeat_grace = 10s;
  opt.stuck_timeout = 0ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat& b) { dog.on_beat(b); });
  Child child({WATCHDOG_TEST_WORKER, "beat", "5", "10", "hang"},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()}, {"RANK", "0"}});
  dog.add_worker(0, 0, child.pid());
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kHeartbeat);
  CHECK(hang->global_rank == 0);
  CHECK(hang->pid == child.pid());
  CHECK(hang->timeout == 300ms);
  CHECK(hang->detected >= hang->due);
  const auto& w = dog.workers().at(0);
  CHECK(w.beats == 5);
  CHECK(w.step == 4);
  CHECK(hang->due == w.last_beat + 300ms);
  CHECK(::kill(child.pid(), 0) == 0);  // alive: it is a hang, not an exit
}

TEST_CASE("a worker that never beats misses the first-beat grace") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.heartbeat_timeout = 100ms;
  opt.heartbeat_grace = 300ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child child({WATCHDOG_TEST_WORKER, "hang"});
  dog.add_worker(0, 7, child.pid());
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kHeartbeat);
  CHECK(hang->global_rank == 7);
  CHECK(hang->timeout == 300ms);
  CHECK(hang->due == dog.workers()[0].spawned + 300ms);
}

TEST_CASE("a worker that beats on time is never flagged, even under CPU load") {
  TempDir dir;
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.heartbeat_timeout = 1s;
  opt.heartbeat_grace = 10s;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  std::size_t beats = 0;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()), [&](const wd::Beat& b) {
    ++beats;
    dog.on_beat(b);
  });
  // Two spinning threads keep both cores busy while the worker beats.
  std::atomic<bool> spin{true};
  std::vector<std::thread> load;
  for (int i = 0; i < 2; ++i) {
    load.emplace_back([&] {
      volatile uint64_t x = 0;
      while (spin.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  constexpr int kBeats = 150;  // 150 x 10 ms: past the timeout several times
  Child child({WATCHDOG_TEST_WORKER, "beat", std::to_string(kBeats), "10", "hang"},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()}, {"RANK", "0"}});
  dog.add_worker(0, 0, child.pid());
  const bool all = run_until(io, [&] { return beats == kBeats || hang.has_value(); });
  spin = false;
  for (auto& t : load) t.join();
  REQUIRE(all);
  CHECK_FALSE(hang.has_value());
  CHECK(dog.workers()[0].step == kBeats - 1);
  // And the same watchdog still fires once the beats stop.
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kHeartbeat);
}

TEST_CASE("silence timeout fires when a worker stops printing") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.silence_timeout = 300ms;
  opt.stuck_timeout = 0ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  // Prints "ready" from ddprun_test_hang_here, then nothing.
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, /*capture_stdout=*/true);
  dog.add_worker(0, 0, child.pid());
  boost::asio::posix::stream_descriptor out(io, ::dup(child.stdout_fd()));
  char buf[256];
  std::size_t bytes = 0;
  std::function<void()> read = [&] {
    out.async_read_some(boost::asio::buffer(buf), [&](auto ec, std::size_t n) {
      if (ec) return;
      bytes += n;
      dog.on_output(0);
      read();
    });
  };
  read();
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(bytes > 0);
  CHECK(hang->kind == wd::HangKind::kSilence);
  CHECK(hang->due == dog.workers()[0].last_output + 300ms);
  out.close();
}

TEST_CASE("a quiet start-up is not silence: the timeout arms at the first output, until then the grace") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.silence_timeout = 100ms;
  opt.heartbeat_grace = 700ms;  // --heartbeat-grace names the start-up grace
  opt.stuck_timeout = 0ms;
  CHECK(opt.effective_silence_grace() == 700ms);
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child quiet({WATCHDOG_TEST_WORKER, "hang"});  // never prints (stdout not read)
  dog.add_worker(0, 0, quiet.pid());
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kSilence);
  // Not spawn + 100 ms: the silence timeout had not armed yet.
  CHECK(hang->due == dog.workers()[0].spawned + 700ms);
  CHECK(hang->timeout == 700ms);
  CHECK(hang->detail.find("no first output within the 0.70 s grace") == 0);

  // Once a worker has printed, the timeout itself counts, even inside the
  // grace: the first output moves the deadline earlier.
  hang.reset();
  wd::Watchdog dog2(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child talker({WATCHDOG_TEST_WORKER, "hang"});
  dog2.add_worker(0, 0, talker.pid());
  dog2.on_output(0);
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->due == dog2.workers()[0].last_output + 100ms);
  CHECK(hang->due < dog2.workers()[0].spawned + 700ms);
  CHECK(hang->timeout == 100ms);

  // Without --heartbeat-grace the start-up grace is the default, never
  // shorter than the silence timeout itself.
  wd::WatchdogOptions d;
  d.silence_timeout = 3s;
  CHECK(d.effective_silence_grace() == wd::WatchdogOptions::kDefaultGrace);
  d.silence_timeout = 120s;
  CHECK(d.effective_silence_grace() == 120s);
}

TEST_CASE("a SIGSTOPped worker is detected from its process state") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.stuck_timeout = 200ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  dog.add_worker(0, 2, child.pid());
  REQUIRE(::kill(child.pid(), SIGSTOP) == 0);
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kStopped);
  CHECK(hang->global_rank == 2);
  CHECK(hang->detected - hang->due < opt.proc_poll_interval * 2);
  CHECK(dog.workers()[0].proc_state == 'T');
}

TEST_CASE("a worker in uninterruptible sleep (D) is detected from its process state") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.stuck_timeout = 200ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child child({WATCHDOG_TEST_WORKER, "dstate"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  dog.add_worker(0, 0, child.pid());
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kUninterruptible);
  CHECK(hang->detail.find("uninterruptible") != std::string::npos);
  CHECK(dog.workers()[0].proc_state == 'D');
}

TEST_CASE("a sleeping (S) worker is not stuck, and an exited worker is not watched") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.stuck_timeout = 100ms;
  opt.heartbeat_timeout = 100ms;
  opt.heartbeat_grace = 100ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child sleeper({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(sleeper.wait_for_output("ready"));
  dog.add_worker(0, 0, sleeper.pid());
  dog.on_worker_exit(0);  // as if it had finished: no deadline applies
  Child stopped({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(stopped.wait_for_output("ready"));
  REQUIRE(::kill(stopped.pid(), SIGSTOP) == 0);
  dog.add_worker(1, 1, stopped.pid());
  dog.on_beat({1, 3, wd::Clock::now()});
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->global_rank == 1);  // never the exited rank 0
}

TEST_CASE("laggard rule names the rank whose step is behind") {
  boost::asio::io_context io;
  wd::WatchdogOptions opt;
  opt.heartbeat_timeout = 200ms;
  opt.heartbeat_grace = 10s;
  opt.stuck_timeout = 0ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(io, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child a({WATCHDOG_TEST_WORKER, "hang"}), b({WATCHDOG_TEST_WORKER, "hang"}),
      c({WATCHDOG_TEST_WORKER, "hang"});
  dog.add_worker(0, 0, a.pid());
  dog.add_worker(1, 1, b.pid());
  dog.add_worker(2, 2, c.pid());
  // Ranks 0 and 2 reached step 11 and wait in the collective; rank 1 is
  // stuck in step 10. Rank 0's beat is the oldest, so it times out first.
  const auto now = wd::Clock::now();
  dog.on_beat({0, 11, now - 50ms});
  dog.on_beat({1, 10, now});
  dog.on_beat({2, 11, now});
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->global_rank == 0);
  CHECK(dog.suspects(*hang) == std::vector<int>{1});
  CHECK(dog.max_step() == 11);
}
