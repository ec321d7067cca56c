// JobCgroup: a cgroup v2 of this agent's own that holds every worker and
// everything the workers start, so that one write to its cgroup.kill ends
// them all, also grandchildren that left the process group or the session
// (setsid, double-forked daemons), which no process-group signal reaches.
//
// Where: the cgroup2 mount from /proc/self/mountinfo (never an assumed path;
// in a hybrid layout it is e.g. /sys/fs/cgroup/unified), below the agent's
// own cgroup from /proc/self/cgroup, or below <mount>/ddprun/ when the agent
// sits in the hierarchy's root. Name: job.<agent pid>.<random>. Workers join
// it between fork and exec (created in it by clone3, fork_into_cgroup.h, or
// writing "0" to cgroup.procs_fd(): spawn.h), so no user code ever runs
// outside it. The agent stays outside: killing the
// cgroup never kills the agent or its guardian.
//
// create() proves the cgroup usable (a throwaway child joins it) and needs
// cgroup.kill (Linux 5.14); otherwise it returns null and says why, and the
// agent falls back to process-group and descendant sweeps.
//
// Move-only by ownership (unique_ptr); the destructor kills what is left and
// removes the folder (bounded wait). Not thread-safe: the agent's thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/scoped_fd.h"

namespace ddprun::agent {

class JobCgroup {
 public:
  // Null with `why` set when no usable cgroup v2 can be made here.
  static std::unique_ptr<JobCgroup> create(std::string* why);
  ~JobCgroup();
  JobCgroup(const JobCgroup&) = delete;
  JobCgroup& operator=(const JobCgroup&) = delete;

  // The cgroup's folder, e.g. /sys/fs/cgroup/unified/ddprun/job.123.a1b2c3.
  const std::string& path() const { return path_; }
  // cgroup.procs opened for writing (close-on-exec): a forked child writes
  // "0" to it to move itself in before exec.
  int procs_fd() const { return procs_.get(); }
  // The folder (O_DIRECTORY, close-on-exec) clone3 creates the next worker
  // in (fork_into_cgroup.h): the cgroup itself, and after each kill_all()
  // a fresh child cgroup of it, attempt.<n>; -1 when the probe saw creating
  // in place fail (workers then move in through procs_fd()). Why a fresh
  // one: on this kernel (6.18) every child created in a cgroup after a
  // cgroup.kill of it (or of an ancestor) was SIGKILLed at birth (the kill's
  // sequence number is compared with the parent's cgroup, not the target's);
  // a cgroup made after the kill has not been killed. cgroup.kill,
  // cgroup.events and the guardian act on this cgroup, so on its children too.
  int spawn_dir_fd();
  // SIGKILLs every process in the cgroup (cgroup.kill); false on error.
  bool kill_all();
  // True while any process is in the cgroup (cgroup.events "populated").
  bool populated() const;
  // kill_all() and wait until the cgroup is empty or `deadline` passes.
  bool kill_and_wait(std::chrono::steady_clock::time_point deadline);
  // Removes the empty job.<pid>.* cgroups beside this one whose agent is
  // gone (one that died before its guardian started): housekeeping, which
  // the agent does once its first workers are started.
  void remove_stale_siblings() const;

 private:
  explicit JobCgroup(std::string path) : path_(std::move(path)) {}
  std::string attempt_path(int n) const { return path_ + "/attempt." + std::to_string(n); }

  std::string path_;
  base::ScopedFd dir_;  // the cgroup's folder
  base::ScopedFd procs_;
  base::ScopedFd kill_;
  base::ScopedFd events_;
  bool create_in_place_ = true;  // spawn_dir_fd()
  bool killed_ = false;          // since the last spawn_dir_fd()
  int attempts_ = 0;             // attempt.<1..attempts_> made so far
  base::ScopedFd attempt_dir_;   // the newest of them
};

// The cgroup2 mount point and the hierarchy path it shows (the mount's
// root field) from a /proc/self/mountinfo text; nullopt when there is none.
struct Cgroup2Mount {
  std::string mount_point;
  std::string root;
};
std::optional<Cgroup2Mount> find_cgroup2_mount(std::string_view mountinfo);
// The same answer without reading mountinfo (the kernel formats every mount
// for it, on a launch's path), where it is certain: this process is
// in the initial cgroup namespace (so /proc/self/cgroup's paths start at the
// hierarchy's root) and /sys/fs/cgroup or /sys/fs/cgroup/unified is a
// cgroup2 file system showing that root (inode 1: the root cgroup's id), so
// its root field is "/". nullopt otherwise: read mountinfo then.
std::optional<Cgroup2Mount> usual_cgroup2_mount();

// The unified hierarchy's path ("0::<path>") from a /proc/self/cgroup text.
std::optional<std::string> unified_cgroup_path(std::string_view proc_self_cgroup);

}  // namespace ddprun::agent
