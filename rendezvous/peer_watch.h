// PeerWatch: the keep-alive's rule for silent deaths (rendezvous.h), apart
// from its thread and store so it can be unit tested on a ManualClock
// (base/clock.h) in milliseconds.
//
// Every node bumps its heartbeat counter in the store each
// keep_alive_interval; a peer whose counter has not changed for the window
// (interval x keep_alive_max_attempt) is dead. A peer's silence counts from
// the last read that saw its counter change, or from when the watch began.
//
// A plain value type: the caller passes the time of each read. Not
// thread-safe (KeepAlive keeps it on its own thread).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "base/clock.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class PeerWatch {
 public:
  PeerWatch(size_t peers, Duration window, base::TimePoint start);

  // The peers' counters as read at `now` (one value per peer, in order;
  // empty when unset). Returns the first peer silent for the whole window.
  std::optional<size_t> update(const std::vector<Bytes>& values, base::TimePoint now);
  // How long peer `i` has been silent at `now`.
  Duration silent_for(size_t i, base::TimePoint now) const;

 private:
  struct Seen {
    Bytes value;
    base::TimePoint changed;
  };
  Duration window_;
  std::vector<Seen> seen_;
};

// When this node's next heartbeat is due: one interval after the last, so
// a slow store round trip delays beats but never bunches them.
class BeatSchedule {
 public:
  BeatSchedule(Duration interval, base::TimePoint start) : interval_(interval), next_(start) {}
  bool due(base::TimePoint now) const { return now >= next_; }
  void beaten(base::TimePoint now) { next_ = now + interval_; }
  base::TimePoint next() const { return next_; }

 private:
  Duration interval_;
  base::TimePoint next_;
};

}  // namespace ddprun::rendezvous
