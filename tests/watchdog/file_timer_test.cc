// torch's file-timer protocol served for a real torch FileTimerClient
// (Debian's python3-torch under /usr/bin/python3).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <optional>

#include "base/steady_clock.h"
#include "tests/watchdog/test_util.h"
#include "tests/common/test_python.h"
#include "watchdog/file_timer_server.h"
#include "watchdog/watchdog.h"

namespace wd = ddprun::watchdog;
using namespace wd::testing;

namespace {

// A block that never finishes, under timer.expires(after=1): exactly the
// pattern torchrun's FileTimerServer watches.
constexpr const char* kHangingScript = R"(
import os, sys, time
import torch.distributed.elastic.timer as timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
with timer.expires(after=60, scope="released"):
    pass
print("ready", flush=True)
with timer.expires(after=1, scope="train_step"):
    while True:
        time.sleep(1)
)";

}  // namespace

TEST_CASE("file timer requests parse as torch writes them") {
  std::string err;
  auto r = wd::parse_file_timer_request(
      R"({"version": 1, "pid": 42, "scope_id": "a.py#3", "expiration_time": 1700000000.5, "signal": 9})",
      &err);
  REQUIRE(r);
  CHECK(r->pid == 42);
  CHECK(r->scope_id == "a.py#3");
  CHECK(r->expiration_time == doctest::Approx(1700000000.5));
  CHECK(r->signal == 9);
  CHECK_FALSE(wd::parse_file_timer_request(R"({"pid": 42})", &err));
  CHECK(err.find("scope_id") != std::string::npos);
  CHECK_FALSE(wd::parse_file_timer_request("not json", &err));
}

TEST_CASE("server creates the FIFO and removes it on close") {
  TempDir dir;
  boost::asio::io_context io;
  const std::string path = dir.path() + "/timer";
  {
    wd::FileTimerServer server(io, path, [](const wd::FileTimerExpiry&) {});
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));
  }
  CHECK(::access(path.c_str(), F_OK) != 0);
}

TEST_CASE("an expired torch FileTimerClient timer is reported as a hang of that worker") {
  TempDir dir;
  boost::asio::io_context io;
  std::optional<wd::FileTimerExpiry> expiry;
  std::optional<wd::HangEvent> hang;
  ddprun::base::SteadyClock clock(io);
  wd::WatchdogOptions opt;  // no other detector: only torch's timer
  wd::Watchdog dog(clock, opt, [&](const wd::HangEvent& e) { hang = e; });
  wd::FileTimerServer server(io, dir.path() + "/watchdog_timer", [&](const wd::FileTimerExpiry& e) {
    expiry = e;
    dog.on_file_timer_expiry(e);
  });
  Child child({test_python(), "-c", kHangingScript}, {{"TORCHELASTIC_TIMER_FILE", server.path()}},
              true);
  dog.add_worker(0, 4, child.pid());
  REQUIRE(child.wait_for_output("ready", std::chrono::seconds(60)));
  REQUIRE(run_until(io, [&] { return hang.has_value(); }, std::chrono::seconds(30)));
  REQUIRE(expiry);
  CHECK(expiry->pid == child.pid());
  CHECK(expiry->scopes == std::vector<std::string>{"train_step"});
  CHECK(expiry->signal == SIGKILL);  // FileTimerClient's default
  CHECK(server.requests_received() == 3);  // acquire, release, acquire
  CHECK(server.active_timers() == 0);      // a reaped pid's timers are cleared
  CHECK(hang->kind == wd::HangKind::kFileTimer);
  CHECK(hang->global_rank == 4);
  CHECK(hang->detail.find("train_step") != std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);  // we report; the agent tears down
}

TEST_CASE("like torchrun, an expired timer with no signal is dropped, not reported") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::FileTimerExpiry> expiries;
  wd::FileTimerServer server(io, dir.path() + "/timer",
                             [&](const wd::FileTimerExpiry& e) { expiries.push_back(e); });
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto send = [&](const std::string& line) {
    const int fd = ::open(server.path().c_str(), O_WRONLY | O_NONBLOCK);
    REQUIRE(fd >= 0);
    CHECK(::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
    ::close(fd);
  };
  // pid 111: no signal, due first; pid 222: SIGTERM, due later; pid 333:
  // acquired then released, never due.
  send(R"({"version": 1, "pid": 111, "scope_id": "a", "expiration_time": )" +
       std::to_string(now + 0.05) + R"(, "signal": 0})" + "\n");
  send(R"({"version": 1, "pid": 333, "scope_id": "c", "expiration_time": )" +
       std::to_string(now + 0.1) + R"(, "signal": 9})" + "\n" +
       R"({"version": 1, "pid": 333, "scope_id": "c", "expiration_time": -1, "signal": 0})" + "\n");
  send(R"({"version": 1, "pid": 222, "scope_id": "b", "expiration_time": )" +
       std::to_string(now + 0.2) + R"(, "signal": 15})" + "\n");
  REQUIRE(run_until(io, [&] { return !expiries.empty(); }));
  REQUIRE(expiries.size() == 1);
  CHECK(expiries[0].pid == 222);
  CHECK(expiries[0].signal == SIGTERM);
  CHECK(server.requests_received() == 4);
  CHECK(server.active_timers() == 0);
}
