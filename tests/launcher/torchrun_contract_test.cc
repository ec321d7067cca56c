// torchrun's contract where ddprun used to differ (issue 21): Python files
// without the suffix or the execute bit run with python, argparse-style flag
// prefixes, an empty --nproc-per-node refused. Real ddprun processes with
// Debian's /usr/bin/python3 (no torch needed) as the workers' interpreter.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "launcher/cli.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

using ddprun::launcher::parse_command_line;
using ddprun::launcher::UsageError;
using namespace ddprun::testing;

namespace {

std::string usage_error(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  try {
    parse_command_line(static_cast<int>(argv.size()), argv.data());
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

const char* kScript = "import sys\nprint('python ran', sys.argv[1:])\n";
const std::vector<std::string> kEnv = {"DDPRUN_PYTHON=/usr/bin/python3"};

}  // namespace

TEST_CASE("a Python file without .py or without the execute bit runs with python, as torchrun") {
  TempDir dir;
  // Not executable: exec said "Permission denied" (126).
  write_file(dir.file("plain"), kScript, 0644);
  // Executable but no "#!": exec said "Exec format error" (126).
  write_file(dir.file("noshebang"), kScript, 0755);
  for (const char* name : {"plain", "noshebang"}) {
    auto r = run_ddprun({"--nproc-per-node=2", dir.file(name), "a"}, kEnv);
    INFO(name, " ", r.err);
    CHECK(r.status == 0);
    CHECK(count_of(r.out, "python ran ['a']") == 2);
  }
  // A bare name in the current folder that PATH does not have: torchrun's
  // `python -u name` finds it there; exec said "not found in PATH" (127).
  char old_cwd[4096];
  REQUIRE(::getcwd(old_cwd, sizeof old_cwd) != nullptr);
  REQUIRE(::chdir(dir.path().c_str()) == 0);
  auto r = run_ddprun({"plain", "b"}, kEnv);
  REQUIRE(::chdir(old_cwd) == 0);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == "[default0]:python ran ['b']\n");
}

TEST_CASE("programs exec can run still run directly; --no-python keeps exec's verdict") {
  TempDir dir;
  write_file(dir.file("job"), "#!/bin/sh\necho shell ran \"$@\"\n", 0755);
  auto r = run_ddprun({dir.file("job"), "x"}, kEnv);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == "[default0]:shell ran x\n");
  write_file(dir.file("plain"), kScript, 0644);
  r = run_ddprun({"--no-python", dir.file("plain")}, kEnv);
  CHECK(r.status == 126);
  CHECK(count_of(r.err, "cannot execute") >= 1);
}

TEST_CASE("unambiguous flag prefixes are the flag, as with argparse; ambiguous ones exit 2") {
  auto r = run_ddprun({"--nproc-per-nod=2", "--max-r=1", "--no-py", "/bin/echo", "--max-r=9"});
  INFO(r.err);
  CHECK(r.status == 0);
  // The program's own arguments are not expanded.
  CHECK(count_of(r.out, "]:--max-r=9\n") == 2);
  // Both spellings of one flag are one match.
  r = run_ddprun({"--nproc", "2", "--no-python", "/bin/true"});
  CHECK(r.status == 0);
  r = run_ddprun({"--max", "1", "--no-python", "/bin/true"});
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "ddprun: --max: ambiguous flag, could be --max-restarts, "
                 "--max-no-progress-restarts (see ddprun --help)\n");
  CHECK(usage_error({"--rdzv-e=h:1", "--rdzv", "x"}) ==
        "--rdzv: ambiguous flag, could be --rdzv-backend, --rdzv-endpoint, --rdzv-id, --rdzv-conf");
  CHECK(usage_error({"--bogus", "x"}) == "unknown flag --bogus");
}

TEST_CASE("an empty --nproc-per-node= is refused naming the flag (exit 2), as torchrun") {
  for (std::vector<std::string> args : {std::vector<std::string>{"--nproc-per-node=", "/bin/true"},
                                        {"--nproc_per_node", "", "/bin/true"}}) {
    auto r = run_ddprun(args);
    CHECK(r.status == 2);
    CHECK(count_of(r.err, "\n") == 1);
    CHECK(r.err.rfind("ddprun: --nproc-per-node is empty", 0) == 0);
  }
}

TEST_CASE("--rdzv-conf takes torch 2.x's c10d keys (store_type=tcp ...); others exit 2 naming the key") {
  // The keys torch 2.x's c10d rendezvous reads (c10d_rendezvous_backend.py,
  // dynamic_rendezvous.py), on a real --standalone c10d job of 2 workers.
  auto r = run_ddprun({"--standalone", "--nproc-per-node=2",
                       "--rdzv-conf=store_type=tcp,is_host=true,read_timeout=60,join_timeout=60,"
                       "last_call_timeout=1,close_timeout=30,heartbeat_timeout=5,"
                       "keep_alive_interval=5,keep_alive_max_attempt=3,cas_backoff_max_seconds=0.5",
                       "--no-python", "/bin/echo", "joined"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(count_of(r.out, "]:joined\n") == 2);
  for (auto [conf, says] :
       {std::pair{"store_type=file", "--rdzv-conf store_type=file: ddprun's rendezvous runs over"},
        std::pair{"store_type=etcd", "--rdzv-conf store_type=etcd: expected tcp"},
        std::pair{"heartbeat_timeout=0", "--rdzv-conf heartbeat_timeout=0: expected seconds"},
        std::pair{"cas_backoff_max_seconds=-1", "--rdzv-conf cas_backoff_max_seconds=-1"},
        std::pair{"store_typ=tcp", "--rdzv-conf: unknown key 'store_typ' (known: "}}) {
    r = run_ddprun({"--standalone", std::string("--rdzv-conf=") + conf, "/bin/true"});
    INFO(conf, " ", r.err);
    CHECK(r.status == 2);
    CHECK(count_of(r.err, "\n") == 1);
    CHECK(r.err.rfind(std::string("ddprun: ") + says, 0) == 0);
  }
}
