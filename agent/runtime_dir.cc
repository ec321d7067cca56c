#include "agent/runtime_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <linux/magic.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "base/contract.h"
#include "base/procfs.h"
#include "base/safe_file.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

constexpr const char* kPrefix = base::kFileAgentDirPrefix;
constexpr const char* kNewPrefix = ".ddprun-agent-new.";
constexpr const char* kShmBase = "/dev/shm";
const std::string kLockPath = std::string("/") + base::kFileLock;
// The longest name placed in the folder that must fit sun_path.
constexpr size_t kLongestSocketName =
    std::char_traits<char>::length(base::kFileHeartbeatSocket) + 1;

void add_base(std::vector<std::string>& out, const EnvMap& env, const char* key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return;
  for (const auto& b : out)
    if (b == it->second) return;
  out.push_back(it->second);
}

std::vector<std::string> with_tmp(std::vector<std::string> out) {
  for (const auto& b : out)
    if (b == "/tmp") return out;
  out.push_back("/tmp");
  return out;
}

bool later(const timespec& a, const timespec& b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec > b.tv_sec : a.tv_nsec > b.tv_nsec;
}

// Removes the folder with its lock file last: a removal cut short (a file
// appearing meanwhile) leaves the lock, so the next ddprun tries again.
bool remove_locked_dir(const std::string& path) {
  std::error_code ec;
  bool ok = true;
  for (const auto& e : base::list_dir_or_empty(path))
    if (e.name != base::kFileLock) {
      std::filesystem::remove_all(path + "/" + e.name, ec);
      ok = ok && !ec;
    }
  if (!ok) return false;
  std::filesystem::remove(path + kLockPath, ec);
  return std::filesystem::remove(path, ec) && !ec;
}

}  // namespace

std::vector<std::string> runtime_bases(const EnvMap& env) {
  std::vector<std::string> out;
  add_base(out, env, base::kEnvXdgRuntimeDir);
  add_base(out, env, base::kEnvTmpDir);
  // Before /tmp, a memory file system: the folder and the run's folders
  // below it are made on every launch, and a mkdir on a disk's /tmp waits
  // for that disk's journal while others write to it; a tmpfs never. Only
  // when it is one; SafeDir checks it as it checks /tmp.
  struct statfs fs;
  if (::statfs(kShmBase, &fs) == 0 && fs.f_type == TMPFS_MAGIC &&
      std::find(out.begin(), out.end(), kShmBase) == out.end())
    out.push_back(kShmBase);
  return with_tmp(std::move(out));
}

std::vector<std::string> temp_bases(const EnvMap& env) {
  std::vector<std::string> out;
  add_base(out, env, base::kEnvTmpDir);
  return with_tmp(std::move(out));
}

std::string make_temp_dir(const std::vector<std::string>& bases, const std::string& prefix) {
  std::string tried;
  for (const auto& base : bases) {
    try {
      std::string leaf;
      base::SafeDir::open(base).make_unique_subdir(prefix, 0700, &leaf);
      return base + "/" + leaf;
    } catch (const base::FileError& e) {
      tried += (tried.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  throw std::runtime_error("cannot create a private folder (" + tried + ")");
}

RuntimeDir::RuntimeDir(const std::vector<std::string>& bases) {
  std::string tried;
  for (const auto& base : bases) {
    auto note = [&](const std::string& why) {
      tried += (tried.empty() ? "" : "; ") + base + ": " + why;
    };
    // <base>/ddprun-agent.XXXXXXXXXXXX/heartbeat.sock must fit sun_path.
    if (base.size() + 1 + strlen(kPrefix) + 12 + 1 + kLongestSocketName >
        sizeof(sockaddr_un{}.sun_path)) {
      note("too long a path for a socket");
      continue;
    }
    // By descriptor (base/safe_file.h): the base is checked (owner, mode,
    // no foreign symlink), the folder made under a random name, the lock
    // created O_EXCL|O_NOFOLLOW, and the final name taken only if nobody
    // holds it (RENAME_NOREPLACE, retried with a new name): another user
    // pre-creating names in /tmp can neither redirect nor stop the agent.
    std::string leaf;
    try {
      const base::SafeDir dir = base::SafeDir::open(base);
      base::SafeDir made = dir.make_unique_subdir(kNewPrefix, 0700, &leaf);
      base::ScopedFd lock = made.create_file(base::kFileLock, 0600);
      if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
        throw base::FileError(base::describe_error("flock", "", errno), errno);
      for (int tries = 0; tries < 100 && path_.empty(); ++tries) {
        const std::string final_leaf = kPrefix + base::random_hex(6);
        if (dir.rename_new(leaf, final_leaf)) path_ = base + "/" + final_leaf;
      }
      if (path_.empty()) throw base::FileError("no free folder name", EEXIST);
      struct stat st;
      if (lstat(path_.c_str(), &st) == 0) made_at_ = st.st_ctim;  // the rename's time
      lock_ = std::move(lock);
      return;
    } catch (const base::FileError& e) {
      note(e.what());
      if (!leaf.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(base + "/" + leaf, ec);
      }
    }
  }
  throw std::runtime_error("cannot create a private runtime folder (" + tried + ")");
}

RuntimeDir::~RuntimeDir() { remove_locked_dir(path_); }

int remove_stale_runtime_dirs(const std::string& base, std::optional<timespec> made_at) {
  const std::string mark = base + "/" + base::kFileSweepMarkPrefix + std::to_string(geteuid());
  struct stat st;
  if (made_at && lstat(mark.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      later(st.st_mtim, *made_at))
    return 0;
  {
    // Marked before the listing: a sweep that skips for this one relies on
    // what this listing sees.
    // O_NONBLOCK: a FIFO another user planted under the mark's name in a
    // shared /tmp must not block the open (ENXIO without a reader); one link
    // only: a hard link to someone else's file would have its time changed.
    base::ScopedFd fd(
        ::open(mark.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600));
    if (fd && fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 &&
        st.st_uid == geteuid())
      (void)futimens(fd.get(), nullptr);  // a mark not set costs a later agent a scan, no more
  }
  int removed = 0;
  for (const auto& e : base::list_dir_or_empty(base)) {
    if (e.name.rfind(kPrefix, 0) != 0) continue;
    std::string path = base + "/" + e.name;
    struct stat st;
    // Only our own folders: in a shared /tmp, others' are not ours to judge.
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    base::ScopedFd lock(::open((path + kLockPath).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
    // No lock file: not one of ours as we make them; leave it.
    if (!lock || flock(lock.get(), LOCK_EX | LOCK_NB) != 0) continue;
    if (remove_locked_dir(path)) ++removed;
  }
  return removed;
}

}  // namespace ddprun::agent
