// WatchdogHook's side of a hang (agent_hook.h): the stacks, on a capture
// thread; the report, written off the loop; and the verdict to the attempt
// (fail it, replace the culprit, or only report).
#include <signal.h>
#include <sys/resource.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstdlib>

#include "base/contract.h"
#include "base/procfs.h"
#include "base/system_error.h"
#include "watchdog/agent_hook.h"
#include "watchdog/live_stack.h"

namespace ddprun::watchdog {

namespace {

// A capture tool that outlives its cancel by this much is left behind.
constexpr std::chrono::seconds kCaptureJoinDeadline{10};
// How long a worker gets to dump its own Python stack on ddprun's signal.
constexpr std::chrono::milliseconds kLiveDumpTimeout{2000};

bool has_stack(const HangReport& report, int rank) {
  return std::any_of(report.stacks.begin(), report.stacks.end(), [&](const StackCapture& c) {
    return c.global_rank == rank && !c.text.empty();
  });
}

// The report's entry for a traceback `w` prints itself into its stderr log
// on SIGABRT (faulthandler).
StackCapture faulthandler_entry(const agent::WorkerInfo& w) {
  StackCapture c;
  c.global_rank = w.rank;
  c.pid = w.pid;
  c.method = StackMethod::kPythonFaulthandler;
  c.path = w.stderr_log;
  if (c.path.empty()) c.note = "traceback printed to the console (no --log-dir)";
  return c;
}

}  // namespace

void WatchdogHook::no_core_dumps(pid_t pid) const {
  // faulthandler prints the traceback, then re-raises SIGABRT: under
  // `ulimit -c unlimited` that would leave a core the size of the process
  // in the user's folder.
  const rlimit none{0, 0};
  if (::prlimit(pid, RLIMIT_CORE, &none, nullptr) != 0) {
    spdlog::warn("cannot set the core limit of pid {} to 0 before SIGABRT: {}", pid,
                 base::errno_text(errno));
  }
}

void WatchdogHook::on_hang(const HangEvent& event) {
  if (!defer_hang(event)) act_on_hang(event);
}

std::vector<int> WatchdogHook::ranks_to_capture() const {
  // The stalled ranks and the suspects, the event's rank first. When no
  // rank is behind in steps, the other live ranks too: the rank that
  // stopped first may still be inside its deadline while the first rank
  // past it waits for it in a collective (HangReport::find_culprit tells
  // which).
  std::vector<int> ranks = report_->stalled;
  for (int r : report_->suspects) {
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  }
  bool same_step = true;  // no live rank is behind another
  for (const auto& a : report_->workers)
    for (const auto& b : report_->workers)
      if (!a.exited && !b.exited && a.step != b.step) same_step = false;
  if (same_step) {
    for (const auto& w : report_->workers) {
      if (!w.exited && std::find(ranks.begin(), ranks.end(), w.global_rank) == ranks.end())
        ranks.push_back(w.global_rank);
    }
  }
  return ranks;
}

void WatchdogHook::act_on_hang(const HangEvent& event) {
  // Before the stack capture (seconds): nodes holding a stall of theirs
  // wait for this node's generation instead of acting after kAskPeers.
  if (replaces_culprit()) say_blamed(dog_->culprit(event));
  report_ = make_hang_report(*dog_, event, attempt_);
  report_->action = to_string(options_.on_hang);
  take_evidence(*report_);
  hang_event_ = event;
  const bool report_only = options_.on_hang == OnHang::kReport;
  abort_targets_.clear();  // local ranks that print their own traceback
  std::vector<std::pair<pid_t, int>> natives;  // (pid, global rank) for a tool
  int captures_left = options_.max_native_captures;
  std::vector<std::pair<pid_t, int>> live;  // Python workers that dump their own stacks
  for (int rank : ranks_to_capture()) {
    auto it = std::find_if(info_.workers.begin(), info_.workers.end(),
                           [&](const auto& w) { return w.rank == rank; });
    // Not a worker here, or the evidence already holds its stack, dumped live.
    if (it == info_.workers.end() || has_stack(*report_, rank)) continue;
    // ddprun's sitecustomize dumps it live on a signal, without stopping the
    // worker or printing on the console (live_stack.h): before the headline,
    // so the stacks can name the culprit.
    if (const auto sig = options_.live_stacks ? base::proc_environ_value(it->pid, base::kEnvPyStackSignal)
                                              : std::nullopt;
        sig && base::catches_signal(it->pid, std::atoi(sig->c_str()))) {
      live.emplace_back(it->pid, rank);
      continue;
    }
    // --on-hang=report: SIGABRT would end the worker; native stacks only.
    // Rank scope: so it would the survivors; the culprit's comes in
    // finish_hang, once the stacks have named it.
    if (!report_only && !replaces_culprit() && python_faulthandler_enabled(it->pid)) {
      report_->stacks.push_back(faulthandler_entry(*it));
      abort_targets_.push_back(it->local_rank);
    } else if (captures_left-- > 0) {
      natives.emplace_back(it->pid, rank);
    }
  }
  if (natives.empty() && live.empty()) return finish_hang();
  start_capture(std::move(natives), std::move(live));
}

void WatchdogHook::start_capture(std::vector<std::pair<pid_t, int>> natives,
                                 std::vector<std::pair<pid_t, int>> live) {
  // A capture tool may take seconds (gdb on a LibTorch process, a slow
  // ptrace): it runs on a thread of its own and posts the stacks back, so
  // the loop goes on handling signals, exits and output meanwhile.
  if (!natives.empty()) spdlog::info("capturing the stacks of {} hung rank(s)", natives.size());
  join_capture();
  capture_cancel_ = std::make_shared<CaptureCancel>();
  // The work holds only copies (base/off_loop_task.h): it may be left
  // running, past join_capture's deadline, without touching this hook.
  auto captured = std::make_shared<std::vector<StackCapture>>();
  capture_.start(
      [natives = std::move(natives), live = std::move(live), dir = attempt_dir_,
       stacks = options_.stacks, cancel = capture_cancel_, captured](const base::OffLoopTask::Token&) {
        for (const auto& [pid, rank] : live) {
          if (cancel->cancelled()) break;
          auto dump = dump_python_stack(pid, kLiveDumpTimeout);
          if (dump.ok) {
            StackCapture c;
            c.global_rank = rank;
            c.pid = pid;
            c.method = StackMethod::kPythonFaulthandler;
            c.text = std::move(dump.text);
            c.note = "dumped live by the worker (ddprun's stack signal)";
            captured->push_back(std::move(c));
            continue;
          }
          // No live dump: its frames read from outside, as for a worker
          // without the bootstrap.
          captured->push_back(capture_python_stack(pid, rank, dir, stacks, cancel.get()));
          captured->push_back(capture_native_stack(pid, rank, dir, stacks, cancel.get()));
        }
        for (const auto& [pid, rank] : natives) {
          // A Python worker that will not print its own traceback (no
          // faulthandler: `python -I`, a reset PYTHONPATH; or --on-hang=report,
          // where SIGABRT would end it): its frames read from outside.
          if (runs_python(pid))
            captured->push_back(capture_python_stack(pid, rank, dir, stacks, cancel.get()));
          captured->push_back(capture_native_stack(pid, rank, dir, stacks, cancel.get()));
        }
      },
      [this](std::function<void()> done) { boost::asio::post(io_, std::move(done)); },
      [this, captured, attempt = attempt_, cancel = capture_cancel_, alive = alive_.token()] {
        if (!alive || attempt != attempt_ || cancel != capture_cancel_ || !report_) return;
        report_->stacks.insert(report_->stacks.end(), captured->begin(), captured->end());
        finish_hang();
      });
}

void WatchdogHook::join_capture() {
  if (capture_cancel_) capture_cancel_->cancel();
  capture_.cancel();
  // Bounded: cancel kills the tool running, and the thread tries no other;
  // a tool that outlives even that is left behind, not waited for.
  if (!capture_.join_until(std::chrono::steady_clock::now() + kCaptureJoinDeadline)) {
    spdlog::warn("a stack capture did not stop within {} s of its cancel; left behind",
                 kCaptureJoinDeadline.count());
    capture_.abandon();
  }
  // A result still queued in the loop is for workers that are gone: dropped.
  capture_cancel_.reset();
}

void WatchdogHook::finish_hang() {
  const HangEvent& event = hang_event_;
  for (const auto& w : info_.workers) {
    if (!w.stdout_log.empty()) report_->worker_logs.emplace_back(w.rank, w.stdout_log);
    if (!w.stderr_log.empty()) report_->worker_logs.emplace_back(w.rank, w.stderr_log);
  }
  report_->find_culprit();  // Python tracebacks printed at teardown come later
  report_->write_later(*files_, attempt_dir_);  // off the loop
  if (events_) {
    events_->write("hang_detected", attempt_, report_->stalled, event.detail,
                   {{"kind", to_string(event.kind)},
                    {"rank", event.global_rank},
                    {"suspects", report_->suspects},
                    {"detected_after_due_ms",
                     std::chrono::duration<double, std::milli>(event.detected - event.due).count()},
                    {"culprit", report_->culprit},
                    {"culprit_state", to_string(report_->culprit_state)},
                    {"evidence", report_->evidence},
                    {"report", attempt_dir_ + "/" + base::kFileHangReportJson}});
  }
  const std::string summary = report_->summary(options_.logs_kept ? attempt_dir_ : "");
  const char* what = options_.on_hang == OnHang::kReport
                         ? "reporting only (--on-hang=report): the job keeps running"
                     : options_.on_hang == OnHang::kExit ? "ending the job (exit status 124)"
                     : replaces_culprit()
                         ? "replacing that rank (--restart-scope=rank, --max-restarts permitting)"
                         : "restarting the group (--max-restarts permitting)";
  // The one warning, culprit first (the summary's headline).
  spdlog::warn("freeze: rank {} is the culprit; {}. {}", report_->culprit, what, summary);
  if (options_.on_hang == OnHang::kReport) {
    // Written once, above: the job goes on and this report is done.
    last_report_dir_ = attempt_dir_;
    report_.reset();
    if (dog_) dog_->rearm_after_report();
    return;
  }
  const agent::FailRequest req = fail_request(summary);
  // Null when the attempt already ended another way during the capture.
  if (control_ == nullptr) return;
  control_->fail_attempt(req);
  // Stopped workers would hold the pending SIGABRT/SIGTERM until SIGKILL:
  // continued through the attempt, which knows which are still running.
  control_->continue_running_workers();
}

agent::FailRequest WatchdogHook::fail_request(const std::string& summary) {
  agent::FailRequest req;
  req.reason = summary;
  req.local_rank = hang_event_.local_rank;
  // The job's status when this hang ends it (no restart left, or exit).
  req.exit_code = kExitHang;
  if (replaces_culprit()) {
    auto it = std::find_if(info_.workers.begin(), info_.workers.end(),
                           [&](const auto& w) { return w.rank == report_->culprit; });
    if (it != info_.workers.end()) {
      req.replace_local_rank = it->local_rank;
      // Its own traceback, unless it was dumped live already.
      if (!has_stack(*report_, it->rank) && python_faulthandler_enabled(it->pid)) {
        report_->stacks.push_back(faulthandler_entry(*it));
        abort_targets_ = {it->local_rank};
      }
    }
  }
  if (!abort_targets_.empty()) {
    req.signal = SIGABRT;
    req.targets = abort_targets_;
    req.wait = options_.traceback_wait;
    for (const auto& w : info_.workers) {
      if (std::count(abort_targets_.begin(), abort_targets_.end(), w.local_rank)) no_core_dumps(w.pid);
    }
  }
  return req;
}

void WatchdogHook::write_report(const char* no_traceback_note) {
  for (auto& s : report_->stacks) {
    if (s.method != StackMethod::kPythonFaulthandler || s.path.empty()) continue;
    s.text = extract_python_traceback(s.path);
    if (s.text.empty()) s.note = no_traceback_note;
  }
  // Python tracebacks arrive only now, after the headline named the
  // culprit: they go in the report (stack_culprit_rank), the blame stays.
  report_->find_culprit(false);
  report_->write_later(*files_, attempt_dir_);  // off the loop
  if (!options_.logs_kept)
    spdlog::warn("hang report (not kept on disk without --log-dir):\n{}", report_->to_text());
}

void WatchdogHook::close_replaced_hang() {
  if (!report_) return;
  // The culprit is gone: its faulthandler traceback is in its log as far
  // as the log writer got (the rest follows in the same file).
  write_report("no faulthandler traceback found in the log yet");
  last_report_dir_ = attempt_dir_;
  report_.reset();
}

}  // namespace ddprun::watchdog
