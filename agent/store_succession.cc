// ElasticRendezvous (elastic_rendezvous.h) when the store is lost: the
// partitioned node that rejoins once the store answers again, and the
// store's succession when its host's agent is gone (rendezvous/succession.h,
// docs/multinode.md): the round's successor serves the store with the
// job's state and every survivor re-forms there.
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "agent/elastic_rendezvous.h"
#include "base/scoped_fd.h"
#include "rendezvous/client.h"

namespace ddprun::agent {
namespace {

namespace rdzv = rendezvous;
using rdzv::Duration;
using Clock = std::chrono::steady_clock;

}  // namespace

void ElasticRendezvous::stand_by() {
  standby_.reset();
  took_over_ = false;
  if (spec_.etcd || host_ || !round_->successor ||
      round_->successor->node_id != rdzv_->node_id())
    return;
  try {
    standby_ = rdzv::read_standby(*control_, keys_, *round_);
  } catch (const std::exception& e) {
    spdlog::warn("this node succeeds the store's host but could not read the round's state: {}; "
                 "if that host dies the job ends",
                 e.what());
  }
}

bool ElasticRendezvous::take_over_store() {
  if (host_) return true;
  if (!standby_) return false;
  StoreHostOptions so = store_options();
  so.preload = rdzv::takeover_records(keys_, *standby_, *round_->successor);
  try {
    host_ = std::make_unique<StoreHost>(so);
  } catch (const std::exception& e) {
    spdlog::error("cannot take the store over: {}", e.what());
    return false;
  }
  took_over_ = true;
  spdlog::warn("the store's host at {} is gone; this node takes the store over at {} "
               "(succession, docs/multinode.md)",
               store_addr_, rdzv::format_host_port(round_->successor->addr, port_));
  return true;
}

std::optional<GroupVerdict> ElasticRendezvous::fail_over(const std::string& why) {
  if (!round_ || !round_->successor) return std::nullopt;
  // The host's death ends its round like any member's: one restart.
  if (!restart_left())
    return GroupVerdict{GroupVerdict::kExit, 1, why + "; restart limit reached"};
  const rdzv::NodeInfo successor = *round_->successor;
  const bool me = successor.node_id == rdzv_->node_id();
  if (me && !take_over_store()) return std::nullopt;
  const std::string moved = rdzv::format_host_port(successor.addr, port_);
  const std::string next = why + "; node " + successor.node_id + " at " + moved +
                           (me ? " (this node)" : "") + " hosts the store now";
  spec_.host = host_name_ = successor.addr;
  spec_.address = store_addr_ = moved;
  reconnect_ = true;
  // The successor serves the store once its keep-alive finds the host
  // gone, and at the latest after its workers' teardown: a store that
  // does not come within that has died too (two deaths at once).
  const Duration term(options_.term_timeout);
  store_patience_ = std::min(rdzv_->options().join_timeout,
                             std::max(rdzv_->options().close_timeout, keep_alive_window_) * 2 + term);
  return GroupVerdict{GroupVerdict::kRestart, 0, next};
}

GroupVerdict ElasticRendezvous::after_store_lost(const rdzv::RoundEnd& end) {
  // Evicted by a partition (the others re-formed without this node), or
  // the store is gone. One that can reach the store again rejoins as a
  // late node, as a paused one does, spending no restart; one whose store
  // is gone goes to the successor's.
  const std::string why = fail_request(end).reason;
  if (spec_.etcd) return {GroupVerdict::kExit, 1, why};
  if (host_ && !took_over_) {
    // This node's own store, on its own thread, "did not answer": the
    // agent was paused (SIGSTOP, a frozen VM) and its calls' deadlines
    // passed before the store's thread ran again. The store is here and
    // serving: rejoin it, as the others do.
    reconnect_ = true;
    return {GroupVerdict::kRestart, 0, why + "; this node hosts that store: rejoining it"};
  }
  const Reach reach = end.store_gone ? Reach::kGone : store_reachable_again();
  if (reach == Reach::kAnswers) {
    reconnect_ = true;
    return {GroupVerdict::kRestart, 0, why + "; the store answers again: rejoining as a late node"};
  }
  if (reach == Reach::kGone) {
    if (auto v = fail_over(why)) return *v;
  }
  return {GroupVerdict::kExit, 1, why};
}

ElasticRendezvous::Reach ElasticRendezvous::probe_store_port(Duration limit) const {
  const auto deadline = Clock::now() + limit;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host_name_.c_str(), std::to_string(port_).c_str(), &hints, &res) != 0)
    return Reach::kSilent;
  bool refused = true;  // unless an address does anything but refuse
  for (addrinfo* a = res; a; a = a->ai_next) {
    base::ScopedFd fd(socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) continue;
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      int n = poll(&p, 1, static_cast<int>(std::max<int64_t>(ms.count(), 1)));
      socklen_t len = sizeof err;
      if (n == 1) getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      else err = ETIMEDOUT;
    }
    if (err == 0) {
      freeaddrinfo(res);
      return Reach::kAnswers;
    }
    if (err != ECONNREFUSED) refused = false;
  }
  freeaddrinfo(res);
  return refused ? Reach::kGone : Reach::kSilent;
}

ElasticRendezvous::Reach ElasticRendezvous::store_reachable_again() {
  const Duration limit = rdzv_->options().join_timeout;
  const auto deadline = Clock::now() + limit;
  spdlog::info("waiting up to {} s for the store at {} to answer again", limit.count() / 1000.0,
               store_addr_);
  while (!canceller_->cancelled() && Clock::now() < deadline) {
    const auto attempt_end = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    const Reach reach =
        probe_store_port(std::chrono::duration_cast<Duration>(attempt_end - Clock::now()));
    if (reach == Reach::kAnswers) return reach;
    if (reach == Reach::kGone) {
      spdlog::info("the store's host at {} refuses connections: the store is gone", store_addr_);
      return reach;
    }
    // Unreachable (no route, dropped): the partition goes on; try again.
    auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(attempt_end - Clock::now());
    if (rest.count() > 0) poll(nullptr, 0, static_cast<int>(rest.count()));
  }
  return Reach::kSilent;
}

}  // namespace ddprun::agent
