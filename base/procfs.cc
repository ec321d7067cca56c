#include "base/procfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/scoped_fd.h"
#include "base/system_error.h"

namespace ddprun::base {
namespace {

std::string proc_path(pid_t pid, std::string_view name) {
  std::string path = "/proc/" + std::to_string(pid);
  if (!name.empty()) path.append("/").append(name);
  return path;
}

// A decimal pid, or 0 for any other name ("self", "sys", ...).
pid_t pid_of(const std::string& name) {
  if (name.empty() || name[0] < '1' || name[0] > '9') return 0;
  char* end = nullptr;
  const long v = std::strtol(name.c_str(), &end, 10);
  return *end == '\0' && v > 0 ? static_cast<pid_t>(v) : 0;
}

// The numeric entries of a /proc folder, ascending.
std::vector<pid_t> numeric_entries(const std::string& path) {
  std::vector<pid_t> out;
  if (auto entries = try_list_dir(path))
    for (const auto& e : *entries)
      if (pid_t id = pid_of(e.name)) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> split_nul(const std::string& all) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] != '\0') continue;
    out.push_back(all.substr(start, i - start));
    start = i + 1;
  }
  // A process may overwrite its argv without the final NUL.
  if (start < all.size()) out.push_back(all.substr(start));
  return out;
}

// Whether this kernel has /proc/<pid>/task/<tid>/children
// (CONFIG_PROC_CHILDREN); asked once, of this very thread.
bool kernel_lists_children() {
  static const bool has = [] {
    const std::string own = "/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/children";
    return ::access(own.c_str(), R_OK) == 0;
  }();
  return has;
}

}  // namespace

std::optional<std::vector<DirEntry>> try_list_dir(const std::string& path, int* err) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    if (err) *err = errno;
    return std::nullopt;
  }
  std::vector<DirEntry> out;
  errno = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") out.push_back(DirEntry{std::string(name), e->d_type});
  }
  // readdir's errors are rare (a folder removed under it): what it listed stands.
  ::closedir(dir);
  return out;
}

std::vector<DirEntry> list_dir(const std::string& path) {
  int err = 0;
  auto entries = try_list_dir(path, &err);
  if (!entries) throw_system_error("opendir", path, err);
  return std::move(*entries);
}

std::vector<DirEntry> list_dir_or_empty(const std::string& path) {
  auto entries = try_list_dir(path);
  return entries ? std::move(*entries) : std::vector<DirEntry>{};
}

std::optional<std::string> read_proc_file(const std::string& path, int* err) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (err) *err = errno;
    return std::nullopt;
  }
  std::string out;
  char buf[16384];
  while (out.size() < kMaxProcFileBytes) {
    const ssize_t n = ::read(fd.get(), buf, std::min(sizeof buf, kMaxProcFileBytes - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {  // e.g. ESRCH: the process exited while it was read
      if (err) *err = errno;
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::optional<std::string> read_proc_file(pid_t pid, std::string_view name) {
  return read_proc_file(proc_path(pid, name));
}

bool blocked_in_read(pid_t pid, int fd) {
  const auto line = read_proc_file(pid, "syscall");  // "63 0x0 0x... ..." or "running"
  long number = -1;
  unsigned long first = 0;
  if (!line || std::sscanf(line->c_str(), "%ld 0x%lx", &number, &first) != 2) return false;
  return number == SYS_read && first == static_cast<unsigned long>(fd);
}

std::vector<pid_t> all_pids() { return numeric_entries("/proc"); }

std::vector<ProcStat> scan_processes() {
  std::vector<ProcStat> out;
  for (pid_t pid : all_pids())
    if (auto st = read_proc_stat(pid)) out.push_back(std::move(*st));
  return out;
}

std::vector<pid_t> thread_ids(pid_t pid) { return numeric_entries(proc_path(pid, "task")); }

std::vector<pid_t> child_pids(pid_t pid) {
  std::vector<pid_t> out;
  if (!kernel_lists_children()) {
    for (const auto& st : scan_processes())
      if (st.ppid == pid) out.push_back(st.pid);
    return out;
  }
  // Each thread lists the children it forked.
  for (pid_t tid : thread_ids(pid)) {
    const auto text = read_proc_file(proc_path(pid, "task/" + std::to_string(tid) + "/children"));
    const char* p = text ? text->c_str() : "";
    for (char* end = nullptr;; p = end) {
      const long child = std::strtol(p, &end, 10);
      if (end == p) break;
      if (child > 0) out.push_back(static_cast<pid_t>(child));
    }
  }
  return out;
}

std::vector<pid_t> process_tree(pid_t root) {
  std::vector<pid_t> out{root};
  for (std::size_t i = 0; i < out.size() && out.size() < 100000; ++i)
    for (pid_t c : child_pids(out[i])) out.push_back(c);
  return out;
}

std::vector<pid_t> ancestry(pid_t pid) {
  std::vector<pid_t> out;
  for (int i = 0; i < 64 && pid > 1; ++i) {
    const auto st = read_proc_stat(pid);
    if (!st) break;
    out.push_back(pid);
    pid = st->ppid;
  }
  return out;
}

bool catches_signal(pid_t pid, int sig) {
  const auto mask_text = read_proc_status_field(pid, "SigCgt");
  if (!mask_text) return false;
  const uint64_t mask = std::strtoull(mask_text->c_str(), nullptr, 16);
  return sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1);
}

std::optional<uint64_t> read_proc_io_bytes(pid_t pid) {
  const auto io = read_proc_file(pid, "io");
  if (!io) return std::nullopt;
  uint64_t total = 0;
  for (std::size_t at = 0; at < io->size();) {
    std::size_t eol = io->find('\n', at);
    if (eol == std::string::npos) eol = io->size();
    if (io->compare(at, 6, "rchar:") == 0 || io->compare(at, 6, "wchar:") == 0)
      total += std::strtoull(io->c_str() + at + 6, nullptr, 10);
    at = eol + 1;
  }
  return total;
}

std::optional<std::string> read_proc_status_field(pid_t pid, std::string_view field) {
  const auto status = read_proc_file(pid, "status");
  if (!status) return std::nullopt;
  const std::string key = std::string(field) + ":";
  for (std::size_t at = 0; at < status->size();) {
    std::size_t eol = status->find('\n', at);
    if (eol == std::string::npos) eol = status->size();
    if (status->compare(at, key.size(), key) == 0) {
      std::size_t v = at + key.size();
      while (v < eol && ((*status)[v] == ' ' || (*status)[v] == '\t')) ++v;
      return status->substr(v, eol - v);
    }
    at = eol + 1;
  }
  return std::nullopt;
}

std::optional<std::vector<std::string>> read_proc_environ(pid_t pid) {
  const auto all = read_proc_file(pid, "environ");
  if (!all) return std::nullopt;
  return split_nul(*all);
}

std::optional<std::vector<std::string>> read_proc_cmdline(pid_t pid) {
  const auto all = read_proc_file(pid, "cmdline");
  if (!all) return std::nullopt;
  return split_nul(*all);
}

std::optional<std::string> read_proc_exe(pid_t pid) {
  char buf[4096];
  const ssize_t n = ::readlink(proc_path(pid, "exe").c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<std::size_t>(n) == sizeof buf) return std::nullopt;
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string installed_or(const std::string& relative, const std::string& marker,
                         const std::string& fallback) {
  const auto exe = read_proc_exe(::getpid());
  if (!exe) return fallback;
  // <prefix>/bin/<name> -> <prefix>
  std::string prefix = *exe;
  for (int up = 0; up < 2; ++up) {
    const size_t slash = prefix.rfind('/');
    if (slash == std::string::npos) return fallback;
    prefix.resize(slash);
  }
  const std::string dir = prefix + "/" + relative;
  return ::access((dir + "/" + marker).c_str(), F_OK) == 0 ? dir : fallback;
}

std::optional<std::string> proc_environ_value(pid_t pid, std::string_view key) {
  const auto env = read_proc_environ(pid);
  if (!env) return std::nullopt;
  for (const auto& kv : *env)
    if (kv.size() > key.size() && kv[key.size()] == '=' && kv.compare(0, key.size(), key) == 0)
      return kv.substr(key.size() + 1);
  return std::nullopt;
}

void for_each_entry_no_alloc(int dir_fd, void (*each)(const char* name, unsigned char type, void* ctx),
                             void* ctx) {
  // Records are read in place: the buffer is aligned for dirent64.
  alignas(dirent64) static char buf[32768];
  long n;
  while ((n = ::syscall(SYS_getdents64, dir_fd, buf, sizeof buf)) > 0)
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const dirent64*>(buf + off);
      off += d->d_reclen;
      each(d->d_name, d->d_type, ctx);
    }
}

bool proc_environ_has_no_alloc(const char* pid, const char* entry, std::size_t len) {
  char path[64] = "/proc/";
  std::size_t at = 6;
  for (const char* c = pid; *c && at < 40; ++c) path[at++] = *c;
  std::memcpy(path + at, "/environ", 9);
  ScopedFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  static char buf[65536];
  long matched = 0;  // chars of `entry` matched in this entry; -1: no match
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c == '\0') {
        if (matched == static_cast<long>(len)) return true;
        matched = 0;
      } else if (matched >= 0) {
        matched = static_cast<std::size_t>(matched) < len && entry[matched] == c ? matched + 1 : -1;
      }
    }
  }
  return false;
}

}  // namespace ddprun::base
