// ddprun attach on jobs ddprun did not start: torchrun and plain processes.
// torchrun is Debian's 1.13 (/usr/bin/python3 -m torch.distributed.run,
// through bench/torchrun-1.13, which repairs its flag parsing on Python
// 3.11), or, under the torch2 label (DDPRUN_TEST_PYTHON set to the venv's
// python, tests/common/test_python.h), that torch 2.x's own
// `python -m torch.distributed.run`.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "base/proc_stat.h"
#include "introspect/stacks.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/python_stack_tools.h"
#include "tests/common/run_folder.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_python.h"

namespace {

using ddprun::testing::DdprunProcess;
using ddprun::testing::TempDir;
using nlohmann::json;
constexpr const char* kPython = "/usr/bin/python3";

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The interpreter torchrun runs under: the torch2 venv's, else Debian's.
std::string torch_python() {
  return std::getenv("DDPRUN_TEST_PYTHON") ? ddprun::testing::test_python() : kPython;
}

// torchrun's command line before its own flags, run with torch_python().
std::vector<std::string> torchrun_args() {
  if (std::getenv("DDPRUN_TEST_PYTHON")) return {"-m", "torch.distributed.run"};
  return {std::string(TORCHRUN_113)};
}

bool torch_available() {
  DdprunProcess p({"-c", "import torch.distributed.run"}, {}, torch_python());
  const auto r = p.finish(std::chrono::seconds(120));
  return !r.timed_out && r.status == 0;
}

bool dead(pid_t pid) {
  const auto st = ddprun::base::read_proc_stat(pid);
  return !st || st->state == 'Z';
}

}  // namespace

TEST_CASE("torchrun: attach on a job whose rank stops progressing reports its stack and kills "
          "the tree") {
  if (!torch_available()) {
    // ctest reports the test skipped (SKIP_RETURN_CODE), not passed.
    MESSAGE("SKIP: no torch for " << torch_python() << " -m torch.distributed.run");
    std::exit(77);
  }
  std::printf("torchrun under %s\n", torch_python().c_str());  // in ctest's log
  TempDir dir;
  const std::string pystacks = dir.file("pystacks");
  ::mkdir(pystacks.c_str(), 0700);
  // The job is started the way a user would to get Python stacks from it.
  auto args = torchrun_args();
  for (const std::string& a : {std::string("--nnodes"), std::string("1"), std::string("--nproc_per_node"),
                               std::string("2"), std::string("--master_port"), std::to_string(free_port()),
                               std::string(INTROSPECT_SCRIPTS) + "/torchrun_worker.py"})
    args.push_back(a);
  DdprunProcess torchrun(
      args,
      {"PYTHONPATH=" + ddprun::introspect::python_dir(),
       "DDPRUN_PYSTACK_SIGNAL=" + std::to_string(ddprun::introspect::pystack_signal()),
       "DDPRUN_PYSTACK_DIR=" + pystacks, "OMP_NUM_THREADS=1"},
      torch_python());
  if (!torchrun.wait_for_stdout(
          [](const std::string& o) { return o.find("rank 1 stuck") != std::string::npos; },
          std::chrono::seconds(180))) {
    const auto f = torchrun.finish(std::chrono::seconds(30));
    FAIL("torchrun did not get its rank 1 stuck; exit " << f.status << "\nstdout: " << f.out
                                                       << "\nstderr: " << f.err);
  }
  const std::string reports = dir.file("report");
  ::mkdir(reports.c_str(), 0700);
  const auto r = ddprun::testing::run_ddprun(
      {"attach", std::to_string(torchrun.pid()), "--silence-timeout", "2", "--on-hang", "kill",
       "--kill-grace", "10", "--report-dir", reports},
      {}, std::chrono::seconds(120));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.out.find("HANG") != std::string::npos);
  std::ifstream in(reports + "/hang_report.json");
  REQUIRE(in);
  const json report = json::parse(in);
  CHECK(report["rank"] == 1);
  CHECK(report["kind"] == "silence_timeout");  // attach's no-progress rule
  CHECK(report["attach_kind"] == "no_progress");
  CHECK(report["watched"].size() == 2);
  MESSAGE("attach: report written " << report["report_after_due_ms"].get<double>()
                                    << " ms after the silence timeout passed");
  // The stuck rank's stacks come first: Python's from inside stuck(), and native.
  REQUIRE(report["stacks"].size() >= 2);
  const json& py = report["stacks"].at(0);
  CHECK(py["rank"] == 1);
  CHECK(py["method"] == "python_faulthandler");
  CHECK(py["text"].get<std::string>().find("in stuck") != std::string::npos);
  const json& native = report["stacks"].at(1);
  CHECK(native["rank"] == 1);
  CHECK(!native["text"].get<std::string>().empty());
  // --on-hang kill ended the whole tree: torchrun and both ranks.
  const auto end = torchrun.finish(std::chrono::seconds(60));
  CHECK(!end.timed_out);
  for (const auto& w : report["watched"]) CHECK(dead(w["pid"].get<pid_t>()));
}

TEST_CASE("uninstrumented torchrun: attach reads Python stacks from outside: the hung "
          "rank's function and line, its peer's all_reduce") {
  if (!ddprun::testing::py_spy_available()) {
    MESSAGE("SKIP: no py-spy in " << PYTOOLS_BIN << " or on PATH (scripts/setup-pytools.sh)");
    std::exit(77);
  }
  if (!torch_available()) {
    MESSAGE("SKIP: no torch for " << torch_python() << " -m torch.distributed.run");
    std::exit(77);
  }
  std::printf("torchrun under %s\n", torch_python().c_str());  // in ctest's log
  TempDir dir;
  // Plain torchrun: no PYTHONPATH, no DDPRUN_PYSTACK_*, no faulthandler.
  auto args = torchrun_args();
  for (const std::string& a :
       {std::string("--nnodes"), std::string("1"), std::string("--nproc_per_node"), std::string("2"),
        std::string("--master_port"), std::to_string(free_port()),
        std::string(INTROSPECT_SCRIPTS) + "/torchrun_collective_hang.py"})
    args.push_back(a);
  DdprunProcess torchrun(args, {"OMP_NUM_THREADS=1"}, torch_python());
  if (!torchrun.wait_for_stdout(
          [](const std::string& o) {
            return o.find("rank 1 stuck") != std::string::npos &&
                   o.find("rank 0 in all_reduce") != std::string::npos;
          },
          std::chrono::seconds(180))) {
    const auto f = torchrun.finish(std::chrono::seconds(30));
    FAIL("torchrun's ranks did not reach their hang; exit " << f.status << "\nstdout: " << f.out
                                                            << "\nstderr: " << f.err);
  }
  const std::string reports = dir.file("report");
  ::mkdir(reports.c_str(), 0700);
  const auto r = ddprun::testing::run_ddprun(
      {"attach", std::to_string(torchrun.pid()), "--silence-timeout", "2", "--on-hang", "kill",
       "--kill-grace", "10", "--report-dir", reports},
      {ddprun::testing::python_tools_path_env()}, std::chrono::seconds(120));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  std::ifstream in(reports + "/hang_report.json");
  REQUIRE(in);
  const json report = json::parse(in);
  // Whichever rank's silence was seen first, the stacks blame rank 1: it is
  // outside any collective while rank 0 waits in all_reduce for it.
  CHECK(report["culprit_rank"] == 1);
  CHECK(report["in_collective_ranks"] == json::array({0}));
  // Each rank's Python stack (HangReport's shape: one entry per method).
  std::map<int, std::string> python;
  for (const auto& s : report["stacks"])
    if (s["method"] == "py-spy") python[s["rank"].get<int>()] = s["text"];
  REQUIRE(python.size() == 2);
  CHECK(python[1].find("hang_in_python (") != std::string::npos);
  CHECK(python[1].find("torchrun_collective_hang.py:13)") != std::string::npos);
  CHECK(python[0].find("all_reduce (") != std::string::npos);
  CHECK(python[0].find("distributed_c10d.py:") != std::string::npos);
  CHECK(r.out.find("--- Python, every thread (py-spy) ---") != std::string::npos);
  const auto end = torchrun.finish(std::chrono::seconds(60));
  CHECK(!end.timed_out);
}

TEST_CASE("attach: a log file that stops growing is a hang; --on-hang command runs with the "
          "report") {
  TempDir dir;
  const std::string log = dir.file("train.log");
  std::ofstream(log) << "step 0\n";
  // A process that keeps using CPU, so only the file can tell.
  DdprunProcess busy({"-c", "while True: pass"}, {}, kPython);
  const auto r = ddprun::testing::run_ddprun(
      {"attach", std::to_string(busy.pid()), "--silence-timeout", "1", "--watch-file", log,
       "--on-hang", "command", "--hang-command", "echo hook rank=$DDPRUN_HANG_RANK report=$DDPRUN_HANG_REPORT",
       "--report-dir", dir.path(), "--once", "--stack-capture", "none"},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.out.find(log + " has not changed") != std::string::npos);
  CHECK(r.out.find("hook rank=-1 report=" + dir.path() + "/hang_report.json") != std::string::npos);
  CHECK(!dead(busy.pid()));  // command, not kill
  busy.send(SIGKILL);
  busy.finish(std::chrono::seconds(30));
}

TEST_CASE("attach: a pid that does not exist is a usage error naming it") {
  const auto r = ddprun::testing::run_ddprun({"attach", "999999999"}, {}, std::chrono::seconds(30));
  CHECK(r.status == 2);
  CHECK(r.err.find("no process 999999999") != std::string::npos);
}

TEST_CASE("attach: a rank whose heartbeats stop while it burns CPU is hung") {
  TempDir dir;
  const std::string sock = dir.file("hb.sock"), stop = dir.file("stop");
  DdprunProcess worker({std::string(INTROSPECT_SCRIPTS) + "/beat_then_spin.py", stop},
                       {"RANK=3", "DDPRUN_HEARTBEAT_SOCKET=" + sock,
                        "PYTHONPATH=" + std::string(WATCHDOG_PYTHON_DIR)},
                       kPython);
  DdprunProcess attach({"attach", std::to_string(worker.pid()), "--heartbeat-socket", sock,
                        "--heartbeat-timeout", "1", "--silence-timeout", "600", "--once",
                        "--stack-capture", "none"});
  // A beat has reached the bound socket: from now on rank 3 is judged by its beats.
  REQUIRE(worker.wait_for_stdout([](const std::string& o) { return o.find("heard") != std::string::npos; },
                                 std::chrono::seconds(60)));
  std::ofstream(stop).put('\n');
  const auto r = attach.finish(std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.out.find("rank 3") != std::string::npos);
  CHECK(r.out.find("no heartbeat for") != std::string::npos);
  worker.send(SIGKILL);
  worker.finish(std::chrono::seconds(30));
}

TEST_CASE("attach: a hang_report.json planted as a symlink is replaced, never written through") {
  TempDir dir;
  const std::string reports = dir.file("report"), victim = dir.file("victim");
  ::mkdir(reports.c_str(), 0700);
  std::ofstream(victim) << "keep\n";
  REQUIRE(::symlink(victim.c_str(), (reports + "/hang_report.json").c_str()) == 0);
  DdprunProcess sleeper({"600"}, {}, "/bin/sleep");
  const auto r = ddprun::testing::run_ddprun(
      {"attach", std::to_string(sleeper.pid()), "--silence-timeout", "1", "--once",
       "--stack-capture", "none", "--report-dir", reports},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  std::ifstream kept(victim);
  std::string line;
  std::getline(kept, line);
  CHECK(line == "keep");
  struct stat st{};
  REQUIRE(::lstat((reports + "/hang_report.json").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  std::ifstream in(reports + "/hang_report.json");
  CHECK(json::parse(in)["source"] == "attach");
  sleeper.send(SIGKILL);
  sleeper.finish(std::chrono::seconds(30));
}

// Its own ctest entry (introspect.attach_planted_dir): it needs root to
// plant a symlink owned by another user, and exits 77 (skipped) without.
TEST_CASE("planted report dir: attach refuses a --report-dir symlink another user planted in a "
          "shared folder, before watching: one line, exit 2") {
  if (::geteuid() != 0) {
    MESSAGE("SKIP: needs root to chown a symlink to nobody");
    std::exit(77);
  }
  TempDir dir;
  const std::string shared = dir.file("tmp"), real = dir.file("real");
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);  // like /tmp
  REQUIRE(::mkdir(real.c_str(), 0755) == 0);
  REQUIRE(::symlink(real.c_str(), (shared + "/reports").c_str()) == 0);
  REQUIRE(::lchown((shared + "/reports").c_str(), 65534, 65534) == 0);  // nobody's
  DdprunProcess sleeper({"600"}, {}, "/bin/sleep");
  const auto r = ddprun::testing::run_ddprun(
      {"attach", std::to_string(sleeper.pid()), "--silence-timeout", "1", "--once",
       "--stack-capture", "none", "--report-dir", shared + "/reports"},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 2);
  CHECK(r.out.find("HANG") == std::string::npos);  // refused before watching
  CHECK(r.err.rfind("ddprun attach: --report-dir: ", 0) == 0);
  CHECK(r.err.find("symlink owned by uid 65534") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  struct stat st{};
  CHECK(::stat((real + "/hang_report.json").c_str(), &st) != 0);  // nothing written through it
  sleeper.send(SIGKILL);
  sleeper.finish(std::chrono::seconds(30));
}

TEST_CASE("attach: a missed beat blames the rank the agent's watchdog blames for the same job: "
          "the one behind in steps, not the first past its deadline") {
  const std::string script = std::string(INTROSPECT_SCRIPTS) + "/laggard_ranks.py";
  // Under the agent (/usr/bin/python3 workers, no torch): every rank beats.
  TempDir agent_dir;
  const std::string logs = agent_dir.file("logs");
  ::mkdir(agent_dir.file("handover").c_str(), 0700);
  const auto job = ddprun::testing::run_ddprun(
      {"--rdzv-id=laggard", "--log-dir=" + logs, "--nproc-per-node=2", "--max-restarts=0",
       "--heartbeat-timeout=1", kPython, script, agent_dir.file("handover")},
      {}, std::chrono::seconds(60));
  INFO("ddprun stderr: " << job.err);
  CHECK(job.status == 124);  // a freeze ended the job
  std::ifstream agent_in(ddprun::testing::run_folder(logs, "laggard") + "/attempt_0/hang_report.json");
  REQUIRE(agent_in);
  const json agent = json::parse(agent_in);

  // The same two ranks under a plain shell, watched by attach.
  TempDir dir;
  const std::string sock = dir.file("hb.sock"), handover = dir.file("handover");
  ::mkdir(handover.c_str(), 0700);
  const std::string rank = std::string(kPython) + " " + script + " " + handover;
  DdprunProcess shell({"-c", "RANK=0 " + rank + " & RANK=1 " + rank + " & wait"},
                      {"DDPRUN_HEARTBEAT_SOCKET=" + sock, "PYTHONPATH=" + std::string(WATCHDOG_PYTHON_DIR)},
                      "/bin/sh", /*own_group=*/true);
  struct GroupKiller {
    pid_t pgid;
    ~GroupKiller() { ::kill(-pgid, SIGKILL); }
  } kill_group{shell.pid()};
  const std::string reports = dir.file("report");
  ::mkdir(reports.c_str(), 0700);
  const auto r = ddprun::testing::run_ddprun(
      {"attach", std::to_string(shell.pid()), "--heartbeat-socket", sock, "--heartbeat-timeout",
       "1", "--silence-timeout", "600", "--once", "--stack-capture", "none", "--report-dir",
       reports},
      {}, std::chrono::seconds(90));
  INFO("attach stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  std::ifstream in(reports + "/hang_report.json");
  REQUIRE(in);
  const json report = json::parse(in);
  for (const json* j : {&agent, &report}) {
    CHECK((*j)["kind"] == "heartbeat_timeout");
    CHECK((*j)["rank"] == 0);          // first past its deadline
    CHECK((*j)["culprit_rank"] == 1);  // behind in steps: stopped first
  }
  CHECK(report["suspect_ranks"] == agent["suspect_ranks"]);
  CHECK(r.out.find("culprit: rank 1 (behind its peers in steps") != std::string::npos);
}
