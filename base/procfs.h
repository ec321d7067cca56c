// The one reader of /proc and the one folder lister in ddprun: what every
// component asks the kernel about processes (who runs, whose children they
// are, their status, environment and command line), and the entries of a
// folder. Nothing outside base/ calls opendir/readdir; /proc/<pid>/stat is
// parsed by base/proc_stat.h alone.
//
// Processes come and go while they are read: every per-pid reader returns
// nullopt (or an empty list) for a pid that has exited or never existed,
// and the scans skip a process that exits between listing and reading. The
// answers are snapshots, not locks. Thread-safe (no state is kept), but for
// the two no-allocation functions at the end, which share static buffers.
// Files are read with open/read (no iostreams): /proc reports size 0.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/proc_stat.h"

namespace ddprun::base {

// One entry of a folder; `type` is the dirent's d_type (DT_DIR, DT_REG,
// ...), DT_UNKNOWN where the filesystem does not say (then lstat it).
struct DirEntry {
  std::string name;
  unsigned char type = 0;  // DT_UNKNOWN
};

// The entries of folder `path` in the order readdir gives them, without
// "." and "..". Throws SystemError("opendir", path, errno).
std::vector<DirEntry> list_dir(const std::string& path);
// The same; nullopt (and *err = errno when given) when it cannot be opened.
std::optional<std::vector<DirEntry>> try_list_dir(const std::string& path, int* err = nullptr);
// The same, empty when it cannot be opened: for sweeps that skip a folder
// that is not there (or not theirs).
std::vector<DirEntry> list_dir_or_empty(const std::string& path);

// The whole of a (sizeless) file such as /proc/<pid>/io, at most
// kMaxProcFileBytes; nullopt (and *err = errno when given) when it cannot
// be opened or read.
constexpr std::size_t kMaxProcFileBytes = 16 << 20;
std::optional<std::string> read_proc_file(const std::string& path, int* err = nullptr);
// /proc/<pid>/<name>, e.g. read_proc_file(pid, "wchan").
std::optional<std::string> read_proc_file(pid_t pid, std::string_view name);

// The process's main thread is blocked in read(fd, ...): /proc/<pid>/syscall
// names the call by this architecture's number (SYS_read: 0 on x86-64, 63
// on aarch64), then its arguments. False while it runs, waits in any other
// call, or when the file cannot be read (it needs ptrace access).
bool blocked_in_read(pid_t pid, int fd);

// Every process id in /proc, ascending (a listing: some may be gone).
std::vector<pid_t> all_pids();
// The one full scan: the stat of every process that is still there once
// read, ascending by pid.
std::vector<ProcStat> scan_processes();

// The thread ids of `pid` (/proc/<pid>/task), ascending; empty when gone.
std::vector<pid_t> thread_ids(pid_t pid);
// The direct children of `pid`, zombies included, from every thread's
// /proc/<pid>/task/<tid>/children (a kernel without that file: from a
// scan's parent pids). Empty when gone.
std::vector<pid_t> child_pids(pid_t pid);
// The one tree walk: `root` and every descendant, parents before their
// children; just `root` when it has none (or is gone). Bounded (100000).
std::vector<pid_t> process_tree(pid_t root);
// `pid`, its parent, and so on up to (and without) pid 1, from the stat
// files' parent pids; bounded (64 steps), ends early at a gone process.
std::vector<pid_t> ancestry(pid_t pid);

// The text after "<field>:" in /proc/<pid>/status, leading blanks removed
// (e.g. "SigCgt" -> "0000000000004a02"); nullopt when gone or absent.
std::optional<std::string> read_proc_status_field(pid_t pid, std::string_view field);
// True when the process has a handler installed for `sig` (SigCgt).
bool catches_signal(pid_t pid, int sig);
// rchar + wchar of /proc/<pid>/io (every read and write, pipes and sockets
// included); nullopt when unreadable.
std::optional<uint64_t> read_proc_io_bytes(pid_t pid);

// The NUL-separated entries of /proc/<pid>/environ ("KEY=VALUE"), and of
// /proc/<pid>/cmdline (argv); nullopt when unreadable (gone, another
// user's).
std::optional<std::vector<std::string>> read_proc_environ(pid_t pid);
std::optional<std::vector<std::string>> read_proc_cmdline(pid_t pid);
// The target of /proc/<pid>/exe (the program's path); nullopt when
// unreadable (gone, a kernel thread, another user's).
std::optional<std::string> read_proc_exe(pid_t pid);
// Where an installed ddprun keeps its files: `relative` (e.g.
// "share/ddprun/python") below the prefix this program runs from (its own
// path, /proc/self/exe, is <prefix>/bin/<name>), when that folder holds
// `marker`; else `fallback` (the source tree's, for a program run from the
// build tree). How ddprun, train and the watchdog find their Python helpers
// and data, the .deb's, the wheel's and `cmake --install`'s alike.
std::string installed_or(const std::string& relative, const std::string& marker,
                         const std::string& fallback);
// The value of `key` in /proc/<pid>/environ; nullopt when absent or
// unreadable.
std::optional<std::string> proc_environ_value(pid_t pid, std::string_view key);

// For a forked child that may not allocate (the agent's guardian: forked
// from a multi-threaded process, no exec): raw system calls into static
// buffers, so one caller at a time. Calls each(name, d_type, ctx) for every
// entry of the open folder `dir_fd` ("." and ".." included), by getdents64.
void for_each_entry_no_alloc(int dir_fd, void (*each)(const char* name, unsigned char type, void* ctx),
                             void* ctx);
template <typename Each>  // each(const char* name, unsigned char type)
void for_each_entry_no_alloc(int dir_fd, Each& each) {
  for_each_entry_no_alloc(
      dir_fd, [](const char* name, unsigned char type, void* ctx) { (*static_cast<Each*>(ctx))(name, type); },
      &each);
}
// Whether /proc/<pid>/environ (pid as its decimal text) has an entry equal
// to the `len` bytes of `entry` ("KEY=VALUE"); false when unreadable.
bool proc_environ_has_no_alloc(const char* pid, const char* entry, std::size_t len);

}  // namespace ddprun::base
