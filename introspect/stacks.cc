#include "introspect/stacks.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <thread>
#include <cstring>

#include "base/contract.h"
#include "base/procfs.h"
#include "base/system_error.h"
#include "introspect/proc_usage.h"
#include "watchdog/live_stack.h"

namespace ddprun::introspect {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int pystack_signal() { return SIGRTMIN + 6; }

std::string python_dir() {
  return base::installed_or(DDPRUN_INTROSPECT_PYTHON_INSTALL_DIR, "sitecustomize.py",
                            DDPRUN_INTROSPECT_PYTHON_DIR);
}

namespace {

// faulthandler on ddprun's signal, for a process started with ddprun's
// sitecustomize: the cheapest (no ptrace, the interpreter prints its own).
bool faulthandler_stack(pid_t pid, const CollectOptions& o, ProcessStacks& out) {
  auto dump = watchdog::dump_python_stack(pid, o.python_timeout);
  if (!dump.ok) {
    if (dump.instrumented) out.python_note = dump.note;
    return false;
  }
  out.python = std::move(dump.text);
  out.python_method = watchdog::to_string(watchdog::StackMethod::kPythonFaulthandler);
  return true;
}

void python_stack(pid_t pid, int rank, const CollectOptions& o, ProcessStacks& out) {
  if (faulthandler_stack(pid, o, out)) return;
  if (!watchdog::runs_python(pid)) {
    if (out.python_note.empty()) out.python_note = "not a Python process";
    return;
  }
  const auto c = watchdog::capture_python_stack(pid, rank, o.dir, o.native, o.cancel);
  if (c.method != watchdog::StackMethod::kNone) {
    out.python = c.text;
    out.python_method = watchdog::to_string(c.method);
  }
  if (!c.note.empty()) out.python_note += (out.python_note.empty() ? "" : "; ") + c.note;
}

}  // namespace

std::vector<ProcessStacks> collect_stacks(const std::vector<StackTarget>& targets,
                                          const CollectOptions& o) {
  std::vector<ProcessStacks> out;
  for (const auto& t : targets) {
    if (o.cancel && o.cancel->cancelled()) break;
    ProcessStacks s;
    s.rank = t.rank;
    s.pid = t.pid;
    python_stack(t.pid, t.rank, o, s);
    if (o.want_native) {
      const auto c = watchdog::capture_native_stack(t.pid, t.rank, o.dir, o.native, o.cancel);
      s.native = c.text;
      s.native_method = watchdog::to_string(c.method);
      s.native_note = c.note;
    }
    out.push_back(std::move(s));
  }
  return out;
}

nlohmann::json to_json(const ProcessStacks& s) {
  return {{"rank", s.rank},          {"pid", s.pid},
          {"python", s.python},      {"python_method", s.python_method},
          {"python_note", s.python_note},
          {"native", s.native},      {"native_method", s.native_method},
          {"native_note", s.native_note}};
}

ProcessStacks stacks_from_json(const nlohmann::json& j) {
  ProcessStacks s;
  s.rank = j.value("rank", -1);
  s.pid = j.value("pid", 0);
  s.python = j.value("python", "");
  s.python_method = j.value("python_method", "");
  s.python_note = j.value("python_note", "");
  s.native = j.value("native", "");
  s.native_method = j.value("native_method", "");
  s.native_note = j.value("native_note", "");
  return s;
}

std::string to_text(const ProcessStacks& s, const std::string& host) {
  std::string out = fmt::format("=== rank {} (pid {}{}) ===\n", s.rank, s.pid,
                                host.empty() ? "" : ", " + host);
  if (!s.python.empty()) {
    out += "--- Python, every thread (" + s.python_method + ") ---\n" + s.python;
    if (out.back() != '\n') out += '\n';
  } else if (!s.python_note.empty()) {
    out += "--- Python: " + s.python_note + "\n";
  }
  if (!s.native.empty()) {
    out += "--- native (" + s.native_method + ") ---\n" + s.native;
    if (out.back() != '\n') out += '\n';
  }
  if (!s.native_note.empty()) out += "--- native: " + s.native_note + "\n";
  return out;
}

}  // namespace ddprun::introspect
