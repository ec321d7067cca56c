#include "base/safe_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace ddprun::base {
namespace {

constexpr int kMaxSymlinks = 40;  // as the kernel's MAXSYMLINKS

[[noreturn]] void fail(const std::string& what, const std::string& path, int e) {
  throw FileError("cannot " + what + " " + printable(path) + ": " + errno_text(e), e);
}

[[noreturn]] void refuse(const std::string& path, const std::string& why, int e) {
  throw FileError("refusing " + printable(path) + ": " + why, e);
}

bool trusted_owner(uid_t uid) { return uid == ::geteuid() || uid == 0; }

std::string join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// The folder rule of the header; returns whether the folder is shared.
bool check_folder(const struct stat& st, const std::string& path) {
  if (!S_ISDIR(st.st_mode)) refuse(path, "it is not a folder", ENOTDIR);
  if (!trusted_owner(st.st_uid)) {
    refuse(path,
           "it is owned by uid " + std::to_string(st.st_uid) + ", neither you (uid " +
               std::to_string(::geteuid()) + ") nor root",
           EPERM);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) == 0) return false;
  if ((st.st_mode & S_ISVTX) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    refuse(path, std::string("other users can write to it (mode ") + mode + ", not sticky)",
           EPERM);
  }
  return true;
}

// "/a/./b/../c" -> {"a", "c"}: lexical, as the header says.
std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(pos, end - pos);
    if (part == "..") {
      if (!out.empty()) out.pop_back();
    } else if (!part.empty() && part != ".") {
      out.push_back(std::move(part));
    }
    pos = end + 1;
  }
  return out;
}

struct Walk {
  ScopedFd fd;
  std::string path;
  bool shared = false;
};

Walk checked(ScopedFd fd, std::string path) {
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) fail("stat", path, errno);
  const bool shared = check_folder(st, path);
  return Walk{std::move(fd), std::move(path), shared};
}

Walk open_root() {
  ScopedFd fd(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) fail("open", "/", errno);
  return checked(std::move(fd), "/");
}

// One step from the checked folder `w` to its child `name`. Returns false
// with *link set when the child is a symlink that may be followed.
bool step(Walk& w, const std::string& name, bool create, mode_t mode, bool follow,
          std::string* link) {
  const std::string path = join(w.path, name);
  // Retried only when the name changes under us (created or removed by
  // someone else between two calls): each try either moves on or throws.
  for (int tries = 0; tries < 16; ++tries) {
    ScopedFd fd(::openat(w.fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd) {
      w = checked(std::move(fd), path);
      return true;
    }
    const int e = errno;
    if (e == ENOENT) {
      if (!create) fail("open folder", path, e);
      if (::mkdirat(w.fd.get(), name.c_str(), mode) != 0 && errno != EEXIST)
        fail("create folder", path, errno);
      continue;
    }
    if (e != ELOOP && e != ENOTDIR) fail("open folder", path, e);
    struct stat st{};
    if (::fstatat(w.fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      fail("stat", path, errno);
    }
    if (!S_ISLNK(st.st_mode)) refuse(path, "it is not a folder", ENOTDIR);
    if (!follow)
      refuse(path, "it is a symlink, and none is followed below a folder ddprun opened", ELOOP);
    if (w.shared && !trusted_owner(st.st_uid)) {
      refuse(path,
             "it is a symlink owned by uid " + std::to_string(st.st_uid) +
                 " in a folder other users can write: not following it",
             ELOOP);
    }
    char target[4096];
    const ssize_t n = ::readlinkat(w.fd.get(), name.c_str(), target, sizeof target);
    if (n < 0) {
      if (errno == ENOENT || errno == EINVAL) continue;
      fail("read symlink", path, errno);
    }
    if (size_t(n) >= sizeof target) refuse(path, "its symlink target is too long", ENAMETOOLONG);
    link->assign(target, size_t(n));
    return false;
  }
  fail("open folder", path, EAGAIN);
}

ScopedFd dup_dir(const ScopedFd& fd, const std::string& path) {
  ScopedFd out(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!out) fail("duplicate the descriptor of", path, errno);
  return out;
}

// A name of the folder itself: no separator, not "." or "..", no control
// character. Anything else would reach outside the folder's descriptor.
void check_name(const std::string& name, const std::string& dir) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      find_control_character(name) >= 0) {
    refuse(join(dir, name), "not a plain file name", EINVAL);
  }
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", path, errno);
    done += size_t(n);
  }
}

}  // namespace

int find_control_character(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return int(i);
  }
  return -1;
}

std::string printable(std::string_view text) {
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::getrandom(raw.data() + done, bytes - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      throw FileError(describe_error("getrandom", "", e), e);
    }
    done += size_t(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (char ch : raw) {
    const auto c = static_cast<unsigned char>(ch);
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

SafeDir SafeDir::open(const std::string& path, bool create, mode_t mode) {
  if (path.empty()) refuse("\"\"", "an empty path", EINVAL);
  if (find_control_character(path) >= 0)
    refuse(path, "the path holds a control character", EINVAL);
  std::string absolute = path;
  if (path[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) fail("resolve", path, errno);
    absolute = std::string(cwd) + "/" + path;
  }
  std::vector<std::string> todo = components(absolute);
  Walk w = open_root();
  int links = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    std::string target;
    if (step(w, todo[i], create, mode, true, &target)) continue;
    if (++links > kMaxSymlinks) refuse(path, "too many symlinks", ELOOP);
    // Start again from "/" on the link's target and what was left.
    std::string rest = target[0] == '/' ? target : join(w.path, target);
    for (size_t j = i + 1; j < todo.size(); ++j) rest += "/" + todo[j];
    todo = components(rest);
    w = open_root();
    i = size_t(-1);
  }
  return SafeDir(std::move(w.fd), path, w.shared);
}

std::string SafeDir::child(const std::string& name) const { return join(path_, name); }

SafeDir SafeDir::subdir(const std::string& rel, bool create, mode_t mode) const {
  if (rel.empty() || rel[0] == '/') refuse(child(rel), "not a relative path", EINVAL);
  Walk w{dup_dir(fd_, path_), path_, shared_};
  size_t pos = 0;
  while (pos <= rel.size()) {
    size_t end = rel.find('/', pos);
    if (end == std::string::npos) end = rel.size();
    const std::string part = rel.substr(pos, end - pos);
    pos = end + 1;
    if (part.empty()) continue;
    check_name(part, w.path);
    std::string unused;
    step(w, part, create, mode, false, &unused);
  }
  return SafeDir(std::move(w.fd), w.path, w.shared);
}

SafeDir SafeDir::make_unique_subdir(const std::string& prefix, mode_t mode,
                                    std::string* name) const {
  for (int tries = 0; tries < 100; ++tries) {
    const std::string leaf = prefix + random_hex(6);
    check_name(leaf, path_);
    if (::mkdirat(fd_.get(), leaf.c_str(), mode) != 0) {
      if (errno == EEXIST) continue;
      fail("create folder", child(leaf), errno);
    }
    if (name) *name = leaf;
    return subdir(leaf, false);
  }
  fail("create a new folder in", path_, EEXIST);
}

ScopedFd SafeDir::create_file(const std::string& name, mode_t mode) const {
  check_name(name, path_);
  ScopedFd fd(::openat(fd_.get(), name.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd) fail("create", child(name), errno);
  return fd;
}

ScopedFd SafeDir::open_append(const std::string& name, mode_t mode) const {
  check_name(name, path_);
  const int exclusive = shared_ ? O_EXCL : 0;
  ScopedFd fd(::openat(fd_.get(), name.c_str(),
                       O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | exclusive, mode));
  if (!fd) fail("open for appending", child(name), errno);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) fail("stat", child(name), errno);
  // A hard link to someone else's file would be written through.
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1)
    refuse(child(name), "not a regular file with a single link", EPERM);
  return fd;
}

ScopedFd SafeDir::open_truncate(const std::string& name, mode_t mode) const {
  ScopedFd fd = open_append(name, mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_APPEND) != 0 ||
      ::ftruncate(fd.get(), 0) != 0)
    fail("truncate", child(name), errno);
  return fd;
}

ScopedFd SafeDir::open_read(const std::string& name) const {
  check_name(name, path_);
  // O_NONBLOCK: a planted FIFO must not block the open.
  ScopedFd fd(::openat(fd_.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd) fail("open", child(name), errno);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) fail("stat", child(name), errno);
  if (!S_ISREG(st.st_mode)) refuse(child(name), "not a regular file", EPERM);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    fail("set flags of", child(name), errno);
  return fd;
}

std::string SafeDir::read_file(const std::string& name, size_t limit) const {
  ScopedFd fd = open_read(name);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read", child(name), errno);
    if (n == 0) return out;
    if (out.size() + size_t(n) > limit) refuse(child(name), "larger than expected", E2BIG);
    out.append(buf, size_t(n));
  }
}

void SafeDir::write_atomically(const std::string& name, std::string_view bytes, bool durable,
                               mode_t mode) const {
  check_name(name, path_);
  replace(name, bytes, durable, mode, true);
}

void SafeDir::replace(const std::string& name, std::string_view bytes, bool durable, mode_t mode,
                      bool try_tmpfile) const {
  auto temp_name = [&] { return "." + name + ".tmp-" + random_hex(16); };
  // O_TMPFILE: the file has no name until it is complete; file systems
  // without it (some FUSE, NFS) get an O_EXCL name no one can guess.
  ScopedFd fd;
  if (try_tmpfile) fd.reset(::openat(fd_.get(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, mode));
  const bool anonymous = bool(fd);
  std::string tmp;
  if (!anonymous) {
    if (try_tmpfile && errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL &&
        errno != ENOENT)
      fail("create a temp file in", path_, errno);
    for (int tries = 0; !fd && tries < 100; ++tries) {
      tmp = temp_name();
      fd.reset(::openat(fd_.get(), tmp.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
      if (!fd && errno != EEXIST) fail("create", child(tmp), errno);
    }
    if (!fd) fail("create a temp file in", path_, EEXIST);
  }
  auto drop_tmp = [&] {
    if (!tmp.empty()) (void)::unlinkat(fd_.get(), tmp.c_str(), 0);
  };
  try {
    write_all(fd.get(), bytes, anonymous ? child(name) : child(tmp));
    if (durable && ::fsync(fd.get()) != 0) fail("fsync", child(name), errno);
    if (anonymous) {
      const std::string proc = "/proc/self/fd/" + std::to_string(fd.get());
      for (int tries = 0; tmp.empty() && tries < 100; ++tries) {
        std::string candidate = temp_name();
        if (::linkat(AT_FDCWD, proc.c_str(), fd_.get(), candidate.c_str(), AT_SYMLINK_FOLLOW) == 0)
          tmp = candidate;
        else if (errno == ENOENT)  // no /proc: write it again under a name
          return replace(name, bytes, durable, mode, false);
        else if (errno != EEXIST)
          fail("link the temp file for", child(name), errno);
      }
      if (tmp.empty()) fail("link the temp file for", child(name), EEXIST);
    }
    const int rc = ::close(fd.release());
    if (rc != 0 && errno != EINTR) fail("close", child(name), errno);
    if (::renameat(fd_.get(), tmp.c_str(), fd_.get(), name.c_str()) != 0)
      fail("rename into place", child(name), errno);
    tmp.clear();
    if (durable) fsync();
  } catch (...) {
    drop_tmp();
    throw;
  }
}

bool SafeDir::rename_new(const std::string& from, const std::string& to) const {
  check_name(from, path_);
  check_name(to, path_);
  if (::renameat2(fd_.get(), from.c_str(), fd_.get(), to.c_str(), RENAME_NOREPLACE) == 0)
    return true;
  if (errno == EEXIST) return false;
  fail("rename " + printable(child(from)) + " to", child(to), errno);
}

bool SafeDir::remove(const std::string& name) const {
  check_name(name, path_);
  if (::unlinkat(fd_.get(), name.c_str(), 0) == 0) return true;
  if (errno == ENOENT) return false;
  fail("remove", child(name), errno);
}

std::vector<std::string> SafeDir::entries() const {
  // A description of its own: a dup would share the read position.
  ScopedFd fd(::openat(fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) fail("list", path_, errno);
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) fail("list", path_, errno);
  (void)fd.release();  // closedir closes it
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  return out;
}

void SafeDir::fsync() const {
  if (::fsync(fd_.get()) != 0) fail("fsync", path_, errno);
}

SafeDir open_private_dir(const SafeDir& parent, const std::string& name, std::string* note) {
  check_name(name, parent.path());
  const std::string path = join(parent.path(), name);
  for (int tries = 0; tries < 16; ++tries) {
    if (::mkdirat(parent.fd(), name.c_str(), 0700) != 0 && errno != EEXIST)
      fail("create folder", path, errno);
    struct stat st{};
    if (::fstatat(parent.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      fail("stat", path, errno);
    }
    if (S_ISDIR(st.st_mode) && st.st_uid == ::geteuid()) {
      ScopedFd fd(::openat(parent.fd(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd) {
        if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) continue;  // swapped meanwhile
        fail("open folder", path, errno);
      }
      struct stat mine{};
      if (::fstat(fd.get(), &mine) != 0) fail("stat", path, errno);
      if (mine.st_uid != ::geteuid()) continue;
      if ((mine.st_mode & 077) != 0 && ::fchmod(fd.get(), 0700) != 0) fail("chmod 0700", path, errno);
      return SafeDir(std::move(fd), path, false);
    }
    // Not ours (or not a folder): someone got there first. Moved aside, not
    // removed: a root-run rm -r of another user's tree invites trouble.
    const std::string aside = name + ".planted-" + random_hex(6);
    const std::string what = S_ISLNK(st.st_mode)  ? "a symlink"
                             : S_ISDIR(st.st_mode) ? "a folder"
                                                   : "a file";
    const std::string whose = what + " owned by uid " + std::to_string(st.st_uid);
    if (::renameat2(parent.fd(), name.c_str(), parent.fd(), aside.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno == ENOENT) continue;
      refuse(path,
             "it is " + whose + ", not a private folder of uid " + std::to_string(::geteuid()) +
                 " (remove it, or set XDG_RUNTIME_DIR)",
             EPERM);
    }
    if (note) {
      *note = printable(path) + " was " + whose + ", not a private folder of uid " +
              std::to_string(::geteuid()) + ": moved aside to " + join(parent.path(), aside);
    }
  }
  fail("make a private folder", path, EAGAIN);
}

void write_file_atomically(const std::string& path, std::string_view bytes, bool durable) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  SafeDir::open(dir).write_atomically(name, bytes, durable);
}

}  // namespace ddprun::base
