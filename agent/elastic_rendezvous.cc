#include "agent/elastic_rendezvous.h"

#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <boost/asio/post.hpp>

#include "base/phase_trace.h"
#include "base/scoped_fd.h"
#include "agent/rendezvous_store.h"
#include "rendezvous/client.h"
#include "rendezvous/job_protocol.h"

namespace ddprun::agent {
namespace {

namespace rdzv = rendezvous;
using rdzv::Duration;

constexpr int kDefaultPort = 29400;  // torchrun's c10d default

// True when `host` resolves to an address of this machine (binding it works).
bool is_local_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* a = res; a && !local; a = a->ai_next) {
    base::ScopedFd fd(socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) continue;
    local = bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0;  // port 0: never collides
  }
  freeaddrinfo(res);
  return local;
}

}  // namespace

// A peer whose agent was stopped by a handled signal (Slurm's SIGTERM, its
// early-warning SIGUSR1) reports it through the store, and that report can
// arrive before the same signal reaches this node. The local workers then get
// that signal too, with the grace period, rather than a plain SIGTERM: every
// rank checkpoints the way the signal asks, whichever agent heard it first.
void ElasticRendezvous::forward_peer_signal(const rdzv::RoundEnd& end, FailRequest& req) const {
  if (end.kind != rdzv::RoundEnd::kSignalled || !end.forward_signal || end.signal <= 0) return;
  const int sig = end.signal;
  const auto& handled = options_.signals_to_handle;
  if (std::find(handled.begin(), handled.end(), sig) == handled.end()) return;
  req.signal = sig;
  req.wait = options_.term_timeout;
}

ElasticRendezvous::ElasticRendezvous(const Options& options)
    : options_(options), keys_(options.run_id) {
  if (options_.rdzv_endpoint.empty())
    throw RendezvousError("--nnodes=" + std::to_string(options_.min_nodes) + ":" +
                          std::to_string(options_.max_nodes) +
                          (is_etcd_backend(options_.rdzv_backend)
                               ? " needs --rdzv-endpoint=HOST:PORT[,HOST:PORT...] (etcd's client URLs)"
                               : " needs --rdzv-endpoint=HOST:PORT (the node at HOST hosts the store)"));
  spec_ = rendezvous_store_spec(options_, kDefaultPort);
  host_name_ = spec_.host;
  port_ = spec_.port;
  store_addr_ = spec_.address;
  token_ = options_.rdzv_token;

  rdzv::RendezvousOptions ro;
  ro.run_id = options_.run_id;
  ro.min_nodes = options_.min_nodes;
  ro.max_nodes = options_.max_nodes;
  ro.local_world_size = options_.nproc_per_node;
  auto conf = options_.rdzv_conf;
  conf.erase("token");
  for (const char* k : {"cacert", "cert", "key", "user"}) conf.erase(k);  // the store's (spec_)
  rdzv::apply_rdzv_conf(conf, ro);
  keep_alive_window_ = ro.keep_alive_interval * ro.keep_alive_max_attempt;

  // Host the store here? An explicit is_host decides; otherwise the agent
  // whose machine owns HOST hosts it, if it gets the port first.
  const bool explicit_host = options_.rdzv_conf.count("is_host") > 0;
  if (spec_.etcd && explicit_host && ro.is_host)
    throw RendezvousError("is_host=true: with --rdzv-backend=etcd no node hosts the store");
  const StoreHostOptions so = store_options();
  auto host_now = [&] {
    try {
      host_ = std::make_unique<StoreHost>(so);
    } catch (const std::exception& e) {
      if (explicit_host) throw RendezvousError(std::string("is_host=true: ") + e.what());
      return false;
    }
    spdlog::info("hosting the rendezvous store at {} ({})", store_addr_,
                 token_.empty() ? "no token: anyone who reaches the port can join" : "token required");
    return true;
  };
  bool port_taken = false;
  if (!spec_.etcd && (explicit_host ? ro.is_host : is_local_address(host_name_)) && !host_now()) {
    port_taken = true;
    spdlog::info("port {} is taken on this machine; joining the store there", port_);
  }

  // Wait (join_timeout) for the store; its connection's local address is
  // the one peers can reach us at, even on multi-NIC hosts.
  std::string local_addr = options_.local_addr;
  try {
    std::string from = port_taken ? probe_or_host_rendezvous_store(spec_, ro.join_timeout, host_now)
                                  : probe_rendezvous_store(spec_, ro.join_timeout);
    if (local_addr.empty()) local_addr = from;
    base::mark_phase(options_.phase_trace, "store");
  } catch (const rdzv::AuthError& e) {
    throw RendezvousError(std::string("cannot join the rendezvous store: ") + e.what() +
                          (spec_.etcd ? ""
                                      : " (give every node the same --rdzv-conf token=... or "
                                        "DDPRUN_RDZV_TOKEN)"));
  } catch (const std::exception& e) {
    throw RendezvousError(std::string("cannot join the rendezvous store: ") + e.what());
  }
  try {
    if (options_.master_port) {
      ro.master_port = *options_.master_port;
    } else {
      master_port_ = std::make_unique<PortReservation>(local_addr);
      ro.master_port = master_port_->port();
    }
  } catch (const std::exception& e) {
    throw RendezvousError(std::string("MASTER_PORT: ") + e.what());
  }
  // Every node serves c10d's TCPStore on its MASTER_PORT: the round's node
  // rank 0 is MASTER_ADDR:MASTER_PORT, and which node that is can change
  // when the job re-forms. With --master-port, another agent of the job on
  // this machine may hold the port already: then that one serves it.
  try {
    if (!master_port_) master_port_ = std::make_unique<PortReservation>(local_addr, ro.master_port);
    StoreHostOptions to;
    to.ddprun_store = false;
    to.tcpstore_fd = master_port_->take_socket();
    tcpstore_host_ = std::make_unique<StoreHost>(to);
  } catch (const std::exception& e) {
    spdlog::warn("not hosting the TCPStore at MASTER_PORT {}: {}", ro.master_port, e.what());
  }
  ro.local_addr = local_addr;
  ro.hosts_store = host_ != nullptr;
  try {
    // The join's connections wait for the store as long as the probe did
    // (join_timeout): a late greeting during formation is no reason to
    // give up. The keep-alive's reconnects keep the short window, which is
    // what detects a lost store.
    store_patience_ = ro.join_timeout;
    control_ = connect(store_patience_);
    rdzv_ = std::make_unique<rdzv::Rendezvous>(
        [this] { return connect(store_patience_); }, ro,
        [this] { return connect(keep_alive_window_, false); });
  } catch (const std::exception& e) {
    throw RendezvousError(e.what());
  }
  base::mark_phase(options_.phase_trace, "connected");
}

StoreHostOptions ElasticRendezvous::store_options() const {
  StoreHostOptions so;
  so.bind_host = host_name_.find(':') != std::string::npos ? "::" : "0.0.0.0";
  so.port = port_;
  so.token = token_;
  return so;
}

ElasticRendezvous::~ElasticRendezvous() {
  if (notifier_.joinable()) notifier_.join();
  // Before anything closes (the keep-alive's connection, the store this
  // node may host): the farewell, so every peer reads why this node stops.
  farewell();
  keep_alive_.reset();
  rdzv_.reset();
  control_.reset();
  host_.reset();
  tcpstore_host_.reset();
}

void ElasticRendezvous::abandon(int signal) {
  stop_signal_ = signal;
  canceller_->cancel();
}

std::unique_ptr<rdzv::Store> ElasticRendezvous::connect(Duration connect_timeout, bool cancellable) {
  return open_rendezvous_store(spec_, std::max(connect_timeout, Duration(1000)),
                               std::max(keep_alive_window_, Duration(5000)),
                               cancellable ? canceller_ : nullptr);
}

std::string ElasticRendezvous::me() const {
  return "node " + rdzv_->node_id() + " at " + rdzv_->options().local_addr;
}

RoundInfo ElasticRendezvous::next_round(int) {
  // Before joining: no node's workers of the new round start until this
  // node has joined, so none reaches the old keys (store_host.h).
  if (tcpstore_host_) tcpstore_host_->clear_tcpstore();
  if (notifier_.joinable()) notifier_.join();
  keep_alive_.reset();
  control_attempt_ = nullptr;
  round_over_ = false;
  local_end_.reset();
  drain_ = false;
  uint64_t generation;
  {  // after the resets: whoever sees the new generation sees them too
    base::MutexLock lock(mu_);
    remote_end_.reset();
    generation = ++generation_;
  }
  RoundInfo info;
  if (reconnect_) {
    // The old connections may have died with the partition, or with the
    // store's host (a successor's store, store_patience_).
    try {
      control_ = connect(store_patience_);
      rdzv_->reconnect();
    } catch (const std::exception& e) {
      throw RendezvousError(e.what());
    }
    reconnect_ = false;
    store_patience_ = rdzv_->options().join_timeout;
  }
  spdlog::info("joining rendezvous '{}' at {} ({}..{} nodes, join_timeout {} s)", options_.run_id,
               store_addr_, options_.min_nodes, options_.max_nodes,
               rdzv_->options().join_timeout.count() / 1000.0);
  try {
    base::mark_phase(options_.phase_trace, "join");
    round_ = rdzv_->next_round();
    base::mark_phase(options_.phase_trace, "round", "rank=" + std::to_string(round_->group_rank));
    info.restart_count = restart_count_ = static_cast<int>(rdzv_->restart_count());
    stand_by();
    keep_alive_ = rdzv_->watch(
        [this, generation](const rdzv::RoundEnd& end) { on_round_end(generation, end); });
    base::mark_phase(options_.phase_trace, "watching");
  } catch (const std::exception& e) {
    round_.reset();
    linger_after_failed_join();
    throw RendezvousError(e.what());
  }
  info.group_rank = round_->group_rank;
  info.group_world_size = round_->group_world_size;
  info.world_size = round_->world_size;
  info.rank_base = round_->rank_base;
  info.local_world_size = options_.nproc_per_node;
  info.master_addr = round_->master_addr;
  info.master_port = round_->master_port;
  info.open_agents_store = [spec = spec_](Duration deadline,
                                          std::shared_ptr<rdzv::Canceller> canceller) {
    return open_rendezvous_store(spec, deadline, deadline, std::move(canceller));
  };
  // Inside the run's keys ("rdzv/<run_id>/", Rendezvous::key), which the
  // agents delete from etcd when the job ends (forget_finished_job).
  info.agents_store_prefix = keys_.introspect(round_->round);
  info.agents_store_name = store_addr_;
  info.round = round_->round;
  info.node_id = rdzv_->node_id();
  if (!spec_.etcd) {  // workers may use our store; etcd is the agents' only
    info.store_addr = store_addr_;
    info.store_prefix = round_->store_prefix;
    info.store_token = token_;
  }
  spdlog::info("round {}: group rank {} of {}, ranks {}..{} of {}, restart count {}",
               round_->round, info.group_rank, info.group_world_size, info.rank_base,
               info.rank_base + info.local_world_size - 1, info.world_size, info.restart_count);
  return info;
}

void ElasticRendezvous::linger_after_failed_join() {
  // The nodes of a round that never formed each time out on their own
  // clock; the host keeps the store up (at most join_timeout) until each
  // has said so, so they report the join failure rather than a lost store.
  if (spec_.etcd) return;  // etcd stays up: nobody waits for anyone
  try {
    if (!host_) {
      int64_t n = control_->add(keys_.gave_up(), 1);
      control_->set(keys_.gave_up(n), rdzv::to_bytes("1"));
      return;
    }
    const int64_t current = control_->add(keys_.current(), 0);
    int64_t joined = control_->add(keys_.joined(current), 0);
    int64_t others = std::min<int64_t>(joined, options_.max_nodes) - 1;
    std::vector<std::string> keys;
    for (int64_t i = 1; i <= others; ++i) keys.push_back(keys_.gave_up(i));
    if (!keys.empty()) control_->wait(keys, rdzv_->options().join_timeout);
  } catch (const std::exception& e) {
    spdlog::debug("after the failed join: {}", e.what());
  }
}

void ElasticRendezvous::on_round_end(uint64_t generation, const rdzv::RoundEnd& end) {
  {
    base::MutexLock lock(mu_);
    if (generation != generation_ || remote_end_) return;
    remote_end_ = end;
  }
  if (io_) boost::asio::post(*io_, [this, generation] { apply_end(generation); });
}

FailRequest ElasticRendezvous::fail_request(const rdzv::RoundEnd& end) const {
  FailRequest req;
  switch (end.kind) {
    case rdzv::RoundEnd::kStoreLost:
      req.reason = "lost the rendezvous store at " + store_addr_ + ": " + end.reason;
      break;
    case rdzv::RoundEnd::kScaleUp:
      req.reason = end.reason;
      break;
    default:
      req.reason = end.reason;
      req.exit_code = end.exit_status > 0 ? end.exit_status : 1;
      forward_peer_signal(end, req);
  }
  return req;
}

void ElasticRendezvous::apply_end(uint64_t generation) {
  std::optional<rdzv::RoundEnd> end;
  {
    base::MutexLock lock(mu_);
    if (generation != generation_) return;
    end = remote_end_;
  }
  if (!end || round_over_ || !control_attempt_) return;
  round_over_ = true;
  // The store's host is gone: its successor serves the store before it
  // stops its workers, so the other members find it when they come.
  if (end->kind == rdzv::RoundEnd::kStoreLost && end->store_gone) take_over_store();
  FailRequest req = fail_request(*end);
  spdlog::warn("{}; stopping the local workers", req.reason);
  control_attempt_->fail_attempt(req);
}

void ElasticRendezvous::workers_started(const AttemptInfo&, AttemptControl& control) {
  control_attempt_ = &control;
  uint64_t generation;
  {
    base::MutexLock lock(mu_);
    generation = generation_;
  }
  apply_end(generation);  // a round that ended before the workers were up
}

void ElasticRendezvous::signal_failure(rdzv::RoundEnd end) {
  if (round_over_) return;
  round_over_ = true;
  end.node = rdzv_->node_id();
  end.reason = me() + ": " + end.reason;
  // This host stops with the job (a signal ends ddprun): there is no next
  // round, and its store goes too; the destructor lingers for the record.
  end.store_closes = host_ && end.kind == rdzv::RoundEnd::kSignalled;
  local_end_ = end;
  // Hooks must not block: the store call runs on a thread of its own, and
  // group_ended (off the loop) waits for it before using the store again.
  // Nothing else uses rdzv_ while an attempt runs.
  if (notifier_.joinable()) notifier_.join();
  notifier_ = std::thread([this, end] {
    try {
      rdzv_->signal_failure(end);
    } catch (const std::exception& e) {
      spdlog::warn("could not tell the other nodes that {}: {}", end.reason, e.what());
    }
  });
}

void ElasticRendezvous::attempt_failed(const Failure& root) {
  // The first local failure ends the round for every node at once, before
  // the local teardown's grace period.
  rdzv::RoundEnd end;
  end.kind = rdzv::RoundEnd::kFailed;
  end.exit_status = root.exit_code > 0 && root.exit_code < 256 ? root.exit_code : 1;
  end.reason = root.reason;
  if (end.reason.empty() && root.status && root.local_rank)
    end.reason = "worker rank " + std::to_string(round_->rank_base + *root.local_rank) +
                 " ended with " + root.status->describe();
  if (end.reason.empty()) end.reason = "its workers failed";
  signal_failure(std::move(end));
}

void ElasticRendezvous::attempt_interrupted(int signal) {
  rdzv::RoundEnd end;
  end.kind = rdzv::RoundEnd::kSignalled;
  end.signal = signal;
  end.exit_status = 128 + signal;
  end.reason = "its agent got " + signal_name(signal);
  end.forward_signal = true;  // its workers got it too
  signal_failure(std::move(end));
}

void ElasticRendezvous::attempt_ended(const AttemptResult&) { control_attempt_ = nullptr; }

}  // namespace ddprun::agent
