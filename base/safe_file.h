// SafeDir: the one way ddprun creates folders and files, safe to use as root
// in a folder other users can write (a shared /tmp, a user's log folder).
//
// Opening a folder walks its path from "/" one component at a time, each
// opened relative to the folder before it (openat, O_NOFOLLOW|O_DIRECTORY),
// and checks every folder on the way:
//   - its owner is the invoking user (euid) or root;
//   - it is not group/world-writable, unless sticky (like /tmp): then it is
//     "shared", and what is found in it must be owned by us or root (the
//     sticky bit keeps others from renaming it away).
// A symlink on the way is followed only when whoever could have put it there
// is trusted: it lies in a folder only we or root can write, or it is owned
// by us or root (the kernel's protected_symlinks rule, which is off on many
// machines). So a symlink the user made, or one in a path the user gave on
// the command line through folders only they control, is followed; one that
// another user planted in /tmp is refused. ".." is resolved lexically.
// Relative paths are taken from the current folder (whose ancestors are
// checked too). A path holding a control character (a newline forging a
// console line) is refused.
//
// Files are created relative to the folder's descriptor, never following a
// symlink (O_NOFOLLOW|O_CLOEXEC): create_file is exclusive (O_EXCL);
// open_append reuses an existing regular file with one link only when the
// folder is not shared; write_atomically writes a whole file under a temp
// name no one can guess (O_TMPFILE where the file system has it, else 128
// random bits, O_EXCL) and renames it into place.
//
// Every failure throws FileError: one line naming the path, what was being
// done and errno's text; error() gives errno for callers that branch on it
// (ENOSPC, EEXIST).
//
// A SafeDir is move-only and owns its descriptor. Thread-compatible: its
// methods only read the descriptor, so concurrent use is fine.
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/scoped_fd.h"
#include "base/system_error.h"

namespace ddprun::base {

// A refused or failed file operation: a SystemError (errno, kind()) whose
// message names the path and, for a refusal, why.
class FileError : public SystemError {
 public:
  FileError(const std::string& message, int error) : SystemError(message, error) {}
};

class SafeDir;
SafeDir open_private_dir(const SafeDir& parent, const std::string& name, std::string* note);

class SafeDir {
 public:
  // Opens `path`, creating missing folders (mode `mode`, before umask) when
  // `create`. Throws FileError (see above for what is refused).
  static SafeDir open(const std::string& path, bool create = false, mode_t mode = 0755);

  SafeDir(SafeDir&&) = default;
  SafeDir& operator=(SafeDir&&) = default;

  // A folder below this one, `rel` being one or more components
  // ("attempt_0/3"); symlinks below are never followed. Missing ones are
  // created when `create`.
  SafeDir subdir(const std::string& rel, bool create, mode_t mode = 0755) const;
  // A new folder <prefix><random> (mkdtemp's job, by descriptor); its name
  // is stored in *name when given.
  SafeDir make_unique_subdir(const std::string& prefix, mode_t mode = 0700,
                             std::string* name = nullptr) const;

  // A new file, opened for writing; fails (EEXIST) when the name exists.
  ScopedFd create_file(const std::string& name, mode_t mode = 0644) const;
  // For appending: created when missing; an existing file is reused only
  // when it is a regular file with one link in a folder that is not shared.
  ScopedFd open_append(const std::string& name, mode_t mode = 0644) const;
  // For rewriting from empty: created when missing; an existing file is
  // truncated only under the same conditions as open_append's (checked
  // before anything is truncated).
  ScopedFd open_truncate(const std::string& name, mode_t mode = 0644) const;
  // Read-only, not following a symlink.
  ScopedFd open_read(const std::string& name) const;
  // The whole file, at most `limit` bytes (FileError E2BIG past it).
  std::string read_file(const std::string& name, size_t limit = size_t(1) << 30) const;
  // Replaces `name` by `bytes` atomically; `durable` fsyncs the file and the
  // folder. A failure leaves no temp file behind.
  void write_atomically(const std::string& name, std::string_view bytes, bool durable,
                        mode_t mode = 0644) const;
  // renameat2(RENAME_NOREPLACE) within this folder: false when `to`
  // exists (nothing is moved then); throws on other errors.
  bool rename_new(const std::string& from, const std::string& to) const;
  // unlinkat; false when it was not there. Throws on other errors.
  bool remove(const std::string& name) const;
  // Names in the folder, without "." and "..".
  std::vector<std::string> entries() const;
  void fsync() const;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // Group/world-writable and sticky: files here are only ever created new.
  bool shared() const { return shared_; }

 private:
  friend SafeDir open_private_dir(const SafeDir&, const std::string&, std::string*);
  SafeDir(ScopedFd fd, std::string path, bool shared)
      : fd_(std::move(fd)), path_(std::move(path)), shared_(shared) {}
  std::string child(const std::string& name) const;
  void replace(const std::string& name, std::string_view bytes, bool durable, mode_t mode,
               bool try_tmpfile) const;

  ScopedFd fd_;
  std::string path_;
  bool shared_ = false;
};

// A folder for this user alone, `<parent>/<name>` (/tmp/ddprun-<uid>):
// created 0700 when missing; an existing one must be a folder, not a
// symlink, owned by the euid, and closed to others (a wider mode of our own
// is narrowed to 0700). One another user planted there (a folder, file or
// symlink) is renamed aside to <name>.planted-<random> when we may (root, or
// the parent is ours), and *note says so in one line; otherwise FileError
// names its owner. Nothing planted is ever followed or removed.
SafeDir open_private_dir(const SafeDir& parent, const std::string& name, std::string* note);

// Writes `bytes` to `path` atomically through SafeDir: the folder is opened
// with SafeDir::open.
void write_file_atomically(const std::string& path, std::string_view bytes, bool durable);

// The first control character (below 0x20, or 0x7f) in `text`, or -1.
int find_control_character(std::string_view text);
// `text` with control characters written as \n, \t or \xNN: for messages.
std::string printable(std::string_view text);
// `bytes` random bytes (getrandom) as lower-case hex.
std::string random_hex(size_t bytes);

}  // namespace ddprun::base
