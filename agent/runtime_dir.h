// RuntimeDir: a folder for one agent alone, for the files nobody else may
// touch: the heartbeat socket, torch's timer FIFO and, without --log-dir,
// the private root of error files. Never in the (possibly shared) log
// folder, so two jobs with the same --log-dir and --rdzv-id cannot unlink
// each other's sockets.
//
// Where: the first base folder that works of $XDG_RUNTIME_DIR, $TMPDIR,
// /dev/shm when it is a tmpfs (a launch makes its folders faster there than
// on a disk) and /tmp (a missing or unwritable one is skipped; one so deep that the
// heartbeat socket's path would not fit AF_UNIX's sun_path too). Name:
// ddprun-agent.<12 random hex>, mode 0700 (base::SafeDir: the base folder's
// owner and mode checked, the name taken with RENAME_NOREPLACE so another
// user's pre-created names can neither redirect nor stop it), holding a
// `lock` file (O_EXCL|O_NOFOLLOW) the agent
// keeps flock()ed for its whole life (close-on-exec, so workers never hold
// it; the guardian closes it at once).
//
// The destructor removes the folder. After a kill -9 the folder stays, but
// its lock is free: remove_stale_runtime_dirs() (run by every agent once its
// first workers are started, unless a sweep began after its own folder was
// made) removes such folders. A folder is only made visible under its final name once it
// is locked (created as .ddprun-agent-new.<random>, then renamed), so a
// scanning agent never mistakes a folder being set up for a dead one.
//
// Not thread-safe; the agent's thread.
#pragma once

#include <time.h>

#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {

class RuntimeDir {
 public:
  // Throws std::runtime_error naming every base folder tried and why each
  // failed.
  explicit RuntimeDir(const std::vector<std::string>& bases);
  ~RuntimeDir();
  RuntimeDir(const RuntimeDir&) = delete;
  RuntimeDir& operator=(const RuntimeDir&) = delete;

  const std::string& path() const { return path_; }
  // When the folder took its final name (its ctime: the file clock that
  // stamps the sweep marks); empty when it could not be read.
  std::optional<timespec> made_at() const { return made_at_; }

 private:
  std::string path_;
  std::optional<timespec> made_at_;
  base::ScopedFd lock_;
};

// $XDG_RUNTIME_DIR and $TMPDIR from ddprun's environment, /dev/shm when it
// is a tmpfs, /tmp, in that order, without empty values or repeats.
std::vector<std::string> runtime_bases(const EnvMap& env);
// $TMPDIR, /tmp: for folders that must survive a logout (kept logs).
std::vector<std::string> temp_bases(const EnvMap& env);

// Removes every ddprun-agent.* folder under `base` whose agent is gone (its
// lock can be taken). Returns how many it removed. With `made_at` (the
// caller's own folder's RuntimeDir::made_at), it does nothing and returns 0
// when this user's last sweep of `base` began later (its mark's mtime): a
// folder left by an agent that died before the caller's was made existed
// when that sweep listed `base`, so it is gone or being removed. Each scan
// is O(folders): N agents started together each scanning all N would be
// O(N^2) opens and flocks on one machine; this is about one scan.
// The mark is taken as the sweep begins (created 0600, ignored unless a
// regular file of this user's).
int remove_stale_runtime_dirs(const std::string& base,
                              std::optional<timespec> made_at = std::nullopt);

// <base>/<prefix><random>, 0700, made by base::SafeDir in the first base
// where it works; throws
// std::runtime_error naming each base and its error.
std::string make_temp_dir(const std::vector<std::string>& bases, const std::string& prefix);

}  // namespace ddprun::agent
