// base/: the fd owner, the /proc/<pid>/stat reader and the pidfd wait, on
// real descriptors and real processes; the liveness token.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "base/liveness.h"
#include "base/pidfd.h"
#include "base/proc_stat.h"
#include "base/terminal_modes.h"
#include "base/utc_time.h"
#include "base/scoped_fd.h"
#include "tests/common/skip.h"

using namespace ddprun::base;
using Clock = std::chrono::steady_clock;

namespace {

bool fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

// A child that blocks reading `p.read` until the test closes its write end.
pid_t child_waiting_on(Pipe& p) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    p.write.reset();
    char c;
    (void)!read(p.read.get(), &c, 1);
    _exit(7);
  }
  return pid;
}

}  // namespace

TEST_CASE("Liveness tokens say alive until the owner is revoked or destroyed") {
  std::optional<Liveness::Token> kept;
  {
    Liveness owner;
    const Liveness::Token token = owner.token();
    kept = token;  // copies share the owner's flag
    CHECK(token.alive());
    CHECK(static_cast<bool>(*kept));
    owner.revoke();
    CHECK_FALSE(token);
    CHECK_FALSE(kept->alive());
    CHECK_FALSE(owner.token());  // taken after revoke: dead too
  }
  CHECK_FALSE(kept->alive());
  {
    Liveness owner;
    kept = owner.token();
    CHECK(kept->alive());
  }
  CHECK_FALSE(kept->alive());  // destroyed without revoke
}

TEST_CASE("ScopedFd closes on destruction and on reset, not after release") {
  Pipe p = make_pipe();
  int r = p.read.get(), w = p.write.get();
  CHECK(fd_open(r));
  CHECK((fcntl(r, F_GETFD) & FD_CLOEXEC) != 0);
  { ScopedFd gone = std::move(p.read); }
  CHECK_FALSE(fd_open(r));
  CHECK_FALSE(p.read.valid());
  int kept = p.write.release();
  CHECK(kept == w);
  CHECK(fd_open(w));
  ScopedFd again(kept);
  again.reset();
  CHECK_FALSE(fd_open(w));
}

TEST_CASE("ScopedFd move assignment closes the descriptor it held") {
  Pipe a = make_pipe();
  Pipe b = make_pipe();
  int old = a.read.get(), moved = b.read.get();
  a.read = std::move(b.read);
  CHECK_FALSE(fd_open(old));
  CHECK(a.read.get() == moved);
  CHECK(fd_open(moved));
}

TEST_CASE("make_pipe names pipe2 when the fd limit is reached") {
#ifdef __SANITIZE_ADDRESS__
  // The address build includes UBSan's vptr check, which probes the
  // system_error's vtable through a pipe(): with the table full that probe
  // fails and UBSan reports a valid object as "invalid vptr" (its suppressions
  // cannot help: symbolizing needs descriptors too). The plain build runs it.
  SKIP_TEST("UBSan's vptr check needs free descriptors (address build)");
#endif
  // Fill the table up to a tiny soft limit in a child, so the test's own
  // limit is untouched.
  pid_t pid = fork();
  if (pid == 0) {
    rlimit lim{16, 16};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(2);
    try {
      for (int i = 0; i < 32; ++i) (void)make_pipe().read.release();
    } catch (const std::system_error& e) {
      _exit(e.code().value() == EMFILE && std::string(e.what()).find("pipe2") == 0 ? 0 : 3);
    }
    _exit(4);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("read_proc_stat reads this process and its parent, group and session") {
  auto st = read_proc_stat(getpid());
  REQUIRE(st);
  CHECK(st->pid == getpid());
  CHECK(st->ppid == getppid());
  CHECK(st->pgrp == getpgrp());
  CHECK(st->session == getsid(0));
  CHECK(st->state == 'R');
  CHECK(st->start_time > 0);
  CHECK_FALSE(read_proc_stat(-5));
}

TEST_CASE("parse_proc_stat reads past a comm holding spaces and parentheses") {
  auto st = parse_proc_stat(
      "42 (a) b (c)) S 7 8 9 34816 8 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 0 0");
  REQUIRE(st);
  CHECK(st->pid == 42);
  CHECK(st->comm == "a) b (c)");
  CHECK(st->state == 'S');
  CHECK(st->ppid == 7);
  CHECK(st->pgrp == 8);
  CHECK(st->session == 9);
  CHECK(st->start_time == 123456);
  CHECK_FALSE(parse_proc_stat("garbage"));
}

TEST_CASE("wait_exited times out on a live process and returns once it exits") {
  Pipe p = make_pipe();
  pid_t pid = child_waiting_on(p);
  REQUIRE(pid > 0);
  p.read.reset();
  CHECK_FALSE(wait_exited(pid, Clock::now()));  // still blocked in read
  auto st = read_proc_stat(pid);
  REQUIRE(st);
  CHECK(st->ppid == getpid());
  p.write.reset();  // EOF: the child exits
  CHECK(wait_exited(pid, Clock::now() + std::chrono::seconds(30)));
  // Exited but not reaped: a zombie that the wait left for its parent.
  st = read_proc_stat(pid);
  REQUIRE(st);
  CHECK(st->state == 'Z');
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WEXITSTATUS(status) == 7);
  // Reaped: the pid no longer exists, which counts as exited.
  CHECK(wait_exited(pid, Clock::now()));
}

int main(int argc, char** argv) { return ddprun::testing::main_with_skips(argc, argv); }

// RawTerminal on a real pseudo-terminal: raw while entered (signals kept),
// the modes as they were after leave() and after the owner is gone.
TEST_CASE("RawTerminal makes a terminal raw with signals kept and puts its modes back") {
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  ddprun::base::ScopedFd m(master);
  ddprun::base::ScopedFd slave(::open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(slave.valid());
  termios before{};
  REQUIRE(tcgetattr(slave.get(), &before) == 0);
  termios raw = ddprun::base::RawTerminal::raw_modes(before);
  CHECK((raw.c_lflag & (ICANON | ECHO | IEXTEN)) == 0);
  CHECK((raw.c_lflag & ISIG) != 0);  // Ctrl-C and Ctrl-Z still signal
  CHECK((raw.c_iflag & ICRNL) == 0);  // Enter reaches readline as '\r'
  CHECK((raw.c_oflag & OPOST) == (before.c_oflag & OPOST));
  // Not our controlling terminal, so not in its foreground: enter() refuses.
  ddprun::base::RawTerminal t(slave.get());
  CHECK_FALSE(t.enter());
  termios after{};
  REQUIRE(tcgetattr(slave.get(), &after) == 0);
  CHECK(after.c_lflag == before.c_lflag);
}

TEST_CASE("RawTerminal in the terminal's foreground: raw, then the saved modes back on destruction") {
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  ddprun::base::ScopedFd m(master);
  const std::string name = ptsname(master);
  termios before{};
  REQUIRE(tcgetattr(master, &before) == 0);
  // A child of its own session whose controlling terminal is the pty (the
  // foreground group there): exit 0 when raw held inside the scope.
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();
    int fd = ::open(name.c_str(), O_RDWR);
    if (fd < 0 || ioctl(fd, TIOCSCTTY, 0) != 0) _exit(2);
    ddprun::base::RawTerminal t(fd);
    termios now{};
    if (!t.enter() || tcgetattr(fd, &now) != 0 || (now.c_lflag & ICANON)) _exit(3);
    _exit(0);  // no unwinding here: leave() below is the parent's check
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // _exit skipped the destructor: still raw, as after a SIGKILL.
  termios left{};
  REQUIRE(tcgetattr(master, &left) == 0);
  CHECK((left.c_lflag & ICANON) == 0);
  // The same in-process, with the destructor: the modes come back.
  pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();
    int fd = ::open(name.c_str(), O_RDWR);
    if (fd < 0 || ioctl(fd, TIOCSCTTY, 0) != 0) _exit(2);
    if (tcsetattr(fd, TCSANOW, &before) != 0) _exit(4);
    {
      ddprun::base::RawTerminal t(fd);
      if (!t.enter()) _exit(3);
    }
    _exit(0);
  }
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  termios after{};
  REQUIRE(tcgetattr(master, &after) == 0);
  CHECK(after.c_lflag == before.c_lflag);
  CHECK(after.c_iflag == before.c_iflag);
}

TEST_CASE("read_fully gathers short writes, says EOF; send_fully to a closed peer is EPIPE, no SIGPIPE") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  ScopedFd a(sv[0]), b(sv[1]);
  // The writer sends 3 bytes at a time; the reader asks for all 12 at once.
  bool sent = true;
  std::thread writer([&] {
    for (int i = 0; i < 4; ++i) sent = send_fully(b.get(), "abc", 3) && sent;
    b.reset();  // EOF after the 12 bytes
  });
  char got[12];
  CHECK(read_fully(a.get(), got, sizeof got));
  writer.join();
  CHECK(sent);
  CHECK(std::string(got, sizeof got) == "abcabcabcabc");
  errno = EINVAL;
  CHECK_FALSE(read_fully(a.get(), got, 1));
  CHECK(errno == 0);  // end of file, not an error
  // The peer is gone: a plain write() would raise SIGPIPE and kill the test.
  int again[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, again) == 0);
  ScopedFd c(again[0]);
  ::close(again[1]);
  CHECK_FALSE(send_fully(c.get(), "x", 1));
  CHECK(errno == EPIPE);
}

TEST_CASE("utc_iso8601 is glibc's gmtime_r and strftime, without their time-zone file, to the "
          "microsecond") {
  using std::chrono::microseconds;
  using std::chrono::system_clock;
  // The epoch, leap days (2000 is one, 2100 is not), year ends, a time
  // before 1970, and now.
  const int64_t seconds[] = {0, 951782400, 951868799, 4107542400, 4107628800, 1767225599,
                             -86401, 1796447467};
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(system_clock::now().time_since_epoch());
  std::vector<int64_t> all(std::begin(seconds), std::end(seconds));
  all.push_back(now.count());
  for (const int64_t s : all) {
    CAPTURE(s);
    const std::time_t tt = static_cast<std::time_t>(s);
    std::tm tm{};
    REQUIRE(::gmtime_r(&tt, &tm) != nullptr);
    char want[64];
    std::strftime(want, sizeof want, "%Y-%m-%dT%H:%M:%S", &tm);
    const system_clock::time_point t{std::chrono::seconds(s) + microseconds(123456)};
    CHECK(ddprun::base::utc_iso8601(t) == std::string(want) + "Z");
    CHECK(ddprun::base::utc_iso8601(t, 3) == std::string(want) + ".123Z");
    CHECK(ddprun::base::utc_iso8601(t, 6) == std::string(want) + ".123456Z");
  }
}
