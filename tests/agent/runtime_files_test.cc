// Runtime files and log folders: each agent's sockets and FIFOs in a
// private folder (never the shared log folder), removed at exit or, after a
// kill -9, by the next ddprun; each run's logs in a folder of their own, so
// concurrent or repeated runs with one --log-dir and --rdzv-id keep all.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "agent/runtime_dir.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/env_file.h"
#include "tests/common/run_folder.h"
#include "tests/common/slurp.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> agent_dirs(const std::string& base) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec))
    if (e.path().filename().string().rfind("ddprun-agent.", 0) == 0) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("two jobs at once with the same --log-dir and --rdzv-id both succeed and keep their logs") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  const std::string go = dir.path() + "/go";
  auto job = [&](const std::string& name) {
    return std::make_unique<DdprunProcess>(std::vector<std::string>{
        "--nproc-per-node=2", "--rdzv-id=same", "--log-dir", logs, "--heartbeat-timeout=30",
        TEST_WORKER, "wait-file", go + "." + name});
  };
  auto a = job("a");
  auto b = job("b");
  auto both_waiting = [](const std::string& o) { return count_of(o, ":waiting rank=") == 2; };
  // Both jobs' workers are running at the same time before either may end.
  REQUIRE(a->wait_for_stdout(both_waiting, Seconds(30)));
  REQUIRE(b->wait_for_stdout(both_waiting, Seconds(30)));
  std::ofstream(go + ".a") << "go\n";
  std::ofstream(go + ".b") << "go\n";
  auto ra = a->finish(Seconds(60));
  auto rb = b->finish(Seconds(60));
  CAPTURE(ra.err);
  CAPTURE(rb.err);
  CHECK(ra.status == 0);
  CHECK(rb.status == 0);
  auto runs = run_folders(logs, "same");
  REQUIRE(runs.size() == 2);
  for (const auto& run : runs) {
    CAPTURE(run);
    for (int lr = 0; lr < 2; ++lr) {
      std::string d = run + "/attempt_0/" + std::to_string(lr);
      CHECK(count_of(slurp(d + "/stdout.log"), "waiting rank=" + std::to_string(lr)) == 1);
    }
    // One job's event log each, not two jobs mixed in one.
    CHECK(count_of(slurp(run + "/events.jsonl"), "\"event\":\"start\"") == 1);
  }
  // Each job's heartbeat socket in its own agent's private folder.
  auto ea = read_env(go + ".a.env.0"), eb = read_env(go + ".b.env.0");
  CHECK(ea["DDPRUN_HEARTBEAT_SOCKET"] != eb["DDPRUN_HEARTBEAT_SOCKET"]);
  for (auto* e : {&ea, &eb}) {
    const std::string sock = (*e)["DDPRUN_HEARTBEAT_SOCKET"];
    CHECK(sock.find("/ddprun-agent.") != std::string::npos);
    CHECK(sock.rfind(logs, 0) != 0);
    // Private: the folder is the agent's alone, and gone after the job.
    CHECK_FALSE(fs::exists(fs::path(sock).parent_path()));
  }
}

TEST_CASE("a second run with the same --rdzv-id and --log-dir keeps the first run's logs") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  for (int i = 0; i < 2; ++i) {
    auto r = run_ddprun({"--rdzv-id=again", "--log-dir", logs, TEST_WORKER, "limits"});
    REQUIRE(r.status == 0);
  }
  auto runs = run_folders(logs, "again");
  REQUIRE(runs.size() == 2);
  for (const auto& run : runs)
    CHECK(count_of(slurp(run + "/attempt_0/0/stdout.log"), "nofile=") == 1);
}

TEST_CASE("the private folder lives under XDG_RUNTIME_DIR, is 0700 and goes at exit") {
  TempDir dir;
  const std::string go = dir.path() + "/go";
  DdprunProcess p({"--heartbeat-timeout=30", TEST_WORKER, "wait-file", go},
                  {"XDG_RUNTIME_DIR=" + dir.path()});
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return o.find("waiting") != o.npos; },
                            Seconds(30)));
  auto dirs = agent_dirs(dir.path());
  REQUIRE(dirs.size() == 1);
  struct stat st;
  REQUIRE(stat(dirs[0].c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(read_env(go + ".env.0")["DDPRUN_HEARTBEAT_SOCKET"] == dirs[0] + "/heartbeat.sock");
  std::ofstream(go) << "go\n";
  auto r = p.finish(Seconds(60));
  CHECK(r.status == 0);
  CHECK(agent_dirs(dir.path()).empty());
}

TEST_CASE("a private folder left by kill -9 is removed by the next ddprun, a live one is not") {
  TempDir dir;
  const std::vector<std::string> env = {"XDG_RUNTIME_DIR=" + dir.path()};
  auto ready = [](const std::string& o) { return o.find("ready") != o.npos; };
  std::string stale;
  {
    DdprunProcess killed({TEST_WORKER, "block"}, env);
    REQUIRE(killed.wait_for_stdout(ready, Seconds(30)));
    REQUIRE(agent_dirs(dir.path()).size() == 1);
    stale = agent_dirs(dir.path())[0];
    killed.send(SIGKILL);
    REQUIRE_FALSE(killed.finish(Seconds(30)).timed_out);
  }
  CHECK(fs::exists(stale));  // kill -9: nobody removed it
  DdprunProcess live({TEST_WORKER, "block"}, env);
  REQUIRE(live.wait_for_stdout(ready, Seconds(30)));
  auto r = run_ddprun({TEST_WORKER, "limits"}, env);
  CHECK(r.status == 0);
  CHECK_FALSE(fs::exists(stale));  // its agent was dead: removed
  CHECK(agent_dirs(dir.path()).size() == 1);  // the live agent's stays
  live.send(SIGTERM);
  CHECK(live.finish(Seconds(30)).status == 128 + SIGTERM);
  CHECK(agent_dirs(dir.path()).empty());
}

TEST_CASE("a sweep of stale folders is skipped when one began after this agent's folder was made") {
  TempDir dir;
  const std::string stale = dir.path() + "/ddprun-agent.0123456789ab";
  fs::create_directory(stale);
  std::ofstream(stale + "/lock") << "";  // nobody holds it: its agent is gone
  const std::string mark = dir.path() + "/.ddprun-sweep." + std::to_string(geteuid());
  std::ofstream(mark) << "";
  const timespec began[2] = {{2000, 0}, {2000, 0}};  // a sweep began at t=2000 s
  REQUIRE(utimensat(AT_FDCWD, mark.c_str(), began, 0) == 0);

  // This agent's folder was made before that sweep began: that sweep saw
  // whatever this one would remove.
  CHECK(ddprun::agent::remove_stale_runtime_dirs(dir.path(), timespec{1000, 0}) == 0);
  CHECK(fs::exists(stale));
  // Made after it: this agent sweeps, and marks its sweep's start.
  CHECK(ddprun::agent::remove_stale_runtime_dirs(dir.path(), timespec{3000, 0}) == 1);
  CHECK_FALSE(fs::exists(stale));
  struct stat st;
  REQUIRE(stat(mark.c_str(), &st) == 0);
  CHECK(st.st_mtim.tv_sec > 3000);
  // Without its own folder's time an agent always sweeps.
  fs::create_directory(stale);
  std::ofstream(stale + "/lock") << "";
  CHECK(ddprun::agent::remove_stale_runtime_dirs(dir.path()) == 1);
  CHECK_FALSE(fs::exists(stale));
}

TEST_CASE("a FIFO planted under the sweep's mark does not block the sweep") {
  TempDir dir;
  const std::string mark = dir.path() + "/.ddprun-sweep." + std::to_string(geteuid());
  REQUIRE(mkfifo(mark.c_str(), 0666) == 0);
  // In a child: an open that blocked would hold this test, not end it.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(ddprun::agent::remove_stale_runtime_dirs(dir.path(), timespec{3000, 0}));
  const bool ended = wait_dead(pid, Seconds(20));
  if (!ended) kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(ended);
}

TEST_CASE("TMPDIR=/nonexistent falls back to /dev/shm when it is a tmpfs, else to /tmp") {
  TempDir dir;
  auto r = run_ddprun({"--nproc-per-node=2", TEST_WORKER, "env", dir.path() + "/env"},
                      {"TMPDIR=/nonexistent", "XDG_RUNTIME_DIR="});
  CAPTURE(r.err);
  CHECK(r.status == 0);
  struct statfs st;
  const bool shm = ::statfs("/dev/shm", &st) == 0 && st.f_type == TMPFS_MAGIC;
  const std::string base = shm ? "/dev/shm" : "/tmp";
  auto env = read_env(dir.path() + "/env.0");
  CHECK(env["TORCHELASTIC_ERROR_FILE"].rfind(base + "/ddprun-agent.", 0) == 0);
  // Removed at exit there too.
  const std::string folder = env["TORCHELASTIC_ERROR_FILE"].substr(0, base.size() + 26);
  CHECK(folder.rfind(base + "/ddprun-agent.", 0) == 0);
  CHECK_FALSE(fs::exists(folder));
}

TEST_CASE("a job whose program cannot be executed still has its event log's start line") {
  // The event log is made once the workers run (issue 24), or when the
  // attempt ends without them, as here.
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  const std::string script = dir.path() + "/bad_interpreter.sh";
  std::ofstream(script) << "#!" << dir.path() << "/no-such-interpreter\n";
  REQUIRE(chmod(script.c_str(), 0755) == 0);
  auto r = run_ddprun({"--rdzv-id=noexec", "--log-dir", logs, script});
  CAPTURE(r.err);
  CHECK(r.status == 127);
  auto runs = run_folders(logs, "noexec");
  REQUIRE(runs.size() == 1);
  const std::string events = slurp(runs[0] + "/events.jsonl");
  CHECK(count_of(events, "\"event\":\"start\"") == 1);
  CHECK(events.rfind("{", 0) == 0);
  CHECK(events.find("\"event\":\"start\"") < events.find('\n'));  // the first line
}
