#include "agent/job_cgroup.h"

#include <dirent.h>  // DT_DIR
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>
#include <sstream>

#include "agent/fork_into_cgroup.h"
#include "base/procfs.h"
#include "base/safe_file.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

// The whole of a small /proc file; nullopt with `why` set when unreadable.
std::optional<std::string> read_text(const char* path, std::string* why) {
  int err = 0;
  auto text = base::read_proc_file(path, &err);
  if (!text && why) *why = base::describe_error("cannot read", path, err);
  return text;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool octal = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = s[i + k];
        if (c < '0' || c > '7') octal = false;
        v = v * 8 + (c - '0');
      }
      if (octal) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

std::string random_suffix() { return base::random_hex(3); }

void probe_child(const void* procs_fd, bool placed) {
  if (placed) _exit(0);
  // Only write and _exit: the agent runs other threads, and the child may
  // share its memory (fork_into_cgroup.h).
  ssize_t n = write(*static_cast<const int*>(procs_fd), "0", 1);
  _exit(n == 1 ? 0 : (errno > 0 && errno < 126 ? errno : EIO));
}

// Moves a throwaway child into the cgroup: the one sure test that this
// process may place its workers there (permissions, delegation, a threaded
// or domain-invalid cgroup). Returns 0 or the child's errno. Tries the way
// the workers will be placed first (created in the cgroup, when `dir_fd` is
// given); a child killed at birth there (the kernel's kill-sequence check,
// job_cgroup.h) clears `*in_place` and the probe moves a child in instead.
int probe_join(int dir_fd, int procs_fd, bool* in_place) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  bool placed = false;
  pid_t pid = start_in_cgroup(*in_place ? dir_fd : -1, probe_child, &procs_fd, &placed);
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) return fork_errno;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *in_place = placed && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (placed && !*in_place) return probe_join(dir_fd, procs_fd, in_place);
  return WIFEXITED(status) ? WEXITSTATUS(status) : EIO;
}

// rmdir of every empty child cgroup of `path` (a job's attempt.<n>).
void remove_child_cgroups(const std::string& path) {
  for (const auto& e : base::list_dir_or_empty(path))
    if (e.type == DT_DIR && e.name[0] != '.') (void)rmdir((path + "/" + e.name).c_str());
}

// Removes empty job.<pid>.* cgroups whose agent is gone (one that died
// before its guardian started). rmdir fails on a populated cgroup, and a
// live agent's pid exists, so neither is touched.
void remove_stale_cgroups(const std::string& parent) {
  for (const auto& e : base::list_dir_or_empty(parent)) {
    if (e.name.rfind("job.", 0) != 0) continue;
    pid_t pid = static_cast<pid_t>(atoi(e.name.c_str() + 4));
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) continue;
    remove_child_cgroups(parent + "/" + e.name);
    (void)rmdir((parent + "/" + e.name).c_str());
  }
}

}  // namespace

std::optional<Cgroup2Mount> find_cgroup2_mount(std::string_view mountinfo) {
  std::istringstream in{std::string(mountinfo)};
  for (std::string line; std::getline(in, line);) {
    // "36 25 0:30 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw"
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, dev, root, point;
    if (!(head >> id >> parent >> dev >> root >> point)) continue;
    return Cgroup2Mount{unescape(point), unescape(root)};
  }
  return std::nullopt;
}

std::optional<Cgroup2Mount> usual_cgroup2_mount() {
  // The initial cgroup namespace's inode (PROC_CGROUP_INIT_INO, a fixed
  // number in the kernel's ABI): a namespace of our own would show paths
  // from its own root, which a mount need not show.
  char ns[64];
  ssize_t n = readlink("/proc/self/ns/cgroup", ns, sizeof ns - 1);
  if (n <= 0) return std::nullopt;
  ns[n] = '\0';
  if (std::strcmp(ns, "cgroup:[4026531835]") != 0) return std::nullopt;
  for (const char* place : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    struct statfs fs;
    struct stat st;
    if (::statfs(place, &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC && ::stat(place, &st) == 0 &&
        st.st_ino == 1)
      return Cgroup2Mount{place, "/"};
  }
  return std::nullopt;
}

std::optional<std::string> unified_cgroup_path(std::string_view proc_self_cgroup) {
  std::istringstream in{std::string(proc_self_cgroup)};
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return std::nullopt;
}

std::unique_ptr<JobCgroup> JobCgroup::create(std::string* why) {
  auto fail = [&](const std::string& reason) -> std::unique_ptr<JobCgroup> {
    if (why) *why = reason;
    return nullptr;
  };
  std::string reason;
  auto mount = usual_cgroup2_mount();
  if (!mount) {
    auto mountinfo = read_text("/proc/self/mountinfo", &reason);
    if (!mountinfo) return fail(reason);
    mount = find_cgroup2_mount(*mountinfo);
  }
  if (!mount) return fail("no cgroup2 file system is mounted");
  auto cgroups = read_text("/proc/self/cgroup", &reason);
  if (!cgroups) return fail(reason);
  auto own = unified_cgroup_path(*cgroups);
  if (!own) return fail("/proc/self/cgroup has no cgroup v2 entry");
  // The mount shows the hierarchy from `root` down (a container's cgroup
  // namespace usually makes that our own root "/").
  std::string rel = *own;
  if (mount->root != "/") {
    if (rel.rfind(mount->root, 0) != 0)
      return fail("this process's cgroup " + rel + " is outside the mounted part " + mount->root);
    rel = rel.substr(mount->root.size());
  }
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  std::string parent = mount->mount_point + rel;
  if (rel.empty()) {
    // Not in the hierarchy's root itself: one ddprun/ folder keeps it tidy.
    parent += "/ddprun";
    if (mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST)
      return fail(base::describe_error("cannot create", parent, errno));
  }
  std::string path;
  for (int tries = 0;; ++tries) {
    path = parent + "/job." + std::to_string(getpid()) + "." + random_suffix();
    if (mkdir(path.c_str(), 0755) == 0) break;
    if (errno != EEXIST || tries > 16)
      return fail(base::describe_error("cannot create", path, errno));
  }
  std::unique_ptr<JobCgroup> cg(new JobCgroup(path));
  auto open_file = [&](const char* name, int flags, base::ScopedFd& fd) {
    fd.reset(::open((path + "/" + name).c_str(), flags | O_CLOEXEC));
    return fd.valid();
  };
  if (!open_file(".", O_RDONLY | O_DIRECTORY, cg->dir_))
    reason = base::describe_error("cannot open", path, errno);
  else if (!open_file("cgroup.procs", O_WRONLY, cg->procs_))
    reason = base::describe_error("cannot open", path + "/cgroup.procs", errno);
  else if (!open_file("cgroup.kill", O_WRONLY, cg->kill_))
    reason = "no " + path + "/cgroup.kill (needs Linux 5.14): " + base::errno_text(errno);
  else if (!open_file("cgroup.events", O_RDONLY, cg->events_))
    reason = base::describe_error("cannot open", path + "/cgroup.events", errno);
  else if (int err = probe_join(cg->dir_.get(), cg->procs_.get(), &cg->create_in_place_); err != 0)
    reason = base::describe_error("cannot move processes into", path, err);
  if (!reason.empty()) {
    cg.reset();  // the destructor removes the folder
    return fail(reason);
  }
  return cg;
}

void JobCgroup::remove_stale_siblings() const {
  remove_stale_cgroups(path_.substr(0, path_.rfind('/')));
}

JobCgroup::~JobCgroup() {
  if (kill_.valid()) kill_and_wait(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  attempt_dir_.reset();
  remove_child_cgroups(path_);  // the attempt.<n> ones
  dir_.reset();
  procs_.reset();
  kill_.reset();
  events_.reset();
  // Fails (EBUSY) only when a process survived the kill's deadline; the
  // guardian retries when the agent is gone.
  (void)rmdir(path_.c_str());
}

int JobCgroup::spawn_dir_fd() {
  if (!create_in_place_) return -1;
  if (killed_) {
    killed_ = false;
    // The previous one is empty once the kill is done; rmdir fails (EBUSY)
    // while a process lingers, and the destructor tries again.
    if (attempts_ > 0) (void)rmdir(attempt_path(attempts_).c_str());
    const std::string next = attempt_path(attempts_ + 1);
    if (mkdir(next.c_str(), 0755) != 0 && errno != EEXIST) {
      create_in_place_ = false;
      return -1;
    }
    ++attempts_;
    attempt_dir_.reset(::open(next.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!attempt_dir_) create_in_place_ = false;
  }
  return attempts_ > 0 ? attempt_dir_.get() : dir_.get();
}

bool JobCgroup::kill_all() {
  killed_ = true;  // spawn_dir_fd() says why
  ssize_t n;
  do {
    n = pwrite(kill_.get(), "1", 1, 0);
  } while (n < 0 && errno == EINTR);
  return n == 1;
}

bool JobCgroup::populated() const {
  char buf[256];
  ssize_t n = pread(events_.get(), buf, sizeof buf - 1, 0);
  if (n <= 0) return false;
  buf[n] = '\0';
  return strstr(buf, "populated 1") != nullptr;
}

bool JobCgroup::kill_and_wait(std::chrono::steady_clock::time_point deadline) {
  if (!populated()) return true;
  kill_all();
  // cgroup.events signals every change with POLLPRI; reading it (populated)
  // re-arms the notification, so no change between read and poll is lost.
  while (populated()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{events_.get(), POLLPRI, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (r < 0 && errno != EINTR) return false;
  }
  return true;
}

}  // namespace ddprun::agent
