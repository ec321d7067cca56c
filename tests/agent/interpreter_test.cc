// Which interpreter runs a .py program (PYTHON_EXEC, then DDPRUN_PYTHON, then
// python3 from PATH), and the summary line that names it when a Python
// worker fails before its first output. Uses Debian's /usr/bin/python3 and
// /usr/bin/python3.11 (the same interpreter under two names, so the worker's
// sys.executable shows which one ran); no torch needed.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "tests/agent/ddprun_process.h"
#include "tests/common/skip.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;

namespace {

const char* kPy = "/usr/bin/python3";
const char* kPy311 = "/usr/bin/python3.11";

std::string script() { return std::string(WORKERS_DIR) + "/print_interpreter.py"; }

}  // namespace

TEST_CASE("PYTHON_EXEC picks the interpreter of a .py program before DDPRUN_PYTHON") {
  if (access(kPy, X_OK) != 0 || access(kPy311, X_OK) != 0)
    SKIP_TEST(std::string(kPy) + " or " + kPy311 + " is missing");
  auto r = run_ddprun({script()},
                      {std::string("PYTHON_EXEC=") + kPy311, std::string("DDPRUN_PYTHON=") + kPy});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == std::string("[default0]:python ") + kPy311 + "\n");
  r = run_ddprun({script()}, {"PYTHON_EXEC=", std::string("DDPRUN_PYTHON=") + kPy});
  CHECK(r.status == 0);
  CHECK(r.out == std::string("[default0]:python ") + kPy + "\n");
}

TEST_CASE("a Python worker failing before its first output: the summary names the interpreter") {
  if (access(kPy311, X_OK) != 0) SKIP_TEST(std::string(kPy311) + " is missing");
  auto r = run_ddprun({script(), "fail-first"}, {std::string("PYTHON_EXEC=") + kPy311});
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("ModuleNotFoundError") != std::string::npos);
  CHECK(r.err.find(std::string("  python: the worker failed before its first output, running ") +
                   kPy311 + " ($PYTHON_EXEC); if that is the wrong interpreter, choose another "
                   "with PYTHON_EXEC=/path/to/python (or DDPRUN_PYTHON)\n") != std::string::npos);

  // A bare name is resolved through PATH, and the default is named as such.
  r = run_ddprun({script(), "fail-first"}, {"PYTHON_EXEC=", "DDPRUN_PYTHON=", "PATH=/usr/bin"});
  CHECK(r.status == 1);
  CHECK(r.err.find("running python3 = /usr/bin/python3 (the default: python3 from PATH)") !=
        std::string::npos);

  // `ddprun /usr/bin/python3.11 x.py`: the user named it; PYTHON_EXEC would not help.
  r = run_ddprun({kPy311, script(), "fail-first"}, {"PYTHON_EXEC=", "DDPRUN_PYTHON="});
  CHECK(r.status == 1);
  CHECK(r.err.find(std::string("running ") + kPy311 + " (the command line); if that is the wrong "
                   "interpreter, name another on the command line\n") != std::string::npos);
}

TEST_CASE("a Python worker that failed after printing gets no interpreter line") {
  if (access(kPy311, X_OK) != 0) SKIP_TEST(std::string(kPy311) + " is missing");
  auto r = run_ddprun({script(), "fail-after"}, {std::string("PYTHON_EXEC=") + kPy311});
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK(r.out == std::string("[default0]:python ") + kPy311 + "\n");
  CHECK(r.err.find("ModuleNotFoundError") != std::string::npos);
  CHECK(r.err.find("python: the worker failed") == std::string::npos);
}

TEST_CASE("the user's sitecustomize on PYTHONPATH is the one `import sitecustomize` returns") {
  if (access(kPy, X_OK) != 0) SKIP_TEST(std::string(kPy) + " is missing");
  TempDir dir;
  REQUIRE(::mkdir(dir.file("site").c_str(), 0755) == 0);
  std::ofstream(dir.file("site/sitecustomize.py")) << "import os\nMARK = 'user ' + str(os.getpid())\n";
  // ddprun's bootstrap ran too: its automatic heartbeats are installed
  // (ddprun_autobeat.install() records the worker's pid).
  std::ofstream(dir.file("w.py")) << "import os, sys, sitecustomize, ddprun_autobeat\n"
                                     "assert sitecustomize.MARK == 'user %d' % os.getpid()\n"
                                     "assert ddprun_autobeat._main_pid == os.getpid()\n"
                                     "print('ok', sitecustomize.__file__)\n";
  auto r = run_ddprun({"--nproc-per-node=2", dir.file("w.py")},
                      {std::string("DDPRUN_PYTHON=") + kPy, "PYTHONPATH=" + dir.file("site")});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(count_of(r.out, "]:ok " + dir.file("site/sitecustomize.py") + "\n") == 2);
}

TEST_CASE("no interpreter line without its evidence: after init_process_group, sys.exit(3), "
          "SIGSEGV, SIGKILL") {
  if (access(kPy, X_OK) != 0) SKIP_TEST(std::string(kPy) + " is missing");
  TempDir dir;
  // None prints to stdout, so "before its first output" alone would hint.
  // The first needs torch (Debian's python3-torch 1.13 under /usr/bin/python3).
  const std::pair<const char*, int> cases[] = {
      {"import torch.distributed as dist\n"
       "dist.init_process_group('gloo')\n"
       "raise RuntimeError('failed after init_process_group')\n", 1},
      {"import sys\nsys.exit(3)\n", 3},
      {"import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", 128 + 11},
      {"import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 128 + 9},
  };
  std::vector<std::string> env = sanitizers_leave_segv();
  env.push_back(std::string("DDPRUN_PYTHON=") + kPy);
  for (const auto& [code, status] : cases) {
    std::ofstream(dir.file("w.py"), std::ios::trunc) << code;
    auto r = run_ddprun({"--nproc-per-node=2", dir.file("w.py")}, env, Seconds(120));
    INFO(code, r.err);
    CHECK(r.status == status);
    CHECK(r.err.find("root cause: rank") != std::string::npos);
    CHECK(r.err.find("python: the worker failed") == std::string::npos);
  }
}

TEST_CASE("an interpreter that cannot run (exit 127 at once) gets the interpreter line") {
  TempDir dir;
  // A wrapper whose python is gone, as a stale venv's bin/python is.
  std::ofstream(dir.file("python")) << "#!/bin/sh\necho 'python: /opt/gone/bin/python3: not found' >&2\n"
                                       "exit 127\n";
  REQUIRE(::chmod(dir.file("python").c_str(), 0755) == 0);
  std::ofstream(dir.file("w.py")) << "print('never')\n";
  auto r = run_ddprun({dir.file("w.py")}, {"PYTHON_EXEC=" + dir.file("python")});
  INFO(r.err);
  CHECK(r.status == 127);
  CHECK(r.err.find("  python: the worker failed before its first output, running " +
                   dir.file("python") + " ($PYTHON_EXEC)") != std::string::npos);
}
