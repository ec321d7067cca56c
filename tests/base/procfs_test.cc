// base/procfs.h on real processes: children, grandchildren and a thread's
// child read back, an exec'd child's environment, command line and status,
// a process that exits between the listing and the read, a pid that never
// existed, a child blocked in read() (by this architecture's syscall
// number), and the folder listers on a real folder.
#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "base/procfs.h"
#include "base/system_error.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::base;

namespace {

bool has(const std::vector<pid_t>& v, pid_t p) { return std::find(v.begin(), v.end(), p) != v.end(); }

// One pipe; the children of a test block reading `read` until the test
// closes `write` (EOF), so they end when the test lets them.
struct Pipe {
  int read = -1, write = -1;
  explicit Pipe(int flags = 0) { REQUIRE(::pipe2(&read, flags) == 0); }
  ~Pipe() {
    close_read();
    close_write();
  }
  void close_read() {
    if (read >= 0) ::close(read);
    read = -1;
  }
  void close_write() {
    if (write >= 0) ::close(write);
    write = -1;
  }
};

// Reads until EOF, within 30 s; what it read (the caller's pids, in text).
std::string read_to_eof(int fd) {
  std::string out;
  char buf[64];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 30000) == 1);
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n >= 0);
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// A forked child that blocks on `hold` and then exits; with `grandchild`
// it first forks one that does the same and reaps it before exiting. Each
// writes its pid to `report` and closes it.
pid_t fork_holder(Pipe& hold, Pipe& report, bool grandchild) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid > 0) return pid;
  ::close(hold.write);
  pid_t inner = -1;
  if (grandchild && (inner = ::fork()) == 0) grandchild = false;  // the grandchild: no further fork
  char line[32];
  const int n = std::snprintf(line, sizeof line, "%d\n", static_cast<int>(::getpid()));
  if (::write(report.write, line, static_cast<size_t>(n)) != n) ::_exit(3);
  ::close(report.write);
  char c;
  while (::read(hold.read, &c, 1) > 0) {
  }
  if (inner > 0) ::waitpid(inner, nullptr, 0);
  ::_exit(0);
}

void reap(pid_t pid) { REQUIRE(::waitpid(pid, nullptr, 0) == pid); }

}  // namespace

TEST_CASE("procfs: a child and its grandchild, as children, a tree, ancestry and in the scan") {
  Pipe hold, report;
  const pid_t child = fork_holder(hold, report, true);
  report.close_write();
  const std::string pids = read_to_eof(report.read);  // both wrote, in either order
  pid_t a = 0, b = 0;
  REQUIRE(std::sscanf(pids.c_str(), "%d %d", &a, &b) == 2);
  const pid_t grandchild = a == child ? b : a;
  REQUIRE((a == child || b == child));

  CHECK(has(child_pids(::getpid()), child));
  CHECK(child_pids(child) == std::vector<pid_t>{grandchild});
  CHECK(process_tree(child) == std::vector<pid_t>{child, grandchild});
  const auto mine = process_tree(::getpid());
  REQUIRE(mine.size() >= 3);
  CHECK(mine.front() == ::getpid());
  CHECK(std::find(mine.begin(), mine.end(), child) < std::find(mine.begin(), mine.end(), grandchild));
  const auto up = ancestry(grandchild);
  REQUIRE(up.size() >= 3);
  CHECK(std::vector<pid_t>(up.begin(), up.begin() + 3) == std::vector<pid_t>{grandchild, child, ::getpid()});

  const auto listed = all_pids();
  CHECK(std::is_sorted(listed.begin(), listed.end()));
  CHECK(has(listed, ::getpid()));
  CHECK(has(listed, grandchild));
  const auto scan = scan_processes();
  const auto in_scan = std::find_if(scan.begin(), scan.end(), [&](const ProcStat& s) { return s.pid == grandchild; });
  REQUIRE(in_scan != scan.end());
  CHECK(in_scan->ppid == child);

  hold.close_write();
  reap(child);
  CHECK_FALSE(has(child_pids(::getpid()), child));
}

TEST_CASE("procfs: a child blocked in read() on a pipe is seen reading that fd and no other") {
  Pipe hold, report;
  const pid_t child = fork_holder(hold, report, false);
  report.close_write();
  read_to_eof(report.read);  // it wrote its pid: next it reads `hold`
  // The child gets to its read() in its own time: poll, within 30 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool reading = false;
  while (!(reading = blocked_in_read(child, hold.read)) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(reading);
  CHECK_FALSE(blocked_in_read(child, hold.read + 1));
  CHECK_FALSE(blocked_in_read(child, STDIN_FILENO));
  hold.close_write();
  reap(child);
  CHECK_FALSE(blocked_in_read(child, hold.read));  // gone: no file to read
}

TEST_CASE("procfs: a thread's id, and the child a thread forked, listed as the process's child") {
  Pipe hold, report;
  std::promise<pid_t> tid;
  std::promise<void> finish;
  pid_t child = -1;
  std::thread t([&] {
    child = fork_holder(hold, report, false);
    tid.set_value(static_cast<pid_t>(::syscall(SYS_gettid)));  // after the fork: `child` is set
    finish.get_future().wait();
  });
  const pid_t thread = tid.get_future().get();
  report.close_write();
  read_to_eof(report.read);  // the child is there: it wrote its pid
  CHECK(has(thread_ids(::getpid()), thread));
  CHECK(has(thread_ids(::getpid()), ::getpid()));  // the main thread's id is the pid
  CHECK(has(child_pids(::getpid()), child));       // listed in the forking thread's children
  // (Not checked after the join: the kernel clears the thread's id for
  // pthread_join before it leaves /proc and re-parents its children.)
  finish.set_value();
  t.join();
  hold.close_write();
  reap(child);
}

TEST_CASE("procfs: an exec'd child's environment, command line and status fields") {
  Pipe hold, exec_sync(O_CLOEXEC);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(hold.read, 0);
    ::close(hold.write);
    const char* argv[] = {"sh", "-c", "read x", "procfs arg", nullptr};
    const char* envp[] = {"DDPRUN_PROCFS_TEST=a=b", "EMPTY=", "PATH=/usr/bin:/bin", nullptr};
    ::execve("/bin/sh", const_cast<char**>(argv), const_cast<char**>(envp));
    ::_exit(127);
  }
  exec_sync.close_write();
  read_to_eof(exec_sync.read);  // closed by the exec (or the exit)

  CHECK(read_proc_cmdline(pid) == std::vector<std::string>{"sh", "-c", "read x", "procfs arg"});
  CHECK(read_proc_environ(pid) ==
        std::vector<std::string>{"DDPRUN_PROCFS_TEST=a=b", "EMPTY=", "PATH=/usr/bin:/bin"});
  CHECK(proc_environ_value(pid, "DDPRUN_PROCFS_TEST") == "a=b");
  CHECK(proc_environ_value(pid, "EMPTY") == "");
  CHECK_FALSE(proc_environ_value(pid, "DDPRUN_PROCFS"));  // a prefix is not a name
  CHECK_FALSE(proc_environ_value(pid, "HOME"));
  const std::string pid_text = std::to_string(pid);
  const std::string whole = "DDPRUN_PROCFS_TEST=a=b", part = "DDPRUN_PROCFS_TEST=a";
  CHECK(proc_environ_has_no_alloc(pid_text.c_str(), whole.c_str(), whole.size()));
  CHECK_FALSE(proc_environ_has_no_alloc(pid_text.c_str(), part.c_str(), part.size()));  // whole entries only
  CHECK(read_proc_status_field(pid, "Name") == "sh");
  CHECK(read_proc_status_field(pid, "PPid") == std::to_string(::getpid()));
  CHECK(read_proc_status_field(pid, "SigCgt")->size() == 16);  // a hex mask
  CHECK_FALSE(read_proc_status_field(pid, "NoSuchField"));
  CHECK(read_proc_file(pid, "comm") == "sh\n");
  char self[4096] = {};
  REQUIRE(::realpath("/bin/sh", self));
  CHECK(read_proc_exe(pid) == std::string(self));

  hold.close_write();  // EOF: `read x` fails and sh exits
  reap(pid);
}

TEST_CASE("procfs: a process listed, then gone before it is read, and a pid that never existed") {
  Pipe hold, report;
  const pid_t pid = fork_holder(hold, report, false);
  report.close_write();
  read_to_eof(report.read);
  CHECK(has(all_pids(), pid));
  REQUIRE(read_proc_stat(pid));
  hold.close_write();
  reap(pid);  // exits between the listing above and the reads below
  for (pid_t gone : {pid, pid_t{-5}, pid_t{INT_MAX}}) {
    CAPTURE(gone);
    CHECK_FALSE(read_proc_stat(gone));
    CHECK_FALSE(read_proc_environ(gone));
    CHECK_FALSE(read_proc_cmdline(gone));
    CHECK_FALSE(read_proc_exe(gone));
    CHECK_FALSE(proc_environ_value(gone, "PATH"));
    CHECK_FALSE(read_proc_status_field(gone, "Name"));
    CHECK_FALSE(read_proc_file(gone, "stat"));
    CHECK(thread_ids(gone).empty());
    CHECK(child_pids(gone).empty());
    CHECK(process_tree(gone) == std::vector<pid_t>{gone});
    CHECK(ancestry(gone).empty());
  }
  const auto scan = scan_processes();
  CHECK(std::none_of(scan.begin(), scan.end(), [&](const ProcStat& s) { return s.pid == pid; }));
  CHECK(std::any_of(scan.begin(), scan.end(), [&](const ProcStat& s) { return s.pid == ::getpid(); }));
}

TEST_CASE("parse_proc_stat reads CPU time and resident pages by field number") {
  const auto st = parse_proc_stat(
      "42 (a) b) R 7 8 9 34816 8 4194560 1 0 0 0 11 12 0 0 20 0 1 0 123456 999 77 18446744073709551615");
  REQUIRE(st);
  CHECK(st->utime == 11);
  CHECK(st->stime == 12);
  CHECK(st->start_time == 123456);
  CHECK(st->rss_pages == 77);
  const auto self = read_proc_stat(::getpid());
  REQUIRE(self);
  CHECK(self->rss_pages > 0);
}

TEST_CASE("list_dir: names and types without . and .., and a missing folder as a SystemError") {
  ddprun::testing::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  REQUIRE(::mkdir(dir.file("folder").c_str(), 0700) == 0);
  REQUIRE(::symlink("file", dir.file("link").c_str()) == 0);
  auto entries = list_dir(dir.path());
  std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].name == "file");
  CHECK(entries[1].name == "folder");
  CHECK(entries[2].name == "link");
  // d_type where the filesystem gives it (tmpfs and ext4 do).
  if (entries[0].type != DT_UNKNOWN) {
    CHECK(entries[0].type == DT_REG);
    CHECK(entries[1].type == DT_DIR);
    CHECK(entries[2].type == DT_LNK);
  }
  CHECK(list_dir(dir.file("folder")).empty());

  const std::string missing = dir.file("missing");
  int err = 0;
  CHECK_FALSE(try_list_dir(missing, &err));
  CHECK(err == ENOENT);
  try {
    list_dir(missing);
    FAIL("no error");
  } catch (const SystemError& e) {
    CHECK(e.kind() == ErrorKind::not_found);
    CHECK(std::string(e.what()) == "opendir " + missing + ": No such file or directory");
  }
  CHECK_THROWS_AS(list_dir(dir.file("file")), SystemError);  // ENOTDIR
  CHECK(list_dir_or_empty(missing).empty());
  CHECK(list_dir_or_empty(dir.path()).size() == 3);

  std::vector<std::string> raw;  // the guardian's lister: "." and ".." too
  auto each = [&](const char* name, unsigned char) { raw.emplace_back(name); };
  const int fd = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  for_each_entry_no_alloc(fd, each);
  ::close(fd);
  std::sort(raw.begin(), raw.end());
  CHECK(raw == std::vector<std::string>{".", "..", "file", "folder", "link"});
}

TEST_CASE("read_proc_file: a sizeless /proc file whole, and errno for one that is not there") {
  const auto limits = read_proc_file("/proc/self/limits");
  REQUIRE(limits);
  CHECK(limits->find("Max open files") != std::string::npos);  // past the first read's size 0
  int err = 0;
  CHECK_FALSE(read_proc_file("/proc/self/no-such-file", &err));
  CHECK(err == ENOENT);
}

TEST_CASE("installed_or finds a folder below this program's prefix only when it holds the marker") {
  // This test program is <build>/bin/base_tests: its prefix is <build>.
  const auto exe = ddprun::base::read_proc_exe(::getpid());
  REQUIRE(exe.has_value());
  const std::string prefix = exe->substr(0, exe->rfind('/', exe->rfind('/') - 1));
  ddprun::testing::TempDir unused;  // a fallback that is surely not the answer
  CHECK(ddprun::base::installed_or("bin", "base_tests", unused.path()) == prefix + "/bin");
  CHECK(ddprun::base::installed_or("bin", "no-such-marker", unused.path()) == unused.path());
  CHECK(ddprun::base::installed_or("no/such/folder", "x", "fallback") == "fallback");
}
