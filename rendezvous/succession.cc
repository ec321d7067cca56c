// The store's succession (succession.h).
#include "rendezvous/succession.h"

namespace ddprun::rendezvous {

Standby read_standby(Store& store, const JobKeys& keys, const RoundResult& round) {
  Standby s;
  s.round = round.round;
  s.closer = round.closer;
  s.members = read_members(store, keys, round);
  s.store_host = to_string(store.get(keys.store_host(), Duration(0)));
  s.restarts = store.add(keys.restarts(), 0);
  return s;
}

std::vector<std::pair<std::string, Bytes>> takeover_records(const JobKeys& keys,
                                                            const Standby& s,
                                                            const NodeInfo& successor) {
  const int64_t r = s.round;
  const auto size = static_cast<int64_t>(s.members.size());
  RoundEnd end;
  end.kind = RoundEnd::kPeerDead;
  end.node = s.store_host;
  end.reason = "the store's host " + s.store_host + " is gone; node " + successor.node_id +
               " at " + successor.addr + " took the store over";
  std::vector<std::pair<std::string, Bytes>> out = {
      {keys.current(), to_bytes(std::to_string(r))},
      {keys.last_closed(), to_bytes(std::to_string(r))},
      {keys.closed(r), encode_formed({size, s.closer})},
      {keys.members(r, s.closer), encode_nodes(s.members)},
      {keys.joined(r), to_bytes(std::to_string(kFormedMark + size))},
      {keys.end(r), encode_round_end(end)},
      {keys.dead(r, s.store_host), to_bytes("1")},
      {keys.dead_closed(r), to_bytes(s.store_host)},
      {keys.restarts(), to_bytes(std::to_string(s.restarts + 1))},
      {keys.store_host(), to_bytes(successor.node_id)},
  };
  return out;
}

}  // namespace ddprun::rendezvous
