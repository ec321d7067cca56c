// base/subprocess.h on real programs: output and exit codes, the errors a
// user sees for a program that cannot start, the deadline killing the
// tool's whole group, the limit on captured output, the child's signal
// state, the quiet (no SIGCHLD) child, and no descriptor left open.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>

#include "base/pidfd.h"
#include "base/procfs.h"
#include "base/subprocess.h"
#include "tests/common/temp_dir.h"

using ddprun::base::ChildSpec;
using ddprun::base::run_bounded;
using ddprun::base::shell_exit_code;
using ddprun::base::termination;
using namespace std::chrono_literals;

namespace {

int open_fds() {
  // Counts the lister's own descriptor too, the same every time.
  return static_cast<int>(ddprun::base::list_dir("/proc/self/fd").size());
}

ChildSpec sh(const std::string& script, bool quiet = false) {
  return ChildSpec{{"/bin/sh", "-c", script}, {}, -1, quiet};
}

// The hex mask of `field` ("SigBlk") in a process's own /proc status, as
// the captured output of cat shows it.
unsigned long long status_mask(const std::string& status, const std::string& field) {
  const auto at = status.find(field + ":\t");
  REQUIRE(at != std::string::npos);
  return std::stoull(status.substr(at + field.size() + 2, 16), nullptr, 16);
}

}  // namespace

TEST_CASE("run_bounded: stdout and stderr together, the exit code, a signal as 128+N") {
  for (bool quiet : {false, true}) {  // the same through the quiet child's hand-over
    CAPTURE(quiet);
    const int fds = open_fds();
    auto r = run_bounded(sh("echo out; echo err >&2; exit 3", quiet), 30s);
    CHECK(r.started);
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 3);
    CHECK(r.output == "out\nerr\n");
    r = run_bounded(sh("kill -TERM $$", quiet), 30s);
    CHECK(r.exit_code == 128 + SIGTERM);
    r = run_bounded(ChildSpec{{"/nonexistent/tool"}, {}, -1, quiet}, 30s);
    CHECK_FALSE(r.started);
    CHECK(r.error == "/nonexistent/tool: No such file or directory");
    CHECK(open_fds() == fds);
  }
}

TEST_CASE("run_bounded: a program that cannot start is one line naming it, and nothing leaks") {
  const int fds = open_fds();
  auto r = run_bounded(ChildSpec{{"ddprun-no-such-program"}, {}, -1, false}, 30s);
  CHECK_FALSE(r.started);
  CHECK(r.error == "ddprun-no-such-program: not found in PATH");
  ddprun::testing::TempDir dir;
  const std::string plain = dir.file("not-executable");
  std::ofstream(plain) << "#!/bin/sh\n";
  ::chmod(plain.c_str(), 0644);
  r = run_bounded(ChildSpec{{plain}, {}, -1, false}, 30s);
  CHECK_FALSE(r.started);
  CHECK(r.error == plain + ": Permission denied");  // execve refuses root too without an x bit
  r = run_bounded(ChildSpec{{dir.file("missing")}, {}, -1, false}, 30s);
  CHECK(r.error == dir.file("missing") + ": No such file or directory");
  // PATH for the lookup is the child's: extra_env's replaces ours.
  r = run_bounded(ChildSpec{{"sh", "-c", "true"}, {"PATH=" + dir.path()}, -1, false}, 30s);
  CHECK(r.error == "sh: not found in PATH");
  CHECK(open_fds() == fds);
}

TEST_CASE("run_bounded: extra_env replaces a variable of ours rather than adding a second") {
  ::setenv("DDPRUN_SUBPROCESS_TEST", "ours", 1);
  const auto r = run_bounded(ChildSpec{{"/bin/sh", "-c", "env | grep -c ^DDPRUN_SUBPROCESS_TEST=; "
                                                         "echo $DDPRUN_SUBPROCESS_TEST"},
                                       {"DDPRUN_SUBPROCESS_TEST=extra"}, -1, false},
                             30s);
  ::unsetenv("DDPRUN_SUBPROCESS_TEST");
  CHECK(r.output == "1\nextra\n");
}

TEST_CASE("run_bounded: at the deadline the tool's group goes, what it left running included") {
  // The sleep holds the output open: the tool either waits for it or has
  // exited and left it; both end at the deadline, the sleep killed too.
  for (bool quiet : {false, true})
  for (const char* script : {"sleep 600 & echo $!; wait", "sleep 600 & echo $!"}) {
    CAPTURE(quiet);
    CAPTURE(script);
    const int fds = open_fds();
    const auto r = run_bounded(sh(script, quiet), 500ms);
    CHECK(r.started);
    CHECK(r.timed_out);
    const pid_t sleeper = std::stoi(r.output);
    // Killed; reaped by whoever inherited it: gone within the bound.
    CHECK(ddprun::base::wait_exited(sleeper, std::chrono::steady_clock::now() + 30s));
    CHECK(open_fds() == fds);
  }
}

TEST_CASE("run_bounded: output past the limit is read and dropped, so the tool ends on its own") {
  const auto r = run_bounded(ChildSpec{{"head", "-c", "1000000", "/dev/zero"}, {}, -1, false}, 60s, 1000);
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(r.output.size() == 1000);
}

TEST_CASE("start_child: an empty signal mask and SIGPIPE at its default, whatever the caller's") {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  REQUIRE(::pthread_sigmask(SIG_BLOCK, &block, &old) == 0);
  struct sigaction ignore{}, was{};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGPIPE, &ignore, &was) == 0);
  const auto r = run_bounded(ChildSpec{{"cat", "/proc/self/status"}, {}, -1, false}, 30s);
  ::sigaction(SIGPIPE, &was, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  REQUIRE(r.exit_code == 0);
  CHECK(status_mask(r.output, "SigBlk") == 0);
  CHECK((status_mask(r.output, "SigIgn") & (1ULL << (SIGPIPE - 1))) == 0);
}

TEST_CASE("start_child quiet_exit: no SIGCHLD and no waitpid(-1) takes it; reap_bounded does") {
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  REQUIRE(::pthread_sigmask(SIG_BLOCK, &chld, &old) == 0);
  // Earlier cases' orphans may be ours to reap (the test runner may be a
  // subreaper): reaped, and their SIGCHLD taken, first.
  int status = 0;
  while (::waitpid(-1, &status, WNOHANG) > 0) {
  }
  const timespec now{0, 0};
  while (::sigtimedwait(&chld, nullptr, &now) == SIGCHLD) {
  }
  std::string error;
  const pid_t pid = ddprun::base::start_child(ChildSpec{{"/bin/sh", "-c", "exit 7"}, {}, -1, true}, &error);
  REQUIRE(pid > 0);
  REQUIRE(ddprun::base::wait_exited(pid, std::chrono::steady_clock::now() + 30s));
  errno = 0;
  CHECK(::waitpid(pid, &status, WNOHANG) == -1);  // an agent's reaper would not see it
  CHECK(errno == ECHILD);
  sigset_t pending;
  sigpending(&pending);
  CHECK_FALSE(sigismember(&pending, SIGCHLD));
  CHECK(ddprun::base::reap_bounded(pid, true, std::chrono::steady_clock::now() + 30s, &status));
  CHECK(ddprun::base::shell_exit_code(status) == 7);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

TEST_CASE("termination decodes a real exit code and a real signal; shell_exit_code follows it") {
  const pid_t exited = ::fork();
  if (exited == 0) ::_exit(7);
  int status = 0;
  REQUIRE(::waitpid(exited, &status, 0) == exited);
  auto t = termination(status);
  REQUIRE(t.has_value());
  CHECK_FALSE(t->signaled);
  CHECK(t->code == 7);
  CHECK_FALSE(t->success());
  CHECK(shell_exit_code(status) == 7);

  const pid_t killed = ::fork();
  if (killed == 0) {
    ::signal(SIGTERM, SIG_DFL);  // not doctest's crash handler
    ::raise(SIGTERM);
    ::_exit(0);
  }
  REQUIRE(::waitpid(killed, &status, 0) == killed);
  t = termination(status);
  REQUIRE(t.has_value());
  CHECK(t->signaled);
  CHECK(t->signal == SIGTERM);
  CHECK(shell_exit_code(status) == 128 + SIGTERM);
}
