#include "introspect/agent_hook.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "agent/exit_status.h"
#include "base/contract.h"
#include "base/safe_file.h"
#include "introspect/control_wire.h"
#include "introspect/proc_usage.h"
#include "introspect/stacks.h"

namespace ddprun::introspect {

namespace fs = std::filesystem;

namespace {

// Only when the agent has no runtime folder of its own to lend (tests):
// through base::SafeDir like every other folder (base checked, random name,
// 0700: only this user reaches the control socket), named with the agent's
// prefix (runtime_dir.h).
std::string make_runtime_dir() {
  std::vector<std::string> bases;
  for (const char* var : {base::kEnvXdgRuntimeDir, base::kEnvTmpDir}) {
    const char* v = std::getenv(var);
    if (v && *v) bases.emplace_back(v);
  }
  bases.emplace_back("/tmp");
  std::string tried;
  for (const auto& b : bases) {
    try {
      std::string leaf;
      base::SafeDir::open(b).make_unique_subdir(base::kFileAgentDirPrefix, 0700, &leaf);
      return b + "/" + leaf;
    } catch (const base::FileError& e) {
      tried += (tried.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  throw std::runtime_error("cannot create a private runtime folder (" + tried + ")");
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

int attempt_number(const std::string& log_dir, int fallback) {
  const std::string name = fs::path(log_dir).filename().string();
  if (name.rfind(base::kFileAttemptDirPrefix, 0) == 0) {
    try {
      return std::stoi(name.substr(std::strlen(base::kFileAttemptDirPrefix)));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

std::string state_word(char s) {
  switch (s) {
    case 'R': return "R running";
    case 'S': return "S sleeping";
    case 'D': return "D disk wait";
    case 'T': case 't': return std::string(1, s) + " stopped";
    case 'Z': return "Z zombie";
    default: return std::string(1, s);
  }
}

}  // namespace

MonitorOptions monitor_options_from(const agent::Options& o) {
  MonitorOptions m;
  m.run_id = o.run_id;
  m.straggler.fraction = o.straggler_fraction;
  m.straggler.window = o.straggler_window;
  m.progress_interval = o.progress_interval;
  // --stack-capture names the tool for hang reports; stacks on request follow it.
  using agent::StackCapture;
  if (o.stack_capture == StackCapture::kEuStack) m.stacks.gdb.clear();
  if (o.stack_capture == StackCapture::kGdb) m.stacks.eu_stack.clear();
  if (o.stack_capture == StackCapture::kProc || o.stack_capture == StackCapture::kNone) {
    m.stacks.eu_stack.clear();
    m.stacks.gdb.clear();
  }
  return m;
}

IntrospectHook::IntrospectHook(boost::asio::io_context& io, MonitorOptions options,
                               BeatSource beats, EventSource events)
    : io_(io),
      options_(std::move(options)),
      beats_(std::move(beats)),
      events_(std::move(events)),
      host_(hostname()),
      timer_(io) {}

void IntrospectHook::set_up(const std::string& agent_runtime_dir) {
  set_up_ = true;
  // Introspection is a convenience: the job runs without it.
  try {
    if (agent_runtime_dir.empty()) {
      runtime_dir_ = make_runtime_dir();
      own_runtime_dir_ = true;
    } else {
      runtime_dir_ = agent_runtime_dir + "/introspect";
    }
    // The workers' sitecustomize opens its stack file there as it starts.
    base::SafeDir::open(runtime_dir_, true, 0700).subdir(base::kFilePyStackDir, true);
  } catch (const std::exception& e) {
    spdlog::warn("ddprun status/stacks unavailable for this job: {}", e.what());
    std::error_code ignored;
    if (own_runtime_dir_) fs::remove_all(runtime_dir_, ignored);
    own_runtime_dir_ = false;
    runtime_dir_.clear();
  }
}

void IntrospectHook::serve() {
  serving_ = true;
  if (runtime_dir_.empty()) return;
  try {
    base::SafeDir::open(runtime_dir_).subdir("stacks", true);
    server_ = std::make_unique<ControlServer>(
        io_, runtime_dir_ + "/" + base::kFileControlSocket,
        [this](const nlohmann::json& req, ControlServer::Reply reply) { handle(req, reply); });
    AgentEntry e{options_.run_id, host_, ::getpid(), server_->path()};
    registration_ = std::make_unique<Registration>(registry_dir(options_.registry_dir), e);
  } catch (const std::exception& e) {
    // The workers keep the stack folder they were given; nobody asks for it.
    spdlog::warn("ddprun status/stacks unavailable for this job: {}", e.what());
    registration_.reset();
    server_.reset();
  }
}

IntrospectHook::~IntrospectHook() {
  alive_.revoke();
  cancel_->cancel();  // kills a stack tool still running
  capture_.cancel();
  // Bounded: a tool that outlives its cancel is left behind (it holds copies).
  if (!capture_.join_until(std::chrono::steady_clock::now() + std::chrono::seconds(10)))
    capture_.abandon();
  board_.reset();
  registration_.reset();
  server_.reset();
  if (own_runtime_dir_) {
    std::error_code ignored;
    fs::remove_all(runtime_dir_, ignored);
  }
}

void IntrospectHook::add_worker_env(const agent::AttemptInfo& attempt, int,
                                    agent::EnvMap& env) {
  if (!set_up_) set_up(attempt.runtime_dir);
  if (runtime_dir_.empty()) return;
  env[base::kEnvPyStackSignal] = std::to_string(pystack_signal());
  env[base::kEnvPyStackDir] = runtime_dir_ + "/" + base::kFilePyStackDir;
}

void IntrospectHook::workers_started(const agent::AttemptInfo& attempt, agent::AttemptControl&) {
  if (!serving_) serve();
  restarts_ = attempt.restart_count;
  attempt_ = attempt_number(attempt.log_dir, attempt.restart_count);
  workers_.clear();
  rates_.clear();
  for (const auto& w : attempt.workers) workers_.push_back(Worker{w});
  board_.reset();
  const auto& round = attempt.round;
  node_ = round.group_world_size > 1 ? round.group_rank : -1;
  nodes_ = std::max(1, round.group_world_size);
  progress_steps_.clear();
  last_progress_ = {};
  // The watchdog opened the event log as this attempt began (its hook runs
  // first); counting from it keeps status and events.jsonl in step.
  if (auto* ev = events_ ? events_() : nullptr) {
    ev->set_tap([this, alive = alive_.token()](const nlohmann::json& event) {
      if (alive) counters_.count(event);
    });
  }
  if (round.group_world_size > 1 && round.open_agents_store && server_) {
    // Another node's `ddprun stacks`: capture here, answer through the store.
    auto on_request = [this, alive = alive_.token()](StacksRequest request) {
      boost::asio::post(io_, [this, alive, request] {
        if (!alive) return;
        stacks(request.rank, [this, id = request.id](const nlohmann::json& result) {
          if (board_) board_->answer(id, result);
        });
      });
    };
    // The agents' store, not the workers' (round.store_addr): under etcd
    // the workers have none, and the board must still see every node.
    board_ = std::make_unique<NodeBoard>(
        BoardPlace{round.open_agents_store, round.agents_store_name, round.agents_store_prefix,
                   round.group_rank, round.group_world_size},
        on_request);
    board_->publish(status());
  }
  schedule_sample();
}

void IntrospectHook::worker_exited(const agent::WorkerEnd& end) {
  write_progress(true);  // the steps as the attempt began to end
  for (auto& w : workers_) {
    if (w.info.local_rank != end.worker.local_rank) continue;
    w.exited = true;
    w.state = "exited " + std::to_string(end.status.shell_code());
    w.cpu_percent = 0;
    rates_.forget(w.info.rank);
  }
}

void IntrospectHook::recovery(const agent::RecoveryEvent& event) {
  if (event.kind != agent::RecoveryEvent::Kind::kReplaced || !event.replacement) return;
  for (auto& w : workers_) {
    if (w.info.local_rank != event.replacement->local_rank) continue;
    rates_.forget(w.info.rank);  // the new process's step rate starts over
    w = Worker{*event.replacement};
  }
}

void IntrospectHook::attempt_ended(const agent::AttemptResult&) {
  timer_.cancel();
  sampling_ = false;
  board_.reset();  // the round is over; its entries stay in its prefix
}

void IntrospectHook::schedule_sample() {
  if (sampling_) return;
  sampling_ = true;
  timer_.expires_after(options_.sample_interval);
  timer_.async_wait([this, alive = alive_.token()](const boost::system::error_code& ec) {
    if (ec || !alive) return;
    sampling_ = false;
    sample();
    schedule_sample();
  });
}

const watchdog::WorkerStatus* IntrospectHook::beat_status(int rank) const {
  const watchdog::Watchdog* dog = beats_ ? beats_() : nullptr;
  if (!dog) return nullptr;
  for (const auto& s : dog->workers())
    if (s.global_rank == rank) return &s;
  return nullptr;
}

void IntrospectHook::sample() {
  const auto now = Clock::now();
  const double hz = static_cast<double>(clock_ticks_per_second());
  for (auto& w : workers_) {
    if (w.exited) continue;
    const auto u = read_proc_usage(w.info.pid);
    if (!u) continue;  // exiting: the agent reports the exit
    w.state = state_word(u->state);
    w.rss_bytes = u->rss_bytes;
    if (w.sampled) {
      const double dt = std::chrono::duration<double>(now - w.last_sample).count();
      if (dt > 0) w.cpu_percent = 100.0 * static_cast<double>(u->cpu_ticks - w.last_ticks) / hz / dt;
    }
    w.sampled = true;
    w.last_ticks = u->cpu_ticks;
    w.last_sample = now;
    const auto* beat = beat_status(w.info.rank);
    if (beat && beat->beats > 0 && beat->step >= 0) rates_.sample(w.info.rank, now, beat->step);
  }
  check_stragglers();
  write_progress(false);
  if (board_) board_->publish(status());
}

void IntrospectHook::write_progress(bool due) {
  auto* ev = events_ ? events_() : nullptr;
  if (!ev || options_.progress_interval.count() <= 0) return;
  const auto now = Clock::now();
  if (!due && now - last_progress_ < options_.progress_interval) return;
  std::vector<int> ranks;
  nlohmann::json steps = nlohmann::json::array();
  bool moved = false;
  for (const auto& w : workers_) {
    const auto* beat = beat_status(w.info.rank);
    if (!beat || beat->beats == 0 || beat->step < 0) continue;
    ranks.push_back(w.info.rank);
    steps.push_back(beat->step);
    auto [it, added] = progress_steps_.try_emplace(w.info.rank, beat->step);
    moved = moved || added || it->second != beat->step;
    it->second = beat->step;
  }
  if (!moved) return;
  last_progress_ = now;
  ev->write("progress", attempt_, ranks, "", {{"steps", steps}});
}

void IntrospectHook::check_stragglers() {
  const auto slow = rates_.stragglers(options_.straggler);
  const auto median = rates_.median_rate(options_.straggler.window);
  const double window_s = std::chrono::duration<double>(options_.straggler.window).count();
  for (auto& w : workers_) {
    const bool now_slow = std::find(slow.begin(), slow.end(), w.info.rank) != slow.end();
    if (now_slow == w.straggler) continue;
    w.straggler = now_slow;
    const double rate = rates_.rate(w.info.rank, options_.straggler.window).value_or(0);
    std::string line;
    if (now_slow) {
      line = fmt::format("straggler: rank {} (pid {}) ran {:.2f} steps/s over the last {:.0f} s, "
                         "{:.0f}% below the median {:.2f} steps/s (ddprun stacks {} --rank {})",
                         w.info.rank, w.info.pid, rate, window_s,
                         100.0 * (1.0 - rate / median.value_or(1)), median.value_or(0),
                         options_.run_id, w.info.rank);
      spdlog::warn("{}", line);
    } else {
      line = fmt::format("rank {} is no longer a straggler ({:.2f} steps/s)", w.info.rank, rate);
      spdlog::info("{}", line);
    }
    if (auto* ev = events_ ? events_() : nullptr) {
      ev->write(now_slow ? "straggler" : "straggler_recovered", attempt_, {w.info.rank}, line,
                {{"steps_per_s", rate}, {"median_steps_per_s", median.value_or(0)},
                 {"window_s", window_s}, {"fraction", options_.straggler.fraction}});
    }
  }
}

nlohmann::json IntrospectHook::status() const {
  nlohmann::json rows = nlohmann::json::array();
  const auto now = Clock::now();
  const double hz = static_cast<double>(clock_ticks_per_second());
  for (const auto& w : workers_) {
    nlohmann::json r = {{"rank", w.info.rank},          {"local_rank", w.info.local_rank},
                        {"pid", w.info.pid},            {"state", w.state},
                        {"cpu_percent", w.cpu_percent}, {"rss_bytes", w.rss_bytes},
                        {"straggler", w.straggler},     {"step", nullptr},
                        {"beat_age_s", nullptr},        {"steps_per_s", nullptr},
                        {"cpu_seconds", w.sampled ? nlohmann::json(static_cast<double>(w.last_ticks) / hz)
                                                  : nlohmann::json()}};
    if (const auto* b = beat_status(w.info.rank); b && b->beats > 0) {
      if (b->step >= 0) r["step"] = b->step;
      r["beat_age_s"] = std::chrono::duration<double>(now - b->last_beat).count();
    }
    if (auto rate = rates_.rate(w.info.rank, options_.rate_window)) r["steps_per_s"] = *rate;
    rows.push_back(std::move(r));
  }
  nlohmann::json r = {{"run_id", options_.run_id},
          {"host", host_},
          {"agent_pid", ::getpid()},
          {"attempt", attempt_},
          {"restarts", restarts_},
          {"straggler",
           {{"fraction", options_.straggler.fraction},
            {"window_s", std::chrono::duration<double>(options_.straggler.window).count()}}},
          {"workers", rows}};
  if (node_ >= 0) r["node"] = node_;
  r["nodes"] = nodes_;
  counters_.add_to(r);
  if (const watchdog::Watchdog* dog = beats_ ? beats_() : nullptr) {
    if (dog->learning()) {
      nlohmann::json ts = nlohmann::json::array();
      for (const auto& t : dog->learner()->all()) {
        ts.push_back({{"kind", t.kind}, {"timeout_s", t.timeout.count() / 1000.0},
                      {"learned", t.learned}, {"samples", t.samples},
                      {"p99_s", t.p99.count() / 1000.0}, {"max_s", t.max.count() / 1000.0},
                      {"text", t.describe()}});
      }
      r["hang_timeouts"] = ts;
      // Other nodes' ranks in a section or setup, which this node's wait for.
      nlohmann::json peers = nlohmann::json::array();
      for (const auto& g : dog->peer_guards())
        peers.push_back({{"node", g.node}, {"rank", g.rank}, {"section", g.section},
                         {"left_s", std::chrono::duration<double>(g.until - now).count()}});
      r["peer_sections"] = peers;
    } else if (dog->options().heartbeat_timeout.count() > 0) {
      r["hang_timeout"] = fmt::format("{:g} s, fixed (--heartbeat-timeout or --hang-timeout)",
                                      dog->options().heartbeat_timeout.count() / 1000.0);
      r["hang_timeout_s"] = dog->options().heartbeat_timeout.count() / 1000.0;
    } else {
      r["hang_timeout"] = "off";
    }
  }
  return r;
}

void IntrospectHook::handle(const nlohmann::json& request, ControlServer::Reply reply) {
  const std::string op = request.is_object() ? request.value("op", "") : "";
  if (op == "status") {
    // Every node's rows unless the request asks for this node's only.
    status_reply(!request.contains("nodes") || request["nodes"] != "local", std::move(reply));
  } else if (op == "stacks") {
    int rank = -1;
    if (request.contains("rank") && request["rank"].is_number_integer()) rank = request["rank"];
    const bool all_nodes = !request.contains("nodes") || request["nodes"] != "local";
    if (all_nodes && board_) {
      stacks_all_nodes(rank, std::move(reply));
    } else {
      stacks(rank, std::move(reply));
    }
  } else {
    reply({{"error", "unknown op '" + op + "' (status, stacks)"}});
  }
}

void IntrospectHook::status_reply(bool all_nodes, ControlServer::Reply reply) {
  if (!all_nodes || !board_) {
    reply(status());
    return;
  }
  board_->fetch([this, alive = alive_.token(), reply](std::vector<nlohmann::json> peers,
                                              std::string error) {
    boost::asio::post(io_, [this, alive, reply, peers = std::move(peers),
                            error = std::move(error)] {
      if (!alive) return;
      nlohmann::json r = status();
      r["peers"] = peers;
      if (!error.empty()) r["peers_error"] = error;
      reply(r);
    });
  });
}

}  // namespace ddprun::introspect
