#include "watchdog/stack_capture.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "watchdog/proc.h"

extern char** environ;

namespace ddprun::watchdog {

namespace {

constexpr std::size_t kMaxTextBytes = 64 * 1024;

std::string read_file(const std::string& path, std::size_t max_bytes, bool tail) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(std::max<std::streamoff>(0, in.tellg()));
  const std::size_t start = tail && size > max_bytes ? size - max_bytes : 0;
  in.seekg(static_cast<std::streamoff>(start));
  std::string out(std::min(size - start, max_bytes), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<std::size_t>(in.gcount()));
  return out;
}

// NUL-separated /proc file as a vector of strings.
std::vector<std::string> read_nul_list(const std::string& path) {
  std::vector<std::string> out;
  // /proc files report size 0: read them as a stream.
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  std::size_t start = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] == '\0') {
      out.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// Waits for `child` to exit, at most `timeout`; kills its process group
// when the deadline passes. Always reaps. Returns true when it exited in time.
bool wait_bounded(pid_t child, std::chrono::milliseconds timeout) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  bool in_time = false;
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
      if (rc > 0) {
        in_time = true;
        break;
      }
      if (rc < 0 && errno != EINTR) break;
      if (rc == 0) break;
    }
    ::close(pidfd);
  }
  if (!in_time) ::kill(-child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return in_time;
}

}  // namespace

const char* to_string(StackMethod method) {
  switch (method) {
    case StackMethod::kPythonFaulthandler: return "python_faulthandler";
    case StackMethod::kGdb: return "gdb";
    case StackMethod::kProc: return "proc";
    case StackMethod::kNone: return "none";
  }
  return "none";
}

bool python_faulthandler_enabled(pid_t pid) {
  if (!is_python_process(pid)) return false;
  const std::string base = "/proc/" + std::to_string(pid);
  for (const auto& kv : read_nul_list(base + "/environ")) {
    // Python enables faulthandler for any non-empty PYTHONFAULTHANDLER.
    if (kv.rfind("PYTHONFAULTHANDLER=", 0) == 0 && kv.size() > 19) return true;
  }
  const auto args = read_nul_list(base + "/cmdline");
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "-X" && args[i + 1] == "faulthandler") return true;
  }
  return false;
}

StackCapture capture_native_stack(pid_t pid, int global_rank, const std::string& dir,
                                  const StackCaptureOptions& options) {
  StackCapture c;
  c.pid = pid;
  c.global_rank = global_rank;
  c.path = dir + "/stack_rank" + std::to_string(global_rank) + ".txt";
  if (!options.gdb.empty()) {
    const int out = ::open(c.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
      c.note = "cannot write " + c.path + ": " + std::strerror(errno);
      return c;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out, 1);
    posix_spawn_file_actions_adddup2(&fa, out, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Own process group, so a deadline kill takes gdb and anything it ran.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const std::string pid_s = std::to_string(pid);
    // -nx and auto-load off: no user or distro scripts run inside the
    // agent's capture; debuginfod off: never wait on the network.
    std::vector<std::string> argv_s = {options.gdb, "-nx", "-batch", "-iex", "set auto-load off",
                                       "-iex", "set debuginfod enabled off"};
    // --readnever is 3x faster but also drops the unwind tables, so a
    // thread blocked inside libc shows no caller: only on request.
    if (!options.debug_info) argv_s.push_back("--readnever");
    for (const char* a : {"-p", pid_s.c_str(), "-ex", "thread apply all bt"}) argv_s.push_back(a);
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t child = 0;
    const int rc = ::posix_spawnp(&child, options.gdb.c_str(), &fa, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(out);
    if (rc == 0) {
      const bool in_time = wait_bounded(child, options.gdb_timeout);
      c.text = read_file(c.path, kMaxTextBytes, false);
      if (in_time && c.text.find("#0") != std::string::npos) {
        c.method = StackMethod::kGdb;
        return c;
      }
      c.note = in_time ? "gdb printed no backtrace"
                       : "gdb did not finish within " +
                             std::to_string(options.gdb_timeout.count()) + " ms";
    } else {
      c.note = "cannot run " + options.gdb + ": " + std::strerror(rc);
    }
  } else {
    c.note = "gdb disabled";
  }
  // Fallback: what the kernel knows, appended after whatever gdb left.
  c.text = proc_stack_summary(pid) + (c.text.empty() ? "" : "\n--- gdb output ---\n" + c.text);
  std::ofstream(c.path, std::ios::trunc) << c.text;
  c.method = StackMethod::kProc;
  return c;
}

std::string extract_python_traceback(const std::string& log_path, std::size_t max_bytes) {
  const std::string text = read_file(log_path, max_bytes, true);
  const auto at = text.rfind("Fatal Python error");
  if (at == std::string::npos) return {};
  return text.substr(at, kMaxTextBytes);
}

}  // namespace ddprun::watchdog
