#include "watchdog/hook_options.h"

#include <algorithm>

#include "base/contract.h"
#include "base/procfs.h"

namespace ddprun::watchdog {

namespace {

std::string base_env_value(const agent::Options& o, const std::string& key) {
  for (const auto& kv : o.base_env) {
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=') {
      return kv.substr(key.size() + 1);
    }
  }
  return {};
}

}  // namespace

std::string heartbeat_python_dir() {
  return base::installed_or(DDPRUN_WATCHDOG_PYTHON_INSTALL_DIR, "ddprun_heartbeat.py",
                            DDPRUN_WATCHDOG_PYTHON_DIR);
}

const char* to_string(OnHang action) {
  switch (action) {
    case OnHang::kRestart: return "restart";
    case OnHang::kExit: return "exit";
    case OnHang::kReport: return "report";
  }
  return "?";
}

HookOptions hook_options_from(const agent::Options& o) {
  HookOptions h;
  h.detect.heartbeat_timeout = o.heartbeat_timeout;
  // --heartbeat-timeout wins; else --hang-timeout=S is the same fixed
  // timeout, auto (unset) learns, 0 is off.
  if (h.detect.heartbeat_timeout.count() == 0 && o.hang_timeout && o.hang_timeout->count() > 0)
    h.detect.heartbeat_timeout = *o.hang_timeout;
  h.learn = h.detect.heartbeat_timeout.count() == 0 && !o.hang_timeout;
  h.learner.floor = std::max(Millis(1), o.hang_timeout_floor);
  // --heartbeat-grace is the setup's timeout in learned mode too (spawn to
  // the first beat; its end only says detection is off, never kills).
  if (o.heartbeat_grace.count() > 0) h.learner.initial_setup = o.heartbeat_grace;
  h.on_hang = o.on_hang;
  h.detect.heartbeat_grace = o.heartbeat_grace;
  h.detect.silence_timeout = o.silence_timeout;
  h.detect.stuck_timeout = o.stuck_timeout;
  // A named tool only, /proc only, or no capture at all.
  switch (o.stack_capture) {
    case agent::StackCapture::kAuto: break;
    case agent::StackCapture::kEuStack: h.stacks.gdb.clear(); break;
    case agent::StackCapture::kGdb: h.stacks.eu_stack.clear(); break;
    case agent::StackCapture::kProc:
      h.stacks.eu_stack.clear();
      h.stacks.gdb.clear();
      break;
    case agent::StackCapture::kNone:
      h.max_native_captures = 0;
      h.live_stacks = false;
      break;
  }
  h.is_python = o.is_python;
  if (!o.command.empty()) h.program = o.command.front();
  h.events_to_console = o.events_to_console;
  // torchrun: the server runs only for the exact value "1".
  h.file_timer = base_env_value(o, base::kEnvEnableFileTimer) == "1";
  h.timer_file = base_env_value(o, base::kEnvTimerFile);
  h.logs_kept = !o.log_dir.empty();
  h.rank_scope = o.restart_scope == agent::RestartScope::kRank;
  return h;
}

RestartRulesOptions restart_options_from(const agent::Options& o) {
  RestartRulesOptions r;
  r.max_restarts = o.max_restarts;
  r.backoff_initial = o.restart_backoff;
  r.max_no_progress_restarts = o.max_no_progress_restarts;
  r.no_restart_exit_codes = o.no_restart_exit_codes;
  return r;
}

}  // namespace ddprun::watchdog
