// Stack capture of real hung processes: eu-stack and gdb on a native
// worker, the fall-through between them, the /proc fallback, and
// faulthandler's traceback from a Python worker's log, and the bytecode
// probe that tells a Python loop from one long native call.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <map>

#include "tests/common/skip.h"
#include "tests/common/slurp.h"
#include "tests/watchdog/test_util.h"
#include "tests/common/test_python.h"
#include "watchdog/live_stack.h"
#include "watchdog/proc.h"
#include "watchdog/python_stack.h"
#include "watchdog/stack_capture.h"

namespace wd = ddprun::watchdog;
using namespace wd::testing;

TEST_CASE("eu-stack captures the stack of a hung native worker") {
  if (!tool_installed("eu-stack")) {
    SKIP_TEST("eu-stack (elfutils) is not installed: skipping the eu-stack capture test");
  }
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  const auto c = wd::capture_native_stack(child.pid(), 2, dir.path());  // defaults
  CAPTURE(c.note);
  CHECK(c.method == wd::StackMethod::kEuStack);
  CHECK(c.note.empty());
  CHECK(c.path == dir.path() + "/stack_rank2.txt");
  CHECK(c.text.find("ddprun_test_hang_here") != std::string::npos);
  CHECK(slurp(c.path).find("ddprun_test_hang_here") != std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);  // eu-stack detached; the worker lives on

  // Source lines on request: the worker's file is named.
  wd::StackCaptureOptions opt;
  opt.source_lines = true;
  const auto s = wd::capture_native_stack(child.pid(), 2, dir.path(), opt);
  CHECK(s.method == wd::StackMethod::kEuStack);
  CHECK(s.text.find("test_worker.cc:") != std::string::npos);
}

TEST_CASE("without eu-stack the capture falls back to gdb and says why") {
  if (!tool_installed("gdb")) {
    SKIP_TEST("gdb is not installed: skipping the eu-stack -> gdb fallback test");
  }
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  wd::StackCaptureOptions opt;
  opt.eu_stack = "/nonexistent/eu-stack";
  const auto c = wd::capture_native_stack(child.pid(), 1, dir.path(), opt);
  CAPTURE(c.note);
  CHECK(c.method == wd::StackMethod::kGdb);
  CHECK(c.note.find("/nonexistent/eu-stack") != std::string::npos);
  CHECK(c.text.find("ddprun_test_hang_here") != std::string::npos);
  CHECK(slurp(c.path).find("ddprun_test_hang_here") != std::string::npos);
}

TEST_CASE("a worker that refuses ptrace gets the /proc view, with each tool's reason") {
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  // A process has one tracer: while this test holds it (SEIZE does not stop
  // it), eu-stack's and gdb's attach are refused, as under a debugger.
  REQUIRE(::ptrace(PTRACE_SEIZE, child.pid(), nullptr, nullptr) == 0);
  const auto c = wd::capture_native_stack(child.pid(), 0, dir.path());
  CAPTURE(c.note);
  CHECK(c.method == wd::StackMethod::kProc);
  if (tool_installed("eu-stack")) CHECK(c.note.find("eu-stack") != std::string::npos);
  if (tool_installed("gdb")) CHECK(c.note.find("gdb") != std::string::npos);
  CHECK(c.text.find("watchdog_test_w") != std::string::npos);  // comm, from /proc
  CHECK(c.text.find("ddprun_test_hang_here") == std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);
}  // Child's SIGKILL ends the traced worker; we are its parent and tracer, so it is reaped.

TEST_CASE("gdb captures the stack of a hung native worker") {
  if (!tool_installed("gdb")) {
    SKIP_TEST("gdb is not installed: skipping the gdb capture test");
  }
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  CHECK_FALSE(wd::python_faulthandler_enabled(child.pid()));
  wd::StackCaptureOptions opt;
  opt.eu_stack = "";  // gdb only
  const auto c = wd::capture_native_stack(child.pid(), 3, dir.path(), opt);
  CAPTURE(c.note);
  CHECK(c.method == wd::StackMethod::kGdb);
  CHECK(c.note == "eu-stack disabled");
  CHECK(c.path == dir.path() + "/stack_rank3.txt");
  CHECK(c.text.find("ddprun_test_hang_here") != std::string::npos);
  std::ifstream saved(c.path);
  std::string file((std::istreambuf_iterator<char>(saved)), {});
  CHECK(file.find("ddprun_test_hang_here") != std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);  // gdb detached; the worker lives on
}

TEST_CASE("without eu-stack and gdb the kernel's view of the threads is saved") {
  TempDir dir;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  REQUIRE(::kill(child.pid(), SIGSTOP) == 0);
  // SIGSTOP is delivered asynchronously: wait for the stop itself (the child
  // is ours; WNOWAIT leaves it for the Child owner to reap).
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, child.pid(), &info, WSTOPPED | WNOWAIT) == 0);
  wd::StackCaptureOptions opt;
  opt.eu_stack = "/nonexistent/eu-stack";
  opt.gdb = "/nonexistent/gdb";
  const auto c = wd::capture_native_stack(child.pid(), 0, dir.path(), opt);
  CHECK(c.method == wd::StackMethod::kProc);
  CHECK(c.note.find("/nonexistent/eu-stack") != std::string::npos);
  CHECK(c.note.find("/nonexistent/gdb") != std::string::npos);
  CHECK(c.text.find("state T") != std::string::npos);
  CHECK(c.text.find("watchdog_test_w") != std::string::npos);  // comm
}

TEST_CASE("SIGABRT makes a faulthandler-enabled Python worker log its traceback") {
  TempDir dir;
  const std::string log = dir.path() + "/stderr.log";
  Child child({test_python(), "-c",
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
  Child child({test_python(), "-c", "print('ready', flush=True); import time; time.sleep(60)"},
              {{"PYTHONFAULTHANDLER", ""}}, true);
  REQUIRE(child.wait_for_output("ready"));
  CHECK(wd::is_python_process(child.pid()));
  CHECK_FALSE(wd::python_faulthandler_enabled(child.pid()));
}

TEST_CASE("PYTHONFAULTHANDLER does not count for python -I or -E, which ignore it") {
  for (const char* flag : {"-I", "-E", "-uI"}) {
    CAPTURE(flag);
    Child child({test_python(), flag, "-c", "print('ready', flush=True); import time; time.sleep(60)"},
                {{"PYTHONFAULTHANDLER", "1"}}, true);
    REQUIRE(child.wait_for_output("ready"));
    CHECK(wd::runs_python(child.pid()));
    // SIGABRT would kill it without a traceback: it must go to py-spy.
    CHECK_FALSE(wd::python_faulthandler_enabled(child.pid()));
  }
  // -X faulthandler is an option, not the environment: it still counts.
  Child child({test_python(), "-I", "-X", "faulthandler", "-c",
               "print('ready', flush=True); import time; time.sleep(60)"},
              {}, true);
  REQUIRE(child.wait_for_output("ready"));
  CHECK(wd::python_faulthandler_enabled(child.pid()));
}

TEST_CASE("without py-spy and pystack the Python capture names the install command") {
  Child child({test_python(), "-c", "print('ready', flush=True); import time; time.sleep(60)"}, {},
              true);
  REQUIRE(child.wait_for_output("ready"));
  TempDir dir;
  wd::StackCaptureOptions o;
  o.py_spy = dir.path() + "/no-py-spy";
  o.pystack = dir.path() + "/no-pystack";
  const auto c = wd::capture_python_stack(child.pid(), 0, dir.path(), o);
  CHECK(c.method == wd::StackMethod::kNone);
  CHECK(c.text.empty());
  CHECK(c.note.find("neither py-spy nor pystack is installed (pip install py-spy)") !=
        std::string::npos);
}

TEST_CASE("py-spy is found in the tools folder before PATH and run by its path") {
  // What pip does with the wheel: py-spy beside ddprun in a venv's bin/,
  // which is not on PATH. A stand-in py-spy prints its argv as a "thread".
  Child child({test_python(), "-c", "print('ready', flush=True); import time; time.sleep(60)"}, {},
              true);
  REQUIRE(child.wait_for_output("ready"));
  TempDir dir;
  const std::string tool = dir.path() + "/py-spy";
  std::ofstream(tool) << "#!/bin/sh\necho \"Thread 1 (idle): $0 $*\"\n";
  REQUIRE(::chmod(tool.c_str(), 0700) == 0);
  wd::StackCaptureOptions o;
  o.python_tools_dir = dir.path();
  const auto c = wd::capture_python_stack(child.pid(), 0, dir.path(), o);
  CAPTURE(c.note);
  CHECK(c.method == wd::StackMethod::kPySpy);
  CHECK(c.text == "Thread 1 (idle): " + tool + " dump --pid " + std::to_string(child.pid()) + "\n");
}

namespace {

// A Python process started as ddprun starts its workers: its sitecustomize
// registers the stack signal and the bytecode probe (live_stack.h).
std::map<std::string, std::string> bootstrap_env(const TempDir& dir) {
  return {{"DDPRUN_PYSTACK_SIGNAL", std::to_string(SIGRTMIN + 6)},
          {"DDPRUN_PYSTACK_DIR", dir.path()},
          {"PYTHONPATH", INTROSPECT_PYTHON_DIR}};
}

}  // namespace

TEST_CASE("the bytecode probe: a Python loop answers in the frame its stack dump names") {
  TempDir dir;
  Child child({test_python(), "-c",
               "def spin():\n    print('ready', flush=True)\n    x = 0\n    while True:\n"
               "        x += 1\n"
               "spin()\n"},
              bootstrap_env(dir), true);
  REQUIRE(child.wait_for_output("ready"));
  // Dumped until it is in the loop (it printed from inside spin(), and may
  // not have reached the loop yet), as the evidence sees a rank stuck there.
  wd::PythonWhere where;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto dump = wd::dump_python_stack(child.pid(), std::chrono::seconds(30));
    REQUIRE_MESSAGE(dump.ok, dump.note);
    where = wd::parse_python_stack(dump.text);
    if (where.found && where.frames.front().line >= 4) break;
  }
  REQUIRE(where.found);
  REQUIRE(where.frames.front().line >= 4);
  const auto probe = wd::probe_bytecode(child.pid(), std::chrono::seconds(30));
  REQUIRE_MESSAGE(probe.answered, probe.note);
  CHECK(probe.function == "spin");
  CHECK(probe.function == where.frames.front().function);
  CHECK(probe.file == where.frames.front().file);
  CHECK((probe.line == 4 || probe.line == 5));
  CHECK(probe.bytes > 0);
  CHECK(::kill(child.pid(), 0) == 0);  // the worker runs on
}

TEST_CASE("the bytecode probe: one long native call holding the interpreter does not answer") {
  TempDir dir;
  // sum() over a range runs in C from start to end: no bytecode between.
  Child child({test_python(), "-c", "print('ready', flush=True)\nsum(range(10**13))\n"},
              bootstrap_env(dir), true);
  REQUIRE(child.wait_for_output("ready"));
  // faulthandler's C handler still dumps it (the evidence's stacks)...
  const auto dump = wd::dump_python_stack(child.pid(), std::chrono::seconds(30));
  REQUIRE_MESSAGE(dump.ok, dump.note);
  // ...but the Python handler waits for the call to return.
  const auto probe = wd::probe_bytecode(child.pid(), std::chrono::milliseconds(500));
  CHECK_FALSE(probe.answered);
  CHECK(probe.note.find("no answer") != std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);
}

TEST_CASE("the bytecode probe is never sent to a process without ddprun's bootstrap") {
  TempDir dir;
  auto env = bootstrap_env(dir);
  env.erase("PYTHONPATH");  // no sitecustomize: a probe signal would kill it
  Child child({test_python(), "-S", "-c", "print('ready', flush=True)\nwhile True: pass\n"}, env, true);
  REQUIRE(child.wait_for_output("ready"));
  const auto probe = wd::probe_bytecode(child.pid(), std::chrono::milliseconds(500));
  CHECK_FALSE(probe.answered);
  CHECK(probe.note.find("no handler") != std::string::npos);
  CHECK(::kill(child.pid(), 0) == 0);
}
