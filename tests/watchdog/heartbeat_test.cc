// Heartbeats through a real socket: the parser, the server, and both
// clients (C++ header in a child process, Python module under
// /usr/bin/python3).
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <boost/asio/io_context.hpp>

#include "tests/watchdog/test_util.h"
#include "tests/common/test_python.h"
#include "watchdog/heartbeat_server.h"
#include "watchdog/heartbeat_wire.h"

namespace wd = ddprun::watchdog;
using namespace wd::testing;

namespace {

void send_raw(const std::string& path, const std::string& bytes) {
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  CHECK(::sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof(a)) ==
        static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

}  // namespace

TEST_CASE("parse_beat accepts the wire format and rejects everything else") {
  auto b = wd::parse_beat("hb 3 41\n");
  REQUIRE(b);
  CHECK(b->global_rank == 3);
  CHECK(b->step == 41);
  CHECK(wd::parse_beat("hb 0 -1\n")->step == -1);
  for (const char* bad : {"hb 3 41", "hb 3\n", "hb -1 4\n", "hb 3 -2\n", "hb x 1\n", "HB 1 1\n",
                          "hb 1 1 1\n", "hb 1  1\n", "", "hb 99999999999 1\n"}) {
    CAPTURE(bad);
    CHECK_FALSE(wd::parse_beat(bad));
  }
}

TEST_CASE("parse_beat reads every kind of the wire: automatic, forward, section start and end") {
  auto a = wd::parse_beat("ab 2 7\n");
  REQUIRE(a);
  CHECK(a->kind == wd::BeatKind::kAuto);
  CHECK(a->global_rank == 2);
  CHECK(a->step == 7);
  CHECK(a->section.empty());
  CHECK(wd::parse_beat("hb 3 41\n")->kind == wd::BeatKind::kExplicit);
  auto f = wd::parse_beat("fw 5\n");
  REQUIRE(f);
  CHECK(f->kind == wd::BeatKind::kForward);
  CHECK(f->global_rank == 5);
  CHECK(f->step == -1);
  auto s = wd::parse_beat("ss 1 checkpoint\n");
  REQUIRE(s);
  CHECK(s->kind == wd::BeatKind::kSectionStart);
  CHECK(s->global_rank == 1);
  CHECK(s->step == -1);
  CHECK(s->section == "checkpoint");
  auto e = wd::parse_beat("se 0 my.eval-pass_2\n");
  REQUIRE(e);
  CHECK(e->kind == wd::BeatKind::kSectionEnd);
  CHECK(e->section == "my.eval-pass_2");
  // The longest section name allowed fits in one datagram.
  const std::string longest(ddprun::watchdog::heartbeat_wire::kMaxSectionBytes, 'x');
  CHECK(wd::parse_beat("ss 16777215 " + longest + "\n")->section == longest);
}

TEST_CASE("parse_beat rejects malformed datagrams of every kind") {
  const std::string too_long(ddprun::watchdog::heartbeat_wire::kMaxSectionBytes + 1, 'x');
  const std::vector<std::string> malformed = {
      "ab 1\n", "ab 1 -2\n", "ab -1 3\n", "ab 1 1", "ab 1 x\n", "AB 1 1\n",
      "fw\n", "fw \n", "fw 1 2\n", "fw -1\n", "fw 1", "fw x\n",
      "ss 1\n", "ss 1 \n", "ss 1 two words\n", "ss 1 check/point\n", "se 1 ch\xc3" "\xa9" "ck\n",
      "ss 1 checkpoint", "se x checkpoint\n", "ss 16777216 a\n", "ss 1 " + too_long + "\n",
      "zz 1 1\n", "hb1 1\n", "ab 1 " + std::string(70, '1') + "\n"};
  for (const std::string& bad : malformed) {
    CAPTURE(bad);
    CHECK_FALSE(wd::parse_beat(bad));
  }
}

TEST_CASE("heartbeat server receives beats and drops malformed datagrams") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat& b) { beats.push_back(b); });
  send_raw(server.path(), "garbage");
  send_raw(server.path(), "hb 1 7\n");
  send_raw(server.path(), "hb 2 -1\n");
  send_raw(server.path(), "ss 2 bad name\n");
  send_raw(server.path(), "ss 2 checkpoint\n");
  REQUIRE(run_until(io, [&] { return beats.size() == 3; }));
  CHECK(server.malformed_received() == 2);
  CHECK(beats[2].kind == wd::BeatKind::kSectionStart);
  CHECK(beats[2].section == "checkpoint");
  CHECK(beats[0].global_rank == 1);
  CHECK(beats[0].step == 7);
  CHECK(beats[1].global_rank == 2);
  CHECK(beats[1].step == -1);
}

TEST_CASE("socket path falls back to /tmp when the directory is too deep for sun_path") {
  const std::string deep = "/var/log/" + std::string(120, 'd');
  const std::string path = wd::choose_socket_path(deep);
  CHECK(path.rfind("/tmp/ddprun-hb-", 0) == 0);
  CHECK(path.size() < sizeof(sockaddr_un::sun_path));
  boost::asio::io_context io;
  {
    wd::HeartbeatServer server(io, path, [](const wd::Beat&) {});
    CHECK(::access(path.c_str(), F_OK) == 0);
  }
  // The server removes its socket and the private directory it lived in.
  CHECK(::access(path.substr(0, path.rfind('/')).c_str(), F_OK) != 0);
}

TEST_CASE("beats from the C++ client in a child process arrive with rank and step") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat& b) { beats.push_back(b); });
  Child child({WATCHDOG_TEST_WORKER, "beat", "3", "1", "exit"},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()}, {"RANK", "5"}});
  REQUIRE(run_until(io, [&] { return beats.size() == 3; }));
  for (int i = 0; i < 3; ++i) {
    CHECK(beats[i].global_rank == 5);
    CHECK(beats[i].step == i);
  }
  CHECK(WEXITSTATUS(child.wait()) == 0);
}

TEST_CASE("sections from the C++ client: outermost start and end, guard ends on exception") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat& b) { beats.push_back(b); });
  Child child({WATCHDOG_TEST_WORKER, "sections"},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()}, {"RANK", "4"}});
  REQUIRE(run_until(io, [&] { return beats.size() == 5; }));
  CHECK(WEXITSTATUS(child.wait()) == 0);
  using K = wd::BeatKind;
  const std::vector<std::pair<K, std::string>> want = {{K::kSectionStart, "checkpoint"},
                                                       {K::kSectionStart, "my_eval"},
                                                       {K::kSectionEnd, "my_eval"},
                                                       {K::kSectionEnd, "checkpoint"},
                                                       {K::kExplicit, ""}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(beats[i].global_rank == 4);
    CHECK(beats[i].kind == want[i].first);
    CHECK(beats[i].section == want[i].second);
  }
  CHECK(beats[4].step == 7);
  CHECK(server.malformed_received() == 0);
}

TEST_CASE("forward beats from the C++ client arrive as progress without a step") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat& b) { beats.push_back(b); });
  Child child({WATCHDOG_TEST_WORKER, "forward"},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()}, {"RANK", "2"}});
  REQUIRE(run_until(io, [&] { return beats.size() == 2; }));
  CHECK(WEXITSTATUS(child.wait()) == 0);
  CHECK(beats[0].kind == wd::BeatKind::kForward);
  CHECK(beats[0].global_rank == 2);
  CHECK(beats[1].kind == wd::BeatKind::kExplicit);
  CHECK(beats[1].step == 3);
  CHECK(server.malformed_received() == 0);
}

TEST_CASE("C++ client is a no-op outside ddprun") {
  Child child({WATCHDOG_TEST_WORKER, "beat", "3", "1", "exit"}, {{"DDPRUN_HEARTBEAT_SOCKET", ""}});
  const int status = child.wait();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("beats from the Python client arrive; it is a no-op when the agent is gone") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  std::string path;
  {
    wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                               [&](const wd::Beat& b) { beats.push_back(b); });
    path = server.path();
    Child child({test_python(), "-c",
                 "import ddprun_heartbeat as h; assert h.enabled(); h.beat(12); h.beat()"},
                {{"DDPRUN_HEARTBEAT_SOCKET", path}, {"RANK", "3"},
                 {"PYTHONPATH", WATCHDOG_PYTHON_DIR}});
    REQUIRE(run_until(io, [&] { return beats.size() == 2; }));
    CHECK(beats[0].global_rank == 3);
    CHECK(beats[0].step == 12);
    CHECK(beats[1].step == -1);
    CHECK(WEXITSTATUS(child.wait()) == 0);
  }
  // Server closed: beats are dropped silently, the worker carries on.
  Child gone({test_python(), "-c", "import ddprun_heartbeat as h; h.beat(1); print('ok')"},
             {{"DDPRUN_HEARTBEAT_SOCKET", path}, {"PYTHONPATH", WATCHDOG_PYTHON_DIR}});
  CHECK(WEXITSTATUS(gone.wait()) == 0);
  Child outside({test_python(), "-c",
                 "import ddprun_heartbeat as h; assert not h.enabled(); h.beat(1)"},
                {{"DDPRUN_HEARTBEAT_SOCKET", ""}, {"PYTHONPATH", WATCHDOG_PYTHON_DIR}});
  CHECK(WEXITSTATUS(outside.wait()) == 0);
}

TEST_CASE("Python client: sections nest by name, explicit beats stop automatic ones, "
          "forward beats are rate-limited") {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat& b) { beats.push_back(b); });
  // Sent, in order: ab 1; the fw beats of 1000 _forward() calls, then hb
  // with the milliseconds they took; ab 2 is not sent (explicit wins); ss
  // checkpoint (the inner one of the same name is not sent); ss my_eval; se
  // my_eval (ended by the exception); se checkpoint; ss and se of 40 x's cut
  // to 32; ss end.
  const std::string program =
      "import time\n"
      "import ddprun_heartbeat as h\n"
      "h._auto_beat(1)\n"
      "t = time.monotonic()\n"
      "for _ in range(1000): h._forward()\n"
      "h.beat(int((time.monotonic() - t) * 1000)); h._auto_beat(2)\n"
      "with h.section('checkpoint'):\n"
      "    h.start_section('checkpoint'); h.end_section('checkpoint')\n"
      "    try:\n"
      "        with h.section('my eval'): raise KeyError\n"
      "    except KeyError: pass\n"
      "h.end_section('never started')\n"
      "with h.section('x' * 40): pass\n"
      "h.start_section('end')\n";
  Child child({test_python(), "-c", program},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()}, {"RANK", "2"},
               {"PYTHONPATH", WATCHDOG_PYTHON_DIR}});
  REQUIRE(run_until(io, [&] { return !beats.empty() && beats.back().section == "end"; }));
  CHECK(WEXITSTATUS(child.wait()) == 0);
  for (const auto& b : beats) CHECK(b.global_rank == 2);
  using K = wd::BeatKind;
  REQUIRE(beats.front().kind == K::kAuto);
  CHECK(beats.front().step == 1);
  std::size_t i = 1;
  while (i < beats.size() && beats[i].kind == K::kForward) ++i;
  REQUIRE(i < beats.size());
  REQUIRE(beats[i].kind == K::kExplicit);
  // At most one forward beat per kForwardMinIntervalMs of the loop, however
  // long the busy machine made it take.
  const int64_t forwards = static_cast<int64_t>(i) - 1;
  CHECK(forwards >= 1);
  CHECK(forwards <= 1 + beats[i].step / ddprun::watchdog::heartbeat_wire::kForwardMinIntervalMs);
  const std::string x32(32, 'x');
  const std::vector<std::pair<K, std::string>> want = {
      {K::kSectionStart, "checkpoint"}, {K::kSectionStart, "my_eval"},
      {K::kSectionEnd, "my_eval"},      {K::kSectionEnd, "checkpoint"},
      {K::kSectionStart, x32},          {K::kSectionEnd, x32},
      {K::kSectionStart, "end"}};
  std::vector<std::pair<K, std::string>> rest;
  for (++i; i < beats.size(); ++i) rest.emplace_back(beats[i].kind, beats[i].section);
  CHECK(rest == want);
}

TEST_CASE("clients never block when the agent stops reading: beats are dropped") {
  TempDir dir;
  boost::asio::io_context io;  // never run: the socket buffer fills up
  std::size_t received = 0;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()),
                             [&](const wd::Beat&) { ++received; });
  const std::map<std::string, std::string> env = {{"DDPRUN_HEARTBEAT_SOCKET", server.path()},
                                                  {"RANK", "0"},
                                                  {"PYTHONPATH", WATCHDOG_PYTHON_DIR}};
  // Far more beats than any socket buffer holds, with no pause between them.
  Child native({WATCHDOG_TEST_WORKER, "beat", "200000", "0", "exit"}, env);
  auto status = native.wait_for(std::chrono::seconds(60));
  REQUIRE_MESSAGE(status.has_value(), "the C++ client blocked on a full socket");
  CHECK(WEXITSTATUS(*status) == 0);
  Child python({test_python(), "-c",
                "import ddprun_heartbeat as h\nfor i in range(200000): h.beat(i)\n"},
               env);
  status = python.wait_for(std::chrono::seconds(60));
  REQUIRE_MESSAGE(status.has_value(), "the Python client blocked on a full socket");
  CHECK(WEXITSTATUS(*status) == 0);
  // What did fit is still valid and arrives once the agent reads again.
  CHECK(wd::testing::run_until(io, [&] { return received > 0; }));
}
