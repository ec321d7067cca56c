// Agent's job loop (agent.h): a round from the rendezvous, an attempt of the
// worker group, the verdict of the other nodes and the restart policy, the
// back-off; until one of them ends the job with ddprun's exit status.
#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <utility>

#include "agent/agent.h"
#include "agent/exit_status.h"
#include "agent/failure_summary.h"
#include "agent/guardian.h"
#include "agent/process_launcher.h"
#include "agent/spawn.h"
#include "agent/standalone_rendezvous.h"
#include "base/contract.h"
#include "base/phase_trace.h"
#include "base/safe_file.h"

namespace ddprun::agent {

int Agent::run_job(Guardian& guardian, EnvMap env) {
  AttemptSetup setup;
  if (auto failed = prepare_job(setup, std::move(env))) return *failed;
  PosixLauncher launcher(guardian, cgroup_.get());
  for (int restart = 0;; ++restart) {
    if (auto stopped = join_round(setup, restart)) return *stopped;
    Attempt attempt(io_, clock_, launcher, options_, setup, hooks_);
    const bool spawned = run_attempt(attempt);
    const AttemptResult& result = attempt.result();
    log_errors_.insert(log_errors_.end(), result.log_errors.begin(), result.log_errors.end());
    // Rank scope: replacements spent restarts too; the next attempt knows.
    setup.rank_restarts = result.rank_restarts;
    NextStep next = after_attempt(result, spawned, restart);
    if (next.exit_status) return *next.exit_status;
    back_off(next.delay);
  }
}

std::optional<int> Agent::prepare_job(AttemptSetup& setup, EnvMap env) {
  setup.base_env = std::move(env);
  setup.worker_nofile_limit = worker_nofile_limit_;
  setup.log_every_stream = !options_.log_dir.empty();
  setup.consoles = consoles_;
  setup.log_writer = log_files_;
  setup.stdin_forwarder = stdin_.get();
  // Teed streams have files too (torchrun's tee), kept like redirected ones.
  bool redirected = options_.redirects.all != kStdNone || !options_.redirects.per_rank.empty() ||
                    options_.tee.all != kStdNone || !options_.tee.per_rank.empty();
  try {
    if (!rendezvous_) rendezvous_ = std::make_unique<StandaloneRendezvous>(options_);
    setup.run_id = rendezvous_->run_id();
    stale_bases_ = runtime_bases(setup.base_env);
    runtime_ = std::make_unique<RuntimeDir>(stale_bases_);
    setup.runtime_dir = runtime_->path();
    temp_bases_ = temp_bases(setup.base_env);
    setup.run_dir = make_run_dir(setup.base_env, options_.log_dir.empty() && redirected);
    auto path = setup.base_env.find("PATH");
    setup.program_path = resolve_program(options_.command.at(0),
                                         path == setup.base_env.end() ? "" : path->second);
  } catch (const SpawnError& e) {
    spdlog::error("{}", e.what());
    return e.exit_status();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  if (log_sink_ && !options_.log_dir.empty()) {
    // ddprun's own lines, all of them, also when the console cannot take them.
    try {
      log_sink_->attach_file(
          base::SafeDir::open(setup.run_dir).open_append(base::kFileAgentLog));
    } catch (const base::FileError& e) {
      spdlog::warn("{}", e.what());
    }
  }
  tell_omp_default_ =
      options_.nproc_per_node > 1 && !setup.base_env.count(base::kEnvOmpNumThreads);
  if (options_.log_dir.empty() && redirected)
    spdlog::info("redirected output goes to {}", setup.run_dir);
  else if (!options_.log_dir.empty())
    spdlog::info("logs go to {}", setup.run_dir);
  return std::nullopt;
}

std::optional<int> Agent::join_round(AttemptSetup& setup, int restart) {
  if (pending_signal_) return 128 + pending_signal_;
  try {
    setup.round = next_round(restart);
  } catch (const std::exception& e) {
    if (pending_signal_) {
      spdlog::warn("got {} while waiting for the other nodes; exiting",
                   signal_name(pending_signal_));
      return 128 + pending_signal_;
    }
    spdlog::error("rendezvous failed: {}", e.what());
    return 1;
  }
  if (pending_signal_) return 128 + pending_signal_;
  // A multi-node handler keeps the count job-wide (a scale-up spends none).
  setup.restart_count = setup.round.restart_count >= 0 ? setup.round.restart_count : restart;
  setup.attempt_index = restart;
  return std::nullopt;
}

bool Agent::run_attempt(Attempt& attempt) {
  current_ = &attempt;
  bool spawned = true;
  base::mark_phase(options_.phase_trace, "spawning");
  try {
    attempt.start();
  } catch (const SpawnError& e) {
    spdlog::error("{}", e.what());
    spawned = false;
  }
  base::mark_phase(options_.phase_trace, "spawned");
  if (spawned && std::exchange(tell_omp_default_, false))
    spdlog::info("OMP_NUM_THREADS=1 for each of the {} workers (set it to override)",
                 options_.nproc_per_node);
  remove_leftovers_of_dead_agents();
  // A signal that arrived before the attempt existed still stops it.
  if (pending_signal_) attempt.interrupt(pending_signal_);
  run_until([&] { return attempt.done(); });
  current_ = nullptr;
  return spawned;
}

Agent::NextStep Agent::after_attempt(const AttemptResult& result, bool spawned, int restart) {
  GroupOutcome go = result.outcome == Outcome::kSucceeded   ? GroupOutcome::kSucceeded
                    : result.outcome == Outcome::kFailed    ? GroupOutcome::kFailed
                                                            : GroupOutcome::kInterrupted;
  GroupVerdict verdict;
  try {
    verdict = group_ended(go);
  } catch (const std::exception& e) {
    if (!pending_signal_) {
      spdlog::error("rendezvous failed: {}", e.what());
      return {1};
    }
  }
  if (result.outcome == Outcome::kInterrupted) return {128 + result.signal};
  if (pending_signal_) {
    // A signal during the exit barrier (or a failed round's hand-shake)
    // ends the job at once, whatever the other nodes do.
    spdlog::warn("got {} while waiting for the other nodes to finish; exiting",
                 signal_name(pending_signal_));
    return {128 + pending_signal_};
  }
  if (verdict.action == GroupVerdict::kExit) {
    if (verdict.exit_code != 0) {
      if (result.outcome == Outcome::kFailed)
        print_failure(result, verdict.why);
      else
        spdlog::error("{}", verdict.why);
    }
    return {verdict.exit_code};
  }
  if (verdict.action == GroupVerdict::kRestart) {
    spdlog::warn("{}; re-forming the group", verdict.why);
    return {};
  }
  if (result.outcome == Outcome::kSucceeded) return {0};
  if (!spawned) return {result.root ? result.root->exit_code : 1};

  RestartDecision d = policy_->decide(result, options_.max_restarts);
  if (!d.restart) {
    print_failure(result, d.why);
    return {result.root ? result.root->exit_code : 1};
  }
  spdlog::warn("{}; restarting the group (restart {} of {})", root_cause_line(result),
               restart + 1 + result.rank_restarts, options_.max_restarts);
  return {std::nullopt, d.delay};
}

void Agent::remove_leftovers_of_dead_agents() {
  // Housekeeping nobody waits for: after the first workers are started, not
  // before them. Our own folder and cgroup are locked and alive.
  if (stale_bases_.empty()) return;
  const auto made_at = runtime_ ? runtime_->made_at() : std::nullopt;
  for (const auto& base : stale_bases_) remove_stale_runtime_dirs(base, made_at);
  stale_bases_.clear();
  if (cgroup_) cgroup_->remove_stale_siblings();
}

void Agent::back_off(std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return;
  // A stop signal cuts the wait short; the timer dies with the wait.
  auto timer = clock_.make_timer();
  bool waited = false;
  timer->arm(clock_.now() + delay, [&] { waited = true; });
  run_until([&] { return waited || pending_signal_ != 0; });
}

AttemptResult Agent::keep_error_file(const AttemptResult& result) {
  AttemptResult shown = result;
  if (!options_.log_dir.empty() || !runtime_ || !result.root || !result.root->error ||
      !result.root->local_rank)
    return shown;
  // Without --log-dir (and without redirects) the run folder lies in the
  // private folder removed at exit; torchrun prints the @record file's path
  // and keeps it, so the root cause's copy goes to a kept folder, laid out
  // as under --log-dir: ddprun_logs.<random>/<run>/attempt_<n>/<rank>/error.json.
  const std::string logs = runtime_->path() + "/logs";
  for (auto& end : shown.ends) {
    std::string& file = end.worker.error_file;
    if (end.worker.local_rank != *result.root->local_rank || file.rfind(logs + "/", 0) != 0)
      continue;
    try {
      const std::string rel = file.substr(logs.size() + 1);
      const size_t slash = rel.rfind('/');
      const std::string folder = rel.substr(0, slash), name = rel.substr(slash + 1);
      const std::string bytes =
          base::SafeDir::open(logs).subdir(folder, false).read_file(name, size_t(16) << 20);
      const std::string kept = make_temp_dir(temp_bases_, "ddprun_logs.");
      // Below the fresh 0700 folder nothing is followed (SafeDir).
      base::SafeDir::open(kept).subdir(folder, true, 0700).write_atomically(name, bytes, false,
                                                                             0600);
      file = kept + "/" + rel;
    } catch (const std::exception& e) {
      spdlog::warn("cannot keep the error file {}: {}", file, e.what());
    }
  }
  return shown;
}

void Agent::print_failure(const AttemptResult& result, const std::string& verdict) {
  print(failure_summary(keep_error_file(result), options_.hostname, verdict) +
        interpreter_hint_.line(result));
}

}  // namespace ddprun::agent
