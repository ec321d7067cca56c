#include "watchdog/stack_capture.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/pidfd.h"
#include "base/scoped_fd.h"
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
// when the deadline passes. Always reaps. Returns true when it exited in
// time, with its wait status in `status`.
bool wait_bounded(pid_t child, std::chrono::milliseconds timeout, int& status) {
  const bool in_time =
      base::wait_exited(child, std::chrono::steady_clock::now() + timeout);
  if (!in_time) ::kill(-child, SIGKILL);
  status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return in_time;
}

// The line of a tool's output that best says why it failed, for a note:
// its own error line ("eu-stack: ...: Operation not permitted"), else the
// last line (gdb ends with "ptrace: Operation not permitted.").
std::string reason_line(const std::string& name, const std::string& text) {
  std::istringstream in(text);
  std::string line, last = "no output";
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) == 0) return line.substr(0, 200);
    if (!line.empty()) last = line.substr(0, 200);
  }
  return last;
}

// Runs one stack tool with stdout+stderr into `path`, bounded by `timeout`.
// Returns true when it printed at least one frame ("#0") in time; else
// `why` says what went wrong. `text` holds what it printed either way.
bool run_tool(const std::string& name, std::vector<std::string> argv_s, const std::string& path,
              std::chrono::milliseconds timeout, std::string& text, std::string& why) {
  text.clear();
  base::ScopedFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out) {
    why = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, out.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group, so a deadline kill takes the tool and anything it ran.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  const int rc = ::posix_spawnp(&child, argv_s[0].c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  out.reset();
  if (rc != 0) {
    why = "cannot run " + argv_s[0] + ": " + std::strerror(rc);
    return false;
  }
  int status = 0;
  const bool in_time = wait_bounded(child, timeout, status);
  text = read_file(path, kMaxTextBytes, false);
  if (!in_time) {
    why = name + " did not finish within " + std::to_string(timeout.count()) + " ms";
    return false;
  }
  // eu-stack exits non-zero when one thread could not be unwound to its
  // end but still prints the others: frames are what count.
  if (text.find("#0") != std::string::npos) {
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      why = name + " printed stacks but reported: " + reason_line(name, text);
    }
    return true;
  }
  why = name + " printed no backtrace: " + reason_line(name, text);
  return false;
}

}  // namespace

const char* to_string(StackMethod method) {
  switch (method) {
    case StackMethod::kPythonFaulthandler: return "python_faulthandler";
    case StackMethod::kEuStack: return "eu-stack";
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
  const std::string pid_s = std::to_string(pid);
  std::vector<std::string> notes;
  std::string failed_output;  // what failed tools printed, kept for the fallback
  auto attempt = [&](const std::string& name, std::vector<std::string> argv) {
    std::string text, why;
    const bool ok = run_tool(name, std::move(argv), c.path, options.tool_timeout, text, why);
    if (!why.empty()) notes.push_back(why);
    if (ok) {
      c.text = std::move(text);
      return true;
    }
    if (!text.empty()) failed_output += "\n--- " + name + " output ---\n" + text;
    return false;
  };
  auto join_notes = [&] {
    std::string n;
    for (const auto& s : notes) n += (n.empty() ? "" : "; ") + s;
    return n;
  };

  if (options.eu_stack.empty()) {
    notes.push_back("eu-stack disabled");
  } else {
    std::vector<std::string> argv = {options.eu_stack, "-p", pid_s};
    if (options.source_lines) {
      argv.push_back("-s");
      argv.push_back("-i");
    }
    if (attempt("eu-stack", argv)) {
      c.method = StackMethod::kEuStack;
      c.note = join_notes();
      return c;
    }
  }

  if (options.gdb.empty()) {
    notes.push_back("gdb disabled");
  } else {
    // -nx and auto-load off: no user or distro scripts run inside the
    // agent's capture; debuginfod off: never wait on the network.
    std::vector<std::string> argv = {options.gdb, "-nx", "-batch", "-iex", "set auto-load off",
                                     "-iex", "set debuginfod enabled off"};
    // --readnever is 3x faster but also drops the unwind tables, so a
    // thread blocked inside libc shows no caller: only on request.
    if (!options.debug_info) argv.push_back("--readnever");
    for (const char* a : {"-p", pid_s.c_str(), "-ex", "thread apply all bt"}) argv.push_back(a);
    if (attempt("gdb", argv)) {
      c.method = StackMethod::kGdb;
      c.note = join_notes();
      return c;
    }
  }

  // Fallback: what the kernel knows, followed by whatever the tools left.
  c.note = join_notes();
  c.text = proc_stack_summary(pid) + failed_output;
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
