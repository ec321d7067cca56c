// The watchdog hook's options (agent_hook.h), from the agent's options,
// which the launcher parsed once into enums and std::chrono::milliseconds
// (base::millis_from_seconds: one conversion, one rounding).
#pragma once

#include <chrono>
#include <string>

#include "agent/options.h"
#include "watchdog/restart_rules.h"
#include "watchdog/stack_capture.h"
#include "watchdog/timeout_learner.h"
#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

// ddprun's exit status when a detected freeze ends the job (--on-hang=exit,
// or the default without --max-restarts): a status of its own, as
// timeout(1)'s 124, so a scheduler's script can tell a freeze from a crash.
inline constexpr int kExitHang = 124;

// What a detected freeze does (--on-hang): the agent's type, parsed by the
// launcher.
using OnHang = agent::OnHang;
const char* to_string(OnHang action);

struct HookOptions {
  // Fixed detector timeouts (all off by default).
  WatchdogOptions detect;
  // Learned freeze detection (--hang-timeout=auto, the default): progress
  // and section timeouts from the job's own rhythm, unless a fixed
  // detect.heartbeat_timeout is set.
  bool learn = true;
  LearnerOptions learner;
  // What a detected freeze does after the stacks and the report.
  OnHang on_hang = OnHang::kExit;
  // How native workers' stacks are captured (eu-stack, else gdb, else
  // /proc; 10 s limit per tool).
  StackCaptureOptions stacks;
  // Workers run a Python interpreter: set PYTHONFAULTHANDLER=1 (unless the
  // user set it) while any detector is on, so SIGABRT prints tracebacks.
  bool is_python = false;
  // The worker's program as given (the command's first word), for the
  // notice that a non-Python program is not watched until it beats.
  std::string program;
  // --event-log-handler=console: events.jsonl lines also on stderr.
  bool events_to_console = false;
  // --restart-scope=rank: a hang blames one rank (the culprit), which the
  // agent replaces; only it gets SIGABRT for a traceback, the other ranks'
  // stacks are read from outside (py-spy, eu-stack, gdb), since the signal
  // would end them.
  bool rank_scope = false;
  // Serve torch's file timer (the agent's TORCHELASTIC_ENABLE_FILE_TIMER=1).
  bool file_timer = false;
  // FIFO path (the agent's TORCHELASTIC_TIMER_FILE); empty: a file in the
  // attempt's log directory.
  std::string timer_file;
  // How long SIGABRTed Python workers get to print before the teardown.
  std::chrono::milliseconds traceback_wait{5000};
  // At most this many hung native ranks get a stack capture (a gdb one may
  // take seconds); 0 captures none (--stack-capture=none).
  int max_native_captures = 4;
  // Python stacks dumped live by the workers on ddprun's stack signal
  // (live_stack.h), for the evidence rule and the report; off with
  // --stack-capture=none, which sends the workers no signal for stacks.
  bool live_stacks = true;
  // False without --log-dir: the agent deletes its temporary log root at
  // exit, so the hang report is also printed to the console.
  bool logs_kept = true;
};

// The folder with ddprun_heartbeat.py for workers' PYTHONPATH: the installed
// copy next to this program (<prefix>/bin/ddprun ->
// <prefix>/share/ddprun/python) when present, else the source tree's.
std::string heartbeat_python_dir();

// The watchdog's settings from the agent's options; TORCHELASTIC_ENABLE_FILE_TIMER
// and TORCHELASTIC_TIMER_FILE are read from options.base_env (the launcher's
// environment), as torchrun's agent reads its own.
HookOptions hook_options_from(const agent::Options& options);
RestartRulesOptions restart_options_from(const agent::Options& options);

}  // namespace ddprun::watchdog
