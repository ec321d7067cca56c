// Attempt (attempt.h): starting one worker. Its log folder and files, its
// environment, its streams (pipes or a pty) and the pumps that carry them to
// the console and the logs; the process itself comes from the launcher.
#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <string.h>

#include "agent/attempt.h"
#include "agent/line_splitter.h"
#include "agent/spawn.h"
#include "agent/stdin_hint.h"
#include "agent/worker_logs.h"
#include "agent/worker_streams.h"
#include "base/contract.h"
#include "base/safe_file.h"
#include "base/scoped_fd.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

// The role a standby's console prefix names until it has a rank.
constexpr const char* kStandbyRole = "standby";

}  // namespace

Attempt::Worker Attempt::spawn_worker(int lr, int standby, bool replacement) {
  WorkerInfo w;
  w.local_rank = standby ? -1 : lr;
  w.rank = standby ? -1 : setup_.round.rank_base + lr;
  w.is_python = options_.is_python;
  WorkerLogs logs = open_worker_logs(
      options_, LogPlace{setup_.run_dir, setup_.attempt_index, setup_.log_every_stream}, w,
      standby ? std::string(base::kFileStandbyDirPrefix) + std::to_string(standby)
              : std::to_string(lr),
      replacement);

  // Rank scope: the channel's worker end is inherited under its own number
  // by this child only (SpawnRequest::inherit_fds) and closed here once the
  // child has it; the agent's end is read on the loop.
  RecoveryChannel::Pair channel;
  if (rank_scope()) {
    try {
      channel = RecoveryChannel::open(io_);
    } catch (const base::SystemError& e) {
      throw SpawnError(std::string("cannot open the recovery channel: ") + e.what(), e.error());
    }
  }
  const EnvMap env = worker_env(w, channel.worker.get(), standby);

  // A standby's lines read as role "standby", its number the rank, until
  // it is assigned one (StandbyPool::assign).
  std::string prefix =
      standby ? make_line_prefix(options_.log_line_prefix_template, kStandbyRole, standby,
                                 standby, options_.hostname)
              : make_line_prefix(options_.log_line_prefix_template, options_.role, w.rank, lr,
                                 options_.hostname);
  StreamPlan plan;
  plan.pty = ptys_;
  if (plan.pty) console_window(setup_.consoles.out->fd(), prefix.size(), plan.size);
  // On a terminal every rank's stdin is its pty, and typed input follows
  // the rank that waits for it (stdin_forwarder.h); elsewhere only the
  // stdin rank reads ddprun's stdin.
  // A standby reads nothing (/dev/null).
  if (standby)
    plan.stdin_mode = StdinMode::kNull;
  else if (setup_.stdin_forwarder && plan.pty)
    plan.stdin_mode = StdinMode::kForward;
  else if (options_.stdin_rank == w.rank)
    plan.stdin_mode = setup_.stdin_forwarder ? StdinMode::kForward : StdinMode::kInherit;
  if (plan.stdin_mode == StdinMode::kForward && plan.pty) {
    termios modes;
    if (setup_.stdin_forwarder->terminal_modes(modes)) plan.terminal = modes;
  }
  WorkerStreams streams = open_worker_streams(plan);
  SpawnRequest req;
  req.path = setup_.program_path;
  req.argv = options_.command;
  req.env = env_to_strings(env);
  req.stdin_fd = streams.in_child.get();
  req.stdout_fd = streams.out_write.get();
  req.stderr_fd = streams.err_write.get();
  req.nofile_limit = setup_.worker_nofile_limit;
  if (!standby && static_cast<size_t>(lr) < options_.worker_cpus.size())
    req.cpus = options_.worker_cpus[lr];
  if (channel.worker) req.inherit_fds.push_back(channel.worker.get());
  w.pid = launcher_.start(std::move(req));  // the caller finishes it
  channel.worker.reset();

  Worker worker;
  worker.info = w;
  worker.alive = true;
  worker.standby = standby;
  worker.slot = std::make_shared<int>(w.local_rank);
  worker.prefix = prefix;
  worker.out = make_pump(w, worker.slot, prefix, Stream::kStdout, logs.shown & kStdOut,
                         std::move(streams.out_read), std::move(logs.out));
  worker.err = make_pump(w, worker.slot, prefix, Stream::kStderr, logs.shown & kStdErr,
                         std::move(streams.err_read), std::move(logs.err));
  if (streams.input.get() >= 0) forward_input(worker, streams);
  worker.out->start();
  worker.err->start();
  if (channel.agent) {
    worker.channel = std::move(channel.agent);
    // By slot, not `lr`: a standby's packets count for the rank it became.
    worker.channel->start([this, slot = worker.slot, alive = alive_.token()](std::string_view packet) {
      if (alive && *slot >= 0) recovery_.on_packet(*slot, packet);
    });
  }
  return worker;
}

void Attempt::forward_input(Worker& worker, WorkerStreams& streams) {
  const WorkerInfo& w = worker.info;
  // readline writes to the stdout pty (fd 0 and 1 are that one device):
  // its output is where a change of the terminal's mode shows.
  OutputPump* out = worker.out.get();
  std::function<void(bool)> set_interactive;
  if (streams.input_is_pty) {
    out->set_before_console([forwarder = setup_.stdin_forwarder, pid = w.pid] {
      forwarder->output_from(pid);
    });
    set_interactive = [out, err = worker.err.get(), alive = alive_.token()](bool on) {
      if (alive) out->set_interactive(on, err);
    };
  }
  setup_.stdin_forwarder->add_target(w.rank, w.pid, std::move(streams.input),
                                     streams.input_is_pty, options_.stdin_rank == w.rank,
                                     std::move(set_interactive));
}

EnvMap Attempt::worker_env(const WorkerInfo& w, int recovery_fd, int standby) const {
  const RoundInfo& round = setup_.round;
  WorkerEnvInput in;
  in.local_rank = w.local_rank;
  in.rank = w.rank;
  in.local_world_size = round.local_world_size;
  in.world_size = round.world_size;
  in.group_rank = round.group_rank;
  in.group_world_size = round.group_world_size;
  // One role per job: role ranks are the global ranks.
  in.role_rank = w.rank;
  in.role_world_size = round.world_size;
  in.role_name = options_.role;
  in.master_addr = round.master_addr;
  in.master_port = round.master_port;
  in.restart_count = setup_.restart_count;
  in.max_restarts = options_.max_restarts;
  in.run_id = setup_.run_id;
  in.error_file = w.error_file;
  in.attempt_log_dir = options_.log_dir.empty() ? "" : info_.log_dir;
  in.store_addr = round.store_addr;
  in.store_prefix = round.store_prefix;
  in.store_token = round.store_token;
  if (options_.is_python) in.pythonpath_prepend = options_.pythonpath_prepend;
  in.signals_to_handle = options_.signals_to_handle_spec;
  in.recovery_fd = recovery_fd;
  in.generation = recovery_.generation();
  EnvMap env = setup_.base_env;
  add_worker_env(in, env);
  if (standby) {
    // No rank yet: event=assign brings it (docs/RECOVERY.md). The rest of
    // the group's environment (WORLD_SIZE, the store, the attempt) holds.
    for (const char* name : {base::kEnvRank, base::kEnvLocalRank, base::kEnvRoleRank})
      env.erase(name);
    env[base::kEnvStandby] = std::to_string(standby);
  } else if (options_.virtual_local_rank) {
    use_virtual_local_rank(w.local_rank, env);
  }
  for (auto* h : hooks_) h->add_worker_env(info_, w.local_rank, env);
  return env;
}

std::unique_ptr<OutputPump> Attempt::make_pump(const WorkerInfo& w, std::shared_ptr<int> slot,
                                               const std::string& prefix, Stream stream,
                                               int shown, base::ScopedFd read,
                                               base::ScopedFd log) {
  PumpConfig c;
  c.prefix = prefix;
  c.raw = prefix_off(options_.log_line_prefix_template);
  c.console = stream == Stream::kStdout ? setup_.consoles.out : setup_.consoles.err;
  c.shown = shown;
  c.log_path = stream == Stream::kStdout ? w.stdout_log : w.stderr_log;
  c.log = std::move(log);
  c.log_writer = setup_.log_writer;
  // By slot: a standby's output is nobody's until it is assigned a rank.
  if (!hooks_.empty())
    c.on_data = [this, slot, stream](std::string_view data) {
      if (*slot < 0) return;
      for (auto* h : hooks_) h->output(*slot, stream, data);
    };
  if (stream == Stream::kStderr && w.rank >= 0 && options_.stdin_rank != w.rank) {
    // This rank reads /dev/null: say why its input() or pdb found nothing.
    c.on_data = [hint = std::make_shared<StdinHint>(), next = std::move(c.on_data),
                 rank = w.rank, stdin_rank = options_.stdin_rank](std::string_view data) {
      if (hint->feed(data)) spdlog::warn("{}", StdinHint::message(rank, stdin_rank));
      if (next) next(data);
    };
  }
  // Pumps are closed in finish(), but a callback may already be queued on
  // the loop when the attempt is destroyed: `alive` tells.
  c.on_eof = [this, alive = alive_.token()] {
    if (alive) check_progress();
  };
  c.on_log_error = [this, slot, alive = alive_.token()](const std::string& path, int err) {
    if (!alive) return;
    const int lr = *slot;
    std::string error = base::errno_text(err);
    spdlog::warn("cannot write {}: {}; its output goes on to the console", path, error);
    result_.log_errors.push_back(path + ": " + error);
    for (auto* h : hooks_) h->log_write_failed(lr, path, error);
  };
  return std::make_unique<OutputPump>(io_, std::move(read), std::move(c));
}

}  // namespace ddprun::agent
