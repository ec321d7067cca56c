// Canceller: lets one thread abandon the store calls another thread is
// blocked in.
//
// The agent runs rendezvous joins and exit barriers on a thread of their
// own; when ddprun gets a stop signal, the loop thread calls cancel(): every
// Client built with this Canceller (ClientOptions::canceller) has its socket
// shut down, so a blocked send/recv/connect returns at once, and every call
// from then on throws CancelledError instead of reconnecting. A Canceller
// does not come back: after cancel() its clients are spent.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <mutex>
#include <set>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

// A store call abandoned through a Canceller.
class CancelledError : public StoreError {
 public:
  using StoreError::StoreError;
};

class Canceller {
 public:
  // Shuts down every registered socket; later calls fail with CancelledError.
  void cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }
  bool cancelled() const { return cancelled_; }

  // A socket a blocked call may wait on; shut down at once when already
  // cancelled. Remove it before closing it (the number may be reused).
  void add(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.insert(fd);
    if (cancelled_) ::shutdown(fd, SHUT_RDWR);
  }
  void remove(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.erase(fd);
  }

 private:
  std::mutex mu_;
  std::atomic<bool> cancelled_{false};
  std::set<int> fds_;  // guarded by mu_
};

}  // namespace ddprun::rendezvous
