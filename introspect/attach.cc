#include "introspect/attach.h"

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <stdexcept>
#include <thread>

#include "base/clock.h"
#include "base/contract.h"
#include "base/safe_file.h"
#include "base/steady_clock.h"
#include "base/subprocess.h"
#include "base/utc_time.h"
#include "introspect/attach_watch.h"
#include "introspect/proc_usage.h"
#include "watchdog/error.h"
#include "watchdog/hang_report.h"
#include "watchdog/heartbeat_server.h"

namespace ddprun::introspect {

namespace {

using Clock = std::chrono::steady_clock;

std::string env_entry(const char* name, const std::string& value) {
  return std::string(name) + "=" + value;
}


std::string step_name(const SlurmStep& s) { return s.job + (s.step.empty() ? "" : "." + s.step); }

// Every process in the trees, parents first.
std::vector<pid_t> all_processes(const std::vector<pid_t>& roots) {
  std::vector<pid_t> out;
  std::set<pid_t> seen;
  for (pid_t r : roots) {
    if (process_gone(r)) continue;
    for (pid_t p : process_tree(r))
      if (seen.insert(p).second) out.push_back(p);
  }
  return out;
}

std::string now_iso() { return base::utc_iso8601(std::chrono::system_clock::now()); }

std::string who(int rank, pid_t pid) {
  return rank >= 0 ? fmt::format("rank {} (pid {})", rank, pid) : fmt::format("pid {}", pid);
}

// Terminates every process of the trees: SIGTERM, then SIGKILL after the grace.
void kill_trees(const AttachOptions& o, std::ostream& out) {
  const auto roots = attach_roots(o);
  auto procs = all_processes(roots);
  out << fmt::format("ddprun attach: sending SIGTERM to {} process{}\n", procs.size(),
                     procs.size() == 1 ? "" : "es")
      << std::flush;
  for (pid_t p : procs) ::kill(p, SIGTERM);
  const auto deadline = Clock::now() + o.kill_grace;
  auto alive = [&] {
    std::vector<pid_t> left;
    for (pid_t p : all_processes(roots)) left.push_back(p);
    for (pid_t p : procs)
      if (!process_gone(p) && std::find(left.begin(), left.end(), p) == left.end()) left.push_back(p);
    return left;
  };
  std::vector<pid_t> left = alive();
  while (!left.empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(o.poll_interval);  // not our children: no wait() to block in
    left = alive();
  }
  if (left.empty()) return;
  out << fmt::format("ddprun attach: {} process{} still there after {:.1f} s: SIGKILL\n",
                     left.size(), left.size() == 1 ? "" : "es", base::in_seconds(o.kill_grace))
      << std::flush;
  for (pid_t p : left) ::kill(p, SIGKILL);
}

watchdog::StackMethod stack_method(const std::string& name) {
  using M = watchdog::StackMethod;
  for (M m : {M::kPythonFaulthandler, M::kPySpy, M::kPyStack, M::kEuStack, M::kGdb, M::kProc})
    if (name == watchdog::to_string(m)) return m;
  return M::kNone;
}

// Each process's stacks as the report's entries: one per method.
void add_stacks(watchdog::HangReport& r, const std::vector<ProcessStacks>& stacks) {
  for (const auto& s : stacks) {
    auto add = [&](const std::string& method, const std::string& text, const std::string& note) {
      watchdog::StackCapture c;
      c.global_rank = s.rank;
      c.pid = s.pid;
      c.method = stack_method(method);
      c.text = text;
      c.note = note;
      r.stacks.push_back(std::move(c));
    };
    if (!s.python.empty() || !s.python_note.empty()) add(s.python_method, s.python, s.python_note);
    if (!s.native.empty() || !s.native_note.empty()) add(s.native_method, s.native, s.native_note);
  }
}

const char* action_name(AttachOnHang a) {
  return a == AttachOnHang::kKill ? "kill" : a == AttachOnHang::kCommand ? "command" : "nothing";
}

// The report of one hang: stacks (the hung rank's first), the culprit rule,
// stdout, then --report-dir. False when the report could not be written
// (said in one line; the hang is still printed and handled).
bool report_hang(const AttachOptions& o, const AttachWatch& watch, const AttachWatch::Hang& hang,
                 const base::SafeDir* dir, std::ostream& out) {
  const auto& e = hang.event;
  watchdog::HangReport report = watch.report(hang);
  report.action = action_name(o.on_hang);
  std::vector<StackTarget> targets;
  if (e.pid) targets.push_back({e.global_rank, e.pid});
  for (const auto& [pid, r] : watch.ranks())
    if (pid != e.pid) targets.push_back({r.rank, pid});
  const auto stacks = collect_stacks(targets, o.stacks);
  add_stacks(report, stacks);
  report.find_culprit();
  const auto now = Clock::now();
  std::string text = fmt::format("ddprun attach: HANG at {}: {}: {}\n", now_iso(),
                                 e.pid ? who(e.global_rank, e.pid) : "the job", e.detail);
  nlohmann::json watched = nlohmann::json::array();
  for (const auto& [pid, r] : watch.ranks()) {
    const double since = base::in_seconds(now - watch.last_progress(r));
    text += fmt::format("  {} {}: state {}, last progress {:.1f} s ago\n", who(r.rank, pid),
                        r.comm, r.state, since);
    watched.push_back({{"rank", r.rank}, {"pid", pid}, {"comm", r.comm},
                       {"state", std::string(1, r.state)}, {"since_progress_s", since}});
  }
  if (report.culprit >= 0 && report.culprit != e.global_rank) {
    text += report.culprit_by_stacks
                ? fmt::format("  culprit: rank {} (its stack is outside any collective; rank(s) "
                              "{} wait inside one)\n",
                              report.culprit, fmt::join(report.in_collective, ","))
                : fmt::format("  culprit: rank {} (behind its peers in steps, or its last "
                              "progress is the oldest)\n",
                              report.culprit);
  }
  text += fmt::format("  action: {}\n", report.action);
  for (const auto& s : stacks) text += to_text(s);
  out << text << std::flush;
  if (!dir) return true;
  // The agent's report (watchdog::HangReport) plus what only attach knows.
  report.extra = {{"source", "attach"},
                  {"attach_kind", hang.attach_kind},
                  {"watched", watched},
                  {"report_after_due_ms", base::in_seconds(Clock::now() - e.due) * 1000}};
  try {
    report.write(*dir);  // whole files or none, never through a symlink (SafeDir)
    return true;
  } catch (const watchdog::WatchdogError& err) {
    out << "ddprun attach: cannot write the hang report in " << o.report_dir << ": "
        << err.what() << "\n" << std::flush;
    return false;
  }
}

}  // namespace

int run_attach(const AttachOptions& o, std::ostream& out) {
  for (pid_t p : o.pids) {
    if (p <= 0 || process_gone(p)) throw std::invalid_argument(fmt::format("no process {}", p));
  }
  if (o.pgid > 0 && group_members(o.pgid).empty()) {
    throw std::invalid_argument(fmt::format("no process in group {}", o.pgid));
  }
  if (o.slurm_step && slurm_step_roots(*o.slurm_step).empty()) {
    throw std::invalid_argument(fmt::format("no process of Slurm step {} on this node",
                                            step_name(*o.slurm_step)));
  }
  if (o.pids.empty() && o.pgid <= 0 && !o.slurm_step)
    throw std::invalid_argument("no process to watch");
  // Opened once, now: a folder attach may not write into (a symlink another
  // user planted, someone else's folder; attach often runs as root) is
  // refused before any watching, and every report goes under this descriptor.
  std::optional<base::SafeDir> report_dir;
  if (!o.report_dir.empty()) {
    try {
      report_dir = base::SafeDir::open(o.report_dir);
    } catch (const base::FileError& e) {
      throw std::invalid_argument(std::string("--report-dir: ") + e.what());
    }
  }
  boost::asio::io_context io;
  base::SteadyClock clock(io);
  std::optional<AttachWatch::Hang> pending;
  bool ended = false;
  AttachWatch watch(
      clock, o,
      [&](const AttachWatch::Hang& h) {
        pending = h;
        io.stop();  // handled off the detectors' call stack, below
      },
      [&] {
        ended = true;
        io.stop();
      });
  std::unique_ptr<watchdog::HeartbeatServer> beats;
  if (!o.heartbeat_socket.empty()) {
    try {
      beats = std::make_unique<watchdog::HeartbeatServer>(
          io, o.heartbeat_socket, [&](const watchdog::Beat& b) { watch.on_beat(b); });
    } catch (const watchdog::WatchdogError& e) {
      throw std::invalid_argument("--heartbeat-socket " + o.heartbeat_socket + ": " + e.what());
    }
  }
  const auto stuck_limit = o.stuck_timeout.value_or(o.silence_timeout);
  std::string what;
  for (pid_t p : o.pids) what += (what.empty() ? "pid " : ", ") + std::to_string(p);
  if (o.pgid > 0) what += (what.empty() ? "" : ", ") + fmt::format("group {}", o.pgid);
  if (o.slurm_step) what += (what.empty() ? "" : ", ") + ("Slurm step " + step_name(*o.slurm_step));
  out << fmt::format("ddprun attach: watching {} (silence {:.1f} s{}{})\n", what,
                     base::in_seconds(o.silence_timeout),
                     stuck_limit.count() > 0 ? fmt::format(", state T/D {:.1f} s", base::in_seconds(stuck_limit)) : "",
                     o.watch_files.empty() ? "" : fmt::format(", {} file(s)", o.watch_files.size()))
      << std::flush;
  bool hung = false, unwritten = false;
  const auto result = [&] { return unwritten ? kAttachReportUnwritten : hung ? kAttachHang : kAttachEnded; };
  watch.start();
  for (;;) {
    if (!pending && !ended) {
      io.restart();
      io.run();  // the detectors' timers and the heartbeat socket, until a hang or the end
    }
    if (pending) {
      const AttachWatch::Hang hang = *pending;
      pending.reset();
      hung = true;
      const bool written = report_hang(o, watch, hang, report_dir ? &*report_dir : nullptr, out);
      if (!written) unwritten = true;
      if (o.on_hang == AttachOnHang::kKill) {
        kill_trees(o, out);
        return result();
      }
      if (o.on_hang == AttachOnHang::kCommand) {
        const std::string report_path =
            report_dir && written ? o.report_dir + "/" + base::kFileHangReportJson : "";
        const auto r = base::run_bounded(
            base::ChildSpec{{"/bin/sh", "-c", o.command},
                            {env_entry(base::kEnvHangRank, std::to_string(hang.event.global_rank)),
                             env_entry(base::kEnvHangPid, std::to_string(hang.event.pid)),
                             env_entry(base::kEnvHangReport, report_path)},
                            -1,
                            false},
            o.command_timeout);
        out << r.output
            << fmt::format("ddprun attach: --on-hang command {}\n",
                           !r.started     ? "could not start: " + r.error
                           : r.timed_out ? fmt::format("killed after {:.0f} s", base::in_seconds(o.command_timeout))
                                         : fmt::format("exited {}", r.exit_code))
            << std::flush;
      }
      if (o.once) return result();
      watch.rearm(hang);
      continue;
    }
    if (ended) {
      out << "ddprun attach: every watched process has ended\n" << std::flush;
      return result();
    }
  }
}

}  // namespace ddprun::introspect
