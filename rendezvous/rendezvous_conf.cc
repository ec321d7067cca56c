// --rdzv-conf's keys read into RendezvousOptions (rendezvous.h).
#include "rendezvous/rendezvous.h"

#include <cmath>

namespace ddprun::rendezvous {

namespace {
// A duration key: finite, at least `min` (strictly more when `positive`)
// and at most kMaxConfSeconds, so that no deadline computed from it
// overflows or passes at once.
Duration seconds(const std::string& key, const std::string& value, bool positive) {
  double v = std::nan("");
  try {
    size_t used = 0;
    v = std::stod(value, &used);
    if (used != value.size()) v = std::nan("");
  } catch (const std::exception&) {
  }
  bool ok = std::isfinite(v) && (positive ? v > 0 : v >= 0) && v <= kMaxConfSeconds;
  if (!ok) {
    throw RendezvousError("--rdzv-conf " + key + "=" + value + ": expected seconds, a number " +
                          (positive ? "> 0" : ">= 0") + " and <= " +
                          std::to_string(static_cast<int64_t>(kMaxConfSeconds)));
  }
  // At least 1 ms when positive: 0.0001 s must not become a zero deadline.
  int64_t ms = static_cast<int64_t>(v * 1000);
  return Duration(positive ? std::max<int64_t>(ms, 1) : ms);
}
}  // namespace

void apply_rdzv_conf(const std::map<std::string, std::string>& conf, RendezvousOptions& o) {
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout") o.join_timeout = seconds(key, value, true);
    else if (key == "last_call_timeout") o.last_call_timeout = seconds(key, value, false);
    else if (key == "close_timeout") o.close_timeout = seconds(key, value, false);
    else if (key == "keep_alive_interval") o.keep_alive_interval = seconds(key, value, true);
    else if (key == "keep_alive_max_attempt") {
      try {
        size_t used = 0;
        int v = std::stoi(value, &used);
        if (used != value.size() || v < 1 || v > 1000000) throw std::invalid_argument("");
        o.keep_alive_max_attempt = v;
      } catch (const std::exception&) {
        throw RendezvousError("--rdzv-conf keep_alive_max_attempt=" + value +
                              ": expected an integer >= 1 and <= 1000000");
      }
    } else if (key == "is_host") {
      if (value == "1" || value == "true" || value == "True") o.is_host = true;
      else if (value == "0" || value == "false" || value == "False") o.is_host = false;
      else throw RendezvousError("--rdzv-conf is_host=" + value + ": expected true or false");
    } else if (key == "store_type") {
      // torch's c10d backend: tcp (its default) or file. ddprun's rendezvous
      // always runs over its own TCP store.
      if (value == "file")
        throw RendezvousError("--rdzv-conf store_type=file: ddprun's rendezvous runs over its "
                              "own TCP store at --rdzv-endpoint; use store_type=tcp (the default)");
      if (value != "tcp" && value != "TCP")
        throw RendezvousError("--rdzv-conf store_type=" + value + ": expected tcp");
    } else if (key == "heartbeat_timeout") {
      // torch's deadline for one keep-alive write; ddprun's keep-alive is
      // one store request under the store's own deadline. Checked, no effect.
      seconds(key, value, true);
    } else if (key == "cas_backoff_max_seconds") {
      // torch backs off after a lost compare-and-set of the rendezvous
      // state; ddprun's store serialises joins itself, nothing loses a race.
      seconds(key, value, false);
    } else if (key == "token" || key == "read_timeout" || key == "timeout" ||
               key == "use_agent_store" || key == "cacert" || key == "cert" || key == "key" ||
               key == "user") {
      // Read by the caller (the store connection; cacert, cert, key and
      // user are etcd's), or accepted for torchrun compatibility.
    } else {
      throw RendezvousError("--rdzv-conf: unknown key '" + key +
                            "' (known: join_timeout, last_call_timeout, close_timeout, "
                            "keep_alive_interval, keep_alive_max_attempt, is_host, token, "
                            "read_timeout, store_type, heartbeat_timeout, "
                            "cas_backoff_max_seconds; for etcd: cacert, cert, key, user)");
    }
  }
}

}  // namespace ddprun::rendezvous
