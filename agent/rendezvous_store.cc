#include "agent/rendezvous_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "rendezvous/client.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/rendezvous_error.h"

namespace ddprun::agent {

namespace rdzv = rendezvous;
using rdzv::Duration;
using rdzv::RendezvousError;

namespace {
// The etcd-only --rdzv-conf keys.
constexpr const char* kEtcdKeys[] = {"cacert", "cert", "key", "user"};
// probe_or_host_rendezvous_store: how long one probe waits before hosting
// is tried again (a store that is up greets within it even under load:
// the slice is a retry, not a verdict), and how long they fail before the
// warning.
constexpr Duration kTakenPortSlice{2000};
constexpr std::chrono::seconds kTakenPortWarning{10};
}  // namespace

bool is_etcd_backend(const std::string& backend) { return backend == "etcd" || backend == "etcd-v2"; }

RendezvousStoreSpec rendezvous_store_spec(const Options& options, int default_port) {
  RendezvousStoreSpec spec;
  spec.etcd = is_etcd_backend(options.rdzv_backend);
  spec.token = options.rdzv_token;
  const auto& conf = options.rdzv_conf;
  auto value = [&](const char* k) {
    auto it = conf.find(k);
    return it == conf.end() ? std::string() : it->second;
  };
  if (!spec.etcd) {
    for (const char* k : kEtcdKeys)
      if (conf.count(k))
        throw RendezvousError("--rdzv-conf " + std::string(k) + "=: only for --rdzv-backend=etcd");
    std::string ep = options.rdzv_endpoint;
    const bool has_port = !ep.empty() && ep.back() != ']' && ep.find(':') != std::string::npos;
    if (!has_port) ep += ":" + std::to_string(default_port);
    try {
      std::tie(spec.host, spec.port) = rdzv::parse_host_port(ep, "--rdzv-endpoint");
    } catch (const rdzv::StoreError& e) {
      throw RendezvousError(e.what());
    }
    spec.address = ep;
    return spec;
  }
  auto& eo = spec.etcd_options;
  eo.endpoints = options.rdzv_endpoint;
  eo.cacert = value("cacert");
  eo.cert = value("cert");
  eo.key = value("key");
  eo.user = value("user");
  eo.password = options.rdzv_token;
  if (!eo.password.empty() && eo.user.empty())
    throw RendezvousError(
        "--rdzv-backend=etcd: a token (the etcd password) needs --rdzv-conf user=NAME");
  try {
    rdzv::EtcdGateway check(eo);  // bad endpoints and TLS files fail here
  } catch (const rdzv::StoreError& e) {
    throw RendezvousError(std::string("--rdzv-endpoint: ") + e.what());
  }
  spec.address = "etcd at " + eo.endpoints;
  return spec;
}

std::unique_ptr<rdzv::Store> open_rendezvous_store(const RendezvousStoreSpec& spec,
                                                   Duration connect_timeout, Duration op_timeout,
                                                   std::shared_ptr<rdzv::Canceller> canceller) {
  if (spec.etcd) {
    rdzv::EtcdOptions eo = spec.etcd_options;
    eo.request_timeout = op_timeout;
    eo.canceller = std::move(canceller);
    auto store = std::make_unique<rdzv::EtcdStore>(eo);
    store->set_reply_window(connect_timeout);
    return store;
  }
  rdzv::ClientOptions co;
  co.canceller = std::move(canceller);
  co.host = spec.host;
  co.port = spec.port;
  co.token = spec.token;
  co.connect_timeout = connect_timeout;
  co.op_timeout = op_timeout;
  try {
    return std::make_unique<rdzv::Client>(co);
  } catch (const rdzv::TimeoutError& e) {
    throw rdzv::StoreError(e.what());  // Rendezvous reports StoreErrors
  }
}

std::string probe_rendezvous_store(const RendezvousStoreSpec& spec, Duration connect_timeout) {
  if (spec.etcd) {
    rdzv::EtcdOptions eo = spec.etcd_options;
    eo.request_timeout = std::min(connect_timeout, Duration(5000));
    rdzv::EtcdStore store(eo);
    store.set_reply_window(connect_timeout);
    store.ping();
    return store.local_address();
  }
  rdzv::ClientOptions co;
  co.host = spec.host;
  co.port = spec.port;
  co.token = spec.token;
  co.connect_timeout = co.op_timeout = connect_timeout;
  rdzv::Client probe(co);
  // A client without a token reads the greeting with its first reply, so
  // the probe asks for one: a store that wants a token, or a port held by
  // something else, fails here, not at the first rendezvous call.
  probe.ping();
  return probe.local_address();
}

std::string probe_or_host_rendezvous_store(const RendezvousStoreSpec& spec, Duration join_timeout,
                                           const std::function<bool()>& host_now) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + join_timeout;
  bool warned = false;
  for (;;) {
    const auto slice_start = Clock::now();
    const auto left = std::chrono::duration_cast<Duration>(deadline - slice_start);
    try {
      return probe_rendezvous_store(spec, std::clamp(left, Duration(1), kTakenPortSlice));
    } catch (const rdzv::AuthError&) {
      throw;  // a store answered: the token decides, not the port
    } catch (const std::exception& e) {
      if (Clock::now() >= deadline) throw;
      if (host_now()) {
        const auto rest = std::chrono::duration_cast<Duration>(deadline - Clock::now());
        return probe_rendezvous_store(spec, std::max(rest, Duration(1000)));  // our own store
      }
      // A slice can fail at once (the port's owner speaks another protocol
      // and the client gives up on its first bytes): the next try waits
      // for the slice's end, or this would spin binds and connects.
      std::this_thread::sleep_until(std::min(slice_start + kTakenPortSlice, deadline));
      if (!warned && Clock::now() - start >= kTakenPortWarning) {
        warned = true;
        spdlog::warn("port {} is taken on this machine, but no rendezvous store answers there ({}); "
                     "is another program using it? Still trying to join, or to host the store once "
                     "the port is free",
                     spec.port, e.what());
      }
    }
  }
}

}  // namespace ddprun::agent
