#include "rendezvous/peer_watch.h"

namespace ddprun::rendezvous {

PeerWatch::PeerWatch(size_t peers, Duration window, base::TimePoint start)
    : window_(window), seen_(peers, Seen{{}, start}) {}

std::optional<size_t> PeerWatch::update(const std::vector<Bytes>& values, base::TimePoint now) {
  std::optional<size_t> dead;
  for (size_t i = 0; i < seen_.size() && i < values.size(); ++i) {
    if (values[i] != seen_[i].value) {
      seen_[i] = {values[i], now};
      continue;
    }
    if (!dead && silent_for(i, now) >= window_) dead = i;
  }
  return dead;
}

Duration PeerWatch::silent_for(size_t i, base::TimePoint now) const {
  return std::chrono::duration_cast<Duration>(now - seen_.at(i).changed);
}

}  // namespace ddprun::rendezvous
