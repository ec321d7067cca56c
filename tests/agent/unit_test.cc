// The agent's pure pieces: error files, signal names, env,
// the cgroup v2 mount and path parsers.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "agent/error_file.h"
#include "agent/exit_status.h"
#include "agent/job_cgroup.h"
#include "agent/line_splitter.h"
#include "agent/stdin_hint.h"
#include "agent/worker_env.h"

using namespace ddprun::agent;

TEST_CASE("prefix templates expand every placeholder") {
  CHECK(make_line_prefix("", "default", 5, 1, "h") == "[default1]:");
  CHECK(make_line_prefix("${host}:${role_name}${rank}/${local_rank}${x}", "r", 5, 1, "h") ==
        "h:r5/1${x}");
}

TEST_CASE("signal names and exit statuses") {
  CHECK(signal_name(SIGKILL) == "SIGKILL");
  CHECK(parse_signal("TERM") == SIGTERM);
  CHECK(parse_signal("SIGhup") == SIGHUP);
  CHECK(parse_signal("2") == SIGINT);
  CHECK(parse_signal("SIGNOPE") == 0);
  CHECK(ExitStatus::killed(SIGSEGV).describe() == "signal SIGSEGV");
  CHECK(ExitStatus::killed(SIGSEGV).shell_code() == 139);
  CHECK(ExitStatus::exited(3).shell_code() == 3);
}

TEST_CASE("error files: torch's @record shape, the plain shape, and garbage") {
  char path[] = "/tmp/ddprun_err_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(R"({"message": {"message": "boom", "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}})");
  auto r = read_error_file(path);
  REQUIRE(r);
  CHECK(r->message == "boom");
  CHECK(r->traceback == "tb");
  write(R"({"message": "plain"})");
  CHECK(read_error_file(path)->message == "plain");
  write("not json");
  CHECK(read_error_file(path)->message.find("unreadable error file") == 0);
  write("");
  CHECK_FALSE(read_error_file(path));
  std::remove(path);
  CHECK_FALSE(read_error_file(path));
}

TEST_CASE("worker env keeps user values for the when-unset variables") {
  EnvMap env = env_from_strings({"PATH=/bin", "NCCL_ASYNC_ERROR_HANDLING=0", "PYTHONPATH=/a",
                                 "junk"});
  WorkerEnvInput in;
  in.local_world_size = 2;
  in.pythonpath_prepend = {"/wd"};
  add_worker_env(in, env);
  CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "0");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(env["OMP_NUM_THREADS"] == "1");
  CHECK(env["PYTHONPATH"] == "/wd:/a");
  CHECK(env.count("junk") == 0);
  CHECK(env.count("DDPRUN_STORE_ADDR") == 0);
}

TEST_CASE("the cgroup2 mount and our path are read, not assumed") {
  using ddprun::agent::find_cgroup2_mount;
  using ddprun::agent::unified_cgroup_path;
  auto hybrid = find_cgroup2_mount(
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n");
  REQUIRE(hybrid);
  CHECK(hybrid->mount_point == "/sys/fs/cgroup/unified");
  CHECK(hybrid->root == "/");
  auto spaced = find_cgroup2_mount("7 1 0:9 /kube/pod\\0401 /mnt/my\\040cg rw - cgroup2 none rw\n");
  REQUIRE(spaced);
  CHECK(spaced->mount_point == "/mnt/my cg");
  CHECK(spaced->root == "/kube/pod 1");
  CHECK_FALSE(find_cgroup2_mount("31 23 0:28 / /sys/fs/cgroup rw - cgroup cgroup rw,cpu\n"));
  CHECK(unified_cgroup_path("4:memory:/a\n0::/user.slice/x.scope\n") == "/user.slice/x.scope");
  CHECK_FALSE(unified_cgroup_path("4:memory:/a\n"));
}

TEST_CASE("the cgroup2 mount found without mountinfo is the one mountinfo names") {
  std::ifstream in("/proc/self/mountinfo");
  const std::string mountinfo((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto named = ddprun::agent::find_cgroup2_mount(mountinfo);
  auto usual = ddprun::agent::usual_cgroup2_mount();
  if (usual) {
    REQUIRE(named);
    CHECK(usual->mount_point == named->mount_point);
    CHECK(usual->root == named->root);
  }
  // Where its conditions hold, the short way is taken (this CI machine's
  // layout: initial namespace, /sys/fs/cgroup/unified showing the root).
  char ns[64] = {};
  const bool initial_ns = readlink("/proc/self/ns/cgroup", ns, sizeof ns - 1) > 0 &&
                          std::string(ns) == "cgroup:[4026531835]";
  if (initial_ns && named && named->root == "/" &&
      (named->mount_point == "/sys/fs/cgroup" || named->mount_point == "/sys/fs/cgroup/unified"))
    CHECK(usual);
}

TEST_CASE("StdinHint sees input()'s EOFError and pdb's BdbQuit, split anywhere, once") {
  ddprun::agent::StdinHint h;
  CHECK_FALSE(h.feed("Traceback ...\nEOFError: EOF when"));
  CHECK(h.feed(" reading a line\n"));
  CHECK_FALSE(h.feed("bdb.BdbQuit\n"));  // told once
  ddprun::agent::StdinHint p;
  CHECK_FALSE(p.feed("    raise BdbQuit\nbdb.Bdb"));
  CHECK(p.feed("Quit\n"));
  ddprun::agent::StdinHint none;
  CHECK_FALSE(none.feed("EOFError: something else\n"));
}
