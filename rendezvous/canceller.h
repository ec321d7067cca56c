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
#include <set>

#include "base/mutex.h"
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
    base::MutexLock lock(mu_);
    cancelled_ = true;
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }
  bool cancelled() const { return cancelled_; }

  // A socket a blocked call may wait on; shut down at once when already
  // cancelled. Remove it before closing it (the number may be reused).
  void add(int fd) {
    base::MutexLock lock(mu_);
    fds_.insert(fd);
    if (cancelled_) ::shutdown(fd, SHUT_RDWR);
  }
  void remove(int fd) {
    base::MutexLock lock(mu_);
    fds_.erase(fd);
  }

 private:
  base::Mutex mu_;
  // Set under mu_, so add() either sees it or has its fd in fds_ before
  // cancel() walks them; read without it by cancelled().
  std::atomic<bool> cancelled_{false};
  std::set<int> fds_ GUARDED_BY(mu_);
};

}  // namespace ddprun::rendezvous
