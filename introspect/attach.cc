#include "introspect/attach.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <stdexcept>
#include <thread>

#include <sys/socket.h>
#include <sys/un.h>

#include "base/contract.h"
#include "base/proc_stat.h"
#include "base/safe_file.h"
#include "base/scoped_fd.h"
#include "watchdog/hang_report.h"
#include "watchdog/heartbeat_server.h"
#include "introspect/proc_usage.h"
#include "introspect/tool.h"

namespace ddprun::introspect {

namespace {

using Clock = std::chrono::steady_clock;

std::string env_entry(const char* name, const std::string& value) {
  return std::string(name) + "=" + value;
}

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Watched {
  pid_t pid = 0;
  int rank = -1;
  std::string comm;
  uint64_t ticks = 0;
  std::optional<uint64_t> io;
  char state = '?';
  Clock::time_point last_progress;
  std::optional<Clock::time_point> stuck_since;
  bool reported = false;
};

struct Hang {
  pid_t pid = 0;
  int rank = -1;
  std::string kind;
  std::string detail;
  Clock::time_point due;
  Clock::time_point detected;
  std::chrono::milliseconds timeout{0};
};

std::string step_name(const SlurmStep& s) { return s.job + (s.step.empty() ? "" : "." + s.step); }

std::vector<pid_t> roots_of(const AttachOptions& o) {
  std::vector<pid_t> roots = o.pids;
  if (o.pgid > 0)
    for (pid_t p : group_members(o.pgid)) roots.push_back(p);
  if (o.slurm_step)
    for (pid_t p : slurm_step_roots(*o.slurm_step)) roots.push_back(p);
  return roots;
}

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

struct FileWatch {
  std::string path;
  off_t size = -1;
  timespec mtime{};
  Clock::time_point last_change;
  bool reported = false;
};

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string who(int rank, pid_t pid) {
  return rank >= 0 ? fmt::format("rank {} (pid {})", rank, pid) : fmt::format("pid {}", pid);
}

// Terminates every process of the trees: SIGTERM, then SIGKILL after the grace.
void kill_trees(const AttachOptions& o, std::ostream& out) {
  const auto roots = roots_of(o);
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
                     left.size(), left.size() == 1 ? "" : "es", secs(o.kill_grace))
      << std::flush;
  for (pid_t p : left) ::kill(p, SIGKILL);
}

// The heartbeat socket: bound at start, unlinked at the end.
class BeatSocket {
 public:
  explicit BeatSocket(const std::string& path) : path_(path) {
    if (path.empty()) return;
    sockaddr_un a{};
    if (path.size() >= sizeof a.sun_path) {
      throw std::invalid_argument("--heartbeat-socket " + path + ": too long for AF_UNIX");
    }
    fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    ::unlink(path.c_str());
    if (!fd_ || ::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      throw std::invalid_argument("--heartbeat-socket " + path + ": " + std::strerror(errno));
    }
    bound_ = true;
  }
  ~BeatSocket() {
    if (bound_) ::unlink(path_.c_str());
  }
  // Every beat queued since the last call.
  std::vector<watchdog::Beat> drain() {
    std::vector<watchdog::Beat> out;
    char buf[256];
    for (int i = 0; fd_ && i < 100000; ++i) {
      const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n < 0) break;  // EAGAIN: nothing more queued
      if (auto b = watchdog::parse_beat(std::string_view(buf, static_cast<std::size_t>(n)))) {
        out.push_back(*b);
      }
    }
    return out;
  }

 private:
  std::string path_;
  base::ScopedFd fd_;
  bool bound_ = false;
};

struct RankBeat {
  Clock::time_point last;
  int64_t step = -1;
  bool reported = false;
};

// attach's rule names in the agent's vocabulary (watchdog::HangKind), so
// both reports share one schema (docs/hang_report.schema.json): no CPU and
// no I/O, and a log that stopped changing, are attach's silence.
watchdog::HangKind hang_kind(const std::string& kind) {
  if (kind == "heartbeat_timeout") return watchdog::HangKind::kHeartbeat;
  if (kind == "process_stopped") return watchdog::HangKind::kStopped;
  if (kind == "uninterruptible_sleep") return watchdog::HangKind::kUninterruptible;
  return watchdog::HangKind::kSilence;
}

watchdog::StackMethod stack_method(const std::string& name) {
  using M = watchdog::StackMethod;
  for (M m : {M::kPythonFaulthandler, M::kPySpy, M::kPyStack, M::kEuStack, M::kGdb, M::kProc})
    if (name == watchdog::to_string(m)) return m;
  return M::kNone;
}

// The hang as watchdog/'s HangReport: the same JSON as the agent's report,
// and its culprit rule (a rank outside every collective while others wait
// inside one stopped first) applied to the stacks.
watchdog::HangReport make_report(const Hang& hang, const std::map<pid_t, Watched>& watched,
                                 const std::map<int, RankBeat>& beats,
                                 const std::vector<ProcessStacks>& stacks, const char* action) {
  watchdog::HangReport r;
  r.event.kind = hang_kind(hang.kind);
  r.event.global_rank = hang.rank;
  r.event.pid = hang.pid;
  r.event.timeout = std::chrono::duration_cast<watchdog::Millis>(hang.timeout);
  r.event.due = hang.due;
  r.event.detected = hang.detected;
  r.event.detail = hang.detail;
  if (hang.rank >= 0) r.stalled = {hang.rank};
  r.culprit = hang.rank;
  r.action = action;
  for (const auto& [pid, w] : watched) {
    watchdog::WorkerStatus ws;
    ws.global_rank = w.rank;
    ws.local_rank = -1;  // not known from outside
    ws.pid = pid;
    ws.last_output = w.last_progress;  // the last CPU or I/O progress
    ws.proc_state = w.state;
    if (auto it = beats.find(w.rank); it != beats.end()) {
      ws.beats = 1;  // heard from (attach counts no beats)
      ws.last_beat = it->second.last;
      ws.last_beat_wall = std::chrono::system_clock::now() -
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              Clock::now() - it->second.last);
      ws.step = ws.max_step = it->second.step;
    }
    r.workers.push_back(ws);
  }
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
  r.find_culprit();
  return r;
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
  const auto stuck_limit = o.stuck_timeout.value_or(o.silence_timeout);
  std::map<pid_t, Watched> watched;
  std::vector<FileWatch> files;
  for (const auto& f : o.watch_files) files.push_back({f, -1, {}, Clock::now(), false});
  bool hung = false;
  BeatSocket beat_socket(o.heartbeat_socket);
  std::map<int, RankBeat> beats;
  out << fmt::format("ddprun attach: watching {} (silence {:.1f} s{}{})\n",
                     [&] {
                       std::string s;
                       for (pid_t p : o.pids) s += (s.empty() ? "pid " : ", ") + std::to_string(p);
                       if (o.pgid > 0) s += (s.empty() ? "" : ", ") + fmt::format("group {}", o.pgid);
                       if (o.slurm_step)
                         s += (s.empty() ? "" : ", ") + ("Slurm step " + step_name(*o.slurm_step));
                       return s;
                     }(),
                     secs(o.silence_timeout),
                     stuck_limit.count() > 0 ? fmt::format(", state T/D {:.1f} s", secs(stuck_limit)) : "",
                     files.empty() ? "" : fmt::format(", {} file(s)", files.size()))
      << std::flush;
  for (;;) {
    const auto now = Clock::now();
    const auto roots = roots_of(o);
    const auto ranks = find_ranks(roots);
    for (auto it = watched.begin(); it != watched.end();) {
      it = ranks.count(it->first) ? std::next(it) : watched.erase(it);
    }
    if (ranks.empty()) {
      out << "ddprun attach: every watched process has ended\n" << std::flush;
      return hung ? 1 : 0;
    }
    std::optional<Hang> hang;
    for (const auto& [pid, rank] : ranks) {
      const auto u = read_proc_usage(pid);
      if (!u) continue;
      auto [it, fresh] = watched.try_emplace(pid);
      Watched& w = it->second;
      if (fresh) {
        w.pid = pid;
        w.rank = rank;
        w.last_progress = now;
        w.ticks = u->cpu_ticks;
        w.io = u->io_bytes;
        if (auto st = base::read_proc_stat(pid)) w.comm = st->comm;
      }
      if (u->cpu_ticks != w.ticks || u->io_bytes != w.io) {
        w.last_progress = now;
        w.reported = false;
      }
      w.ticks = u->cpu_ticks;
      w.io = u->io_bytes;
      w.state = u->state;
      const bool stuck = u->state == 'T' || u->state == 't' || u->state == 'D';
      if (!stuck) w.stuck_since.reset();
      if (stuck && !w.stuck_since) w.stuck_since = now;
      if (w.reported || hang) continue;
      if (now - w.last_progress >= o.silence_timeout) {
        hang = Hang{pid, rank, "no_progress",
                    fmt::format("no CPU time and no I/O for {:.1f} s (state {})",
                                secs(now - w.last_progress), u->state),
                    w.last_progress + o.silence_timeout, now, o.silence_timeout};
      } else if (w.stuck_since && stuck_limit.count() > 0 && now - *w.stuck_since >= stuck_limit) {
        hang = Hang{pid, rank, u->state == 'D' ? "uninterruptible_sleep" : "process_stopped",
                    fmt::format("process state {} for {:.1f} s", u->state, secs(now - *w.stuck_since)),
                    *w.stuck_since + stuck_limit, now, stuck_limit};
      }
    }
    for (const auto& b : beat_socket.drain()) {
      RankBeat& rb = beats[static_cast<int>(b.global_rank)];
      rb.last = now;
      rb.step = b.step;
      rb.reported = false;
    }
    for (const auto& [pid, w] : watched) {
      auto it = beats.find(w.rank);
      if (hang || w.rank < 0 || it == beats.end() || it->second.reported) continue;
      if (now - it->second.last >= o.heartbeat_timeout) {
        hang = Hang{pid, w.rank, "heartbeat_timeout",
                    fmt::format("no heartbeat for {:.1f} s (last step {})",
                                secs(now - it->second.last), it->second.step),
                    it->second.last + o.heartbeat_timeout, now, o.heartbeat_timeout};
        it->second.reported = true;
      }
    }
    for (auto& f : files) {
      struct stat st{};
      const bool exists = ::stat(f.path.c_str(), &st) == 0;
      const off_t size = exists ? st.st_size : -1;
      if (size != f.size || st.st_mtim.tv_sec != f.mtime.tv_sec ||
          st.st_mtim.tv_nsec != f.mtime.tv_nsec) {
        f.size = size;
        f.mtime = st.st_mtim;
        f.last_change = now;
        f.reported = false;
      }
      if (!hang && !f.reported && now - f.last_change >= o.silence_timeout) {
        hang = Hang{0, -1, "watch_file",
                    fmt::format("{} has not changed for {:.1f} s", f.path, secs(now - f.last_change)),
                    f.last_change + o.silence_timeout, now, o.silence_timeout};
        f.reported = true;
      }
    }
    if (hang) {
      hung = true;
      if (hang->pid) watched[hang->pid].reported = true;
      // The hung rank's stacks first, then the others'.
      std::vector<StackTarget> targets;
      if (hang->pid) targets.push_back({hang->rank, hang->pid});
      for (const auto& [pid, w] : watched)
        if (pid != hang->pid) targets.push_back({w.rank, pid});
      const auto stacks = collect_stacks(targets, o.stacks);
      std::string text = fmt::format("ddprun attach: HANG at {}: {}: {}\n", now_iso(),
                                     hang->pid ? who(hang->rank, hang->pid) : "the job",
                                     hang->detail);
      nlohmann::json watched_json = nlohmann::json::array();
      for (const auto& [pid, w] : watched) {
        text += fmt::format("  {} {}: state {}, last progress {:.1f} s ago\n", who(w.rank, pid),
                            w.comm, w.state, secs(now - w.last_progress));
        watched_json.push_back({{"rank", w.rank}, {"pid", pid}, {"comm", w.comm},
                                {"state", std::string(1, w.state)},
                                {"since_progress_s", secs(now - w.last_progress)}});
      }
      const char* action = o.on_hang == OnHang::kKill      ? "kill"
                            : o.on_hang == OnHang::kCommand ? "command"
                                                            : "nothing";
      const auto hang_report = make_report(*hang, watched, beats, stacks, action);
      if (hang_report.stack_culprit >= 0 && hang_report.culprit != hang->rank) {
        text += fmt::format("  culprit: rank {} (its stack is outside any collective; rank(s) "
                            "{} wait inside one)\n",
                            hang_report.culprit, fmt::join(hang_report.in_collective, ","));
      }
      text += fmt::format("  action: {}\n", action);
      for (const auto& s : stacks) text += to_text(s);
      // The agent's report (watchdog::HangReport) plus what only attach knows.
      nlohmann::json report = hang_report.to_json();
      report["source"] = "attach";
      report["attach_kind"] = hang->kind;
      report["watched"] = watched_json;
      report["report_after_due_ms"] = secs(Clock::now() - hang->due) * 1000;
      std::string report_path;
      if (!o.report_dir.empty()) {
        report_path = o.report_dir + "/" + base::kFileHangReportJson;
        // SafeDir: `attach` often runs as root, the folder may be shared.
        try {
          const auto dir = base::SafeDir::open(o.report_dir, true);
          dir.write_atomically(base::kFileHangReportText, text, false);
          dir.write_atomically(base::kFileHangReportJson,
                               report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                                   "\n",
                               false);
        } catch (const base::FileError& e) {
          out << "ddprun attach: cannot write the hang report in " << o.report_dir << ": "
              << e.what() << "\n";
          report_path.clear();  // --on-hang command gets no path to a missing file
        }
      }
      out << text << std::flush;
      if (o.on_hang == OnHang::kKill) {
        kill_trees(o, out);
        return 1;
      }
      if (o.on_hang == OnHang::kCommand) {
        const auto r = run_tool({"/bin/sh", "-c", o.command}, o.command_timeout, 64 * 1024,
                                {env_entry(base::kEnvHangRank, std::to_string(hang->rank)),
                                 env_entry(base::kEnvHangPid, std::to_string(hang->pid)),
                                 env_entry(base::kEnvHangReport, report_path)});
        out << r.output
            << fmt::format("ddprun attach: --on-hang command {}\n",
                           !r.started     ? "could not start: " + r.error
                           : r.timed_out ? fmt::format("killed after {:.0f} s", secs(o.command_timeout))
                                         : fmt::format("exited {}", r.exit_code))
            << std::flush;
      }
      if (o.once) return 1;
    }
    std::this_thread::sleep_for(o.poll_interval);  // the sampling period itself
  }
}

}  // namespace ddprun::introspect
