// Stack capture of real hung processes: gdb on a native worker, the /proc
// fallback, and faulthandler's traceback from a Python worker's log.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>

#include "tests/watchdog/test_util.h"
#include "watchdog/proc.h"
#include "watchdog/stack_capture.h"

namespace wd = ddprun::watchdog;
using wd::test::Child;
using wd::test::TempDir;

namespace {

bool have_gdb() {
  Child probe({"sh", "-c", "command -v gdb >/dev/null"});
  const int st = probe.wait();
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

}  // namespace

TEST_CASE("gdb captures the stack of a hung native worker") {
  if (!have_gdb()) {
    MESSAGE("gdb is not installed: skipping the gdb capture test");
    return;
  }
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  CHECK_FALSE(wd::python_faulthandler_enabled(child.pid()));
  const auto c = wd::capture_native_stack(child.pid(), 3, dir.path());
  CAPTURE(c.note);
  CHECK(c.method == wd::StackMethod::kGdb);
  CHECK(c.path == dir.path() + "/stack_rank3.txt");
  CHECK(c.text.find("ddprun_test_hang_here") != std::string::npos);
  std::ifstream saved(c.path);
  std::string file((std::istreambuf_iterator<char>(saved)), {});
  CHECK(file.find("ddprun_test_hang_here") != std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);  // gdb detached; the worker lives on
}

TEST_CASE("without gdb the kernel's view of the threads is saved") {
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  REQUIRE(::kill(child.pid(), SIGSTOP) == 0);
  // SIGSTOP is delivered asynchronously: wait for the stop itself (the child
  // is ours; WNOWAIT leaves it for the Child owner to reap).
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, child.pid(), &info, WSTOPPED | WNOWAIT) == 0);
  wd::StackCaptureOptions opt;
  opt.gdb = "/nonexistent/gdb";
  const auto c = wd::capture_native_stack(child.pid(), 0, dir.path(), opt);
  CHECK(c.method == wd::StackMethod::kProc);
  CHECK(c.note.find("/nonexistent/gdb") != std::string::npos);
  CHECK(c.text.find("state T") != std::string::npos);
  CHECK(c.text.find("watchdog_test_w") != std::string::npos);  // comm
}

TEST_CASE("SIGABRT makes a faulthandler-enabled Python worker log its traceback") {
  TempDir dir;
  const std::string log = dir.path() + "/stderr.log";
  Child child({"/usr/bin/python3", "-c",
               "import time\n"
               "def blocked_in_barrier_here():\n"
               "    print('ready', flush=True)\n"
               "    while True: time.sleep(10)\n"
               "blocked_in_barrier_here()\n"},
              {{"PYTHONFAULTHANDLER", "1"}}, true, log);
  REQUIRE(child.wait_for_output("ready"));
  CHECK(wd::is_python_process(child.pid()));
  CHECK(wd::python_faulthandler_enabled(child.pid()));
  REQUIRE(::kill(child.pid(), SIGABRT) == 0);
  const int status = child.wait();
  CHECK(WIFSIGNALED(status));
  const std::string tb = wd::extract_python_traceback(log);
  CHECK(tb.find("Fatal Python error: Aborted") == 0);
  CHECK(tb.find("blocked_in_barrier_here") != std::string::npos);
}

TEST_CASE("a Python worker without faulthandler is not sent SIGABRT for a traceback") {
  Child child({"/usr/bin/python3", "-c", "print('ready', flush=True); import time; time.sleep(60)"},
              {{"PYTHONFAULTHANDLER", ""}}, true);
  REQUIRE(child.wait_for_output("ready"));
  CHECK(wd::is_python_process(child.pid()));
  CHECK_FALSE(wd::python_faulthandler_enabled(child.pid()));
}
