#include "watchdog/stack_capture.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/contract.h"
#include "base/pidfd.h"
#include "base/procfs.h"
#include "base/safe_file.h"
#include "base/scoped_fd.h"
#include "base/subprocess.h"
#include "watchdog/proc.h"

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

// The executable `name` names in `first_dir` (empty: our own executable's
// folder), else on our PATH (base/subprocess.h); empty when neither has it.
std::string find_program(const std::string& name, std::string first_dir) {
  if (first_dir.empty()) {
    const auto exe = base::read_proc_exe(::getpid());
    if (exe) first_dir = exe->substr(0, exe->rfind('/'));
  }
  if (!first_dir.empty() && name.find('/') == std::string::npos) {
    const std::string beside = first_dir + "/" + name;
    if (!base::find_program(beside, "").empty()) return beside;  // a path: checked as is
  }
  const char* path = std::getenv("PATH");
  return base::find_program(name, path ? path : "");
}

// Waits for `child` to exit, at most `timeout`, or until `cancel` ends the
// capture; kills its process group otherwise. Always reaps. Returns true
// when it exited by itself in time, with its wait status in `status`.
bool wait_bounded(pid_t child, std::chrono::milliseconds timeout, CaptureCancel* cancel,
                  int& status) {
  bool in_time = false;
  if (!cancel || cancel->start(child)) {
    in_time = base::wait_exited(child, std::chrono::steady_clock::now() + timeout);
  }
  // The group is killed before the child is reaped, so its id is not reused.
  if (cancel) cancel->finish();
  if (!in_time || (cancel && cancel->cancelled())) {
    ::kill(-child, SIGKILL);
    in_time = false;
  }
  base::reap_child(child, /*quiet_exit=*/true, &status);  // exited, or its group just killed
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
// Returns true when it printed `marker` (a frame: "#0" for the native
// tools) in time; else `why` says what went wrong. `text` holds what it
// printed either way.
bool run_tool(const std::string& name, std::vector<std::string> argv_s, const std::string& path,
              std::chrono::milliseconds timeout, CaptureCancel* cancel, std::string& text,
              std::string& why, const std::string& marker = "#0") {
  text.clear();
  // Through SafeDir (base/safe_file.h): the agent often runs as root with a
  // log folder that others can write, so neither the path nor the file may
  // be a symlink someone planted.
  base::ScopedFd out;
  try {
    const auto slash = path.rfind('/');
    const auto dir = base::SafeDir::open(slash == std::string::npos ? "." : path.substr(0, slash));
    out = dir.open_truncate(path.substr(slash == std::string::npos ? 0 : slash + 1));
  } catch (const base::FileError& e) {
    why = std::string("cannot write stacks: ") + e.what();
    return false;
  }
  // A quiet child (base/subprocess.h): no SIGCHLD, so the agent's reaper
  // (waitpid(-1), on the loop thread) never takes its status from this
  // thread, which reaps it.
  std::string error;
  const pid_t child =
      base::start_child(base::ChildSpec{std::move(argv_s), {}, out.get(), /*quiet_exit=*/true}, &error);
  out.reset();
  if (child < 0) {
    why = "cannot run " + error;
    return false;
  }
  int status = 0;
  const bool in_time = wait_bounded(child, timeout, cancel, status);
  text = read_file(path, kMaxTextBytes, false);
  if (cancel && cancel->cancelled()) {
    why = name + " stopped: the attempt ended before the capture";
    return false;
  }
  if (!in_time) {
    why = name + " did not finish within " + std::to_string(timeout.count()) + " ms";
    return false;
  }
  // eu-stack exits non-zero when one thread could not be unwound to its
  // end but still prints the others: frames are what count.
  if (text.find(marker) != std::string::npos) {
    const auto end = base::termination(status);
    if (!(end && end->success())) {
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
    case StackMethod::kPySpy: return "py-spy";
    case StackMethod::kPyStack: return "pystack";  // the tool: not-a-contract-name
    case StackMethod::kEuStack: return "eu-stack";
    case StackMethod::kGdb: return "gdb";
    case StackMethod::kProc: return "proc";
    case StackMethod::kNone: return "none";
  }
  return "none";
}

namespace {

// True when the interpreter's options (the arguments before the script,
// -c or -m) include -I or -E, alone or grouped ("-Iu"): it then ignores
// every PYTHON* variable of its environment.
bool ignores_python_env(const std::vector<std::string>& args) {
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-' || a == "--" || a.rfind("--", 0) == 0) return false;
    for (std::size_t k = 1; k < a.size(); ++k) {
      if (a[k] == 'I' || a[k] == 'E') return true;
      if (a[k] == 'c' || a[k] == 'm') return false;  // the rest is the command
      if (a[k] == 'X' || a[k] == 'W') {              // takes a value
        if (k + 1 == a.size()) ++i;
        break;
      }
    }
  }
  return false;
}

}  // namespace

bool runs_python(pid_t pid) {
  if (is_python_process(pid)) return true;
  const auto maps = base::read_proc_file(pid, "maps");
  return maps && maps->find("/libpython") != std::string::npos;
}

bool python_faulthandler_enabled(pid_t pid) {
  if (!is_python_process(pid)) return false;
  const std::vector<std::string> none;
  const auto args = base::read_proc_cmdline(pid).value_or(none);
  for (const auto& kv : ignores_python_env(args) ? none : base::read_proc_environ(pid).value_or(none)) {
    // Python enables faulthandler for any non-empty PYTHONFAULTHANDLER.
    const std::string name = std::string(base::kEnvPythonFaultHandler) + "=";
    if (kv.rfind(name, 0) == 0 && kv.size() > name.size()) return true;
  }
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "-X" && args[i + 1] == "faulthandler") return true;
  }
  return false;
}

void CaptureCancel::cancel() {
  base::MutexLock lock(mu_);
  cancelled_ = true;
  if (running_ > 0) ::kill(-running_, SIGKILL);
}

bool CaptureCancel::start(pid_t pgid) {
  base::MutexLock lock(mu_);
  running_ = pgid;
  return !cancelled_;
}

void CaptureCancel::finish() {
  base::MutexLock lock(mu_);
  running_ = 0;
}

namespace {

// A capture of `pid` (rank `global_rank`) to be saved in `dir` as
// stack_rank<R><suffix>.txt.
StackCapture capture_for(pid_t pid, int global_rank, const std::string& dir, const char* suffix) {
  StackCapture c;
  c.pid = pid;
  c.global_rank = global_rank;
  c.path = dir + "/" + base::kFileStackPrefix + std::to_string(global_rank) + suffix + ".txt";
  return c;
}

}  // namespace

StackCapture capture_native_stack(pid_t pid, int global_rank, const std::string& dir,
                                  const StackCaptureOptions& options, CaptureCancel* cancel) {
  StackCapture c = capture_for(pid, global_rank, dir, "");
  const std::string pid_s = std::to_string(pid);
  std::vector<std::string> notes;
  std::string failed_output;  // what failed tools printed, kept for the fallback
  auto attempt = [&](const std::string& name, std::vector<std::string> argv) {
    std::string text, why;
    if (cancel && cancel->cancelled()) return false;
    const bool ok =
        run_tool(name, std::move(argv), c.path, options.tool_timeout, cancel, text, why);
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
    // --readnever is faster but also drops the unwind tables, so a
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
  try {
    base::write_file_atomically(c.path, c.text, false);
  } catch (const base::FileError& e) {
    c.note += (c.note.empty() ? "" : "; ") + std::string("cannot write stacks: ") + e.what();
  }
  c.method = StackMethod::kProc;
  return c;
}

StackCapture capture_python_stack(pid_t pid, int global_rank, const std::string& dir,
                                  const StackCaptureOptions& options, CaptureCancel* cancel) {
  StackCapture c = capture_for(pid, global_rank, dir, "_python");
  const std::string pid_s = std::to_string(pid);
  struct Tool {
    const std::string& program;
    StackMethod method;
    std::vector<std::string> args;
    const char* marker;  // printed once per thread with frames
  };
  // py-spy first: one static binary, and it pauses the target only while
  // it copies the frames. pystack (a Python program) starts slower.
  const Tool tools[] = {
      {options.py_spy, StackMethod::kPySpy, {"dump", "--pid", pid_s}, "Thread "},
      {options.pystack, StackMethod::kPyStack, {"remote", pid_s}, "Traceback for thread"}};
  std::vector<std::string> notes;
  int missing = 0;
  for (const auto& t : tools) {
    if (t.program.empty() || (cancel && cancel->cancelled())) continue;
    // The path found, not the name: start_child would search PATH alone.
    std::vector<std::string> argv = {find_program(t.program, options.python_tools_dir)};
    if (argv[0].empty()) {
      ++missing;
      continue;
    }
    argv.insert(argv.end(), t.args.begin(), t.args.end());
    std::string text, why;
    const bool ok = run_tool(to_string(t.method), std::move(argv), c.path, options.tool_timeout,
                             cancel, text, why, t.marker);
    if (!why.empty()) notes.push_back(why);
    if (ok) {
      c.method = t.method;
      c.text = std::move(text);
      break;
    }
  }
  if (c.method == StackMethod::kNone && missing == 2) {
    notes.push_back(std::string("neither py-spy nor pystack is installed (") +
                    kPythonStackInstall + ")");
  }
  for (const auto& n : notes) c.note += (c.note.empty() ? "" : "; ") + n;
  if (c.method == StackMethod::kNone) c.path.clear();
  return c;
}

std::string extract_python_traceback(const std::string& log_path, std::size_t max_bytes) {
  const std::string text = read_file(log_path, max_bytes, true);
  const auto at = text.rfind("Fatal Python error");
  if (at == std::string::npos) return {};
  return text.substr(at, kMaxTextBytes);
}

}  // namespace ddprun::watchdog
