// What lets a collective that may never finish give up (--restart-scope=rank).
//
// A communicator given an AbortSource watches it while it waits: it polls
// fd() together with its own wait (a gloo Work's completion, the shm
// futex, NCCL's event) and, when requested() turns true, abandons the
// collective and throws CollectiveAborted. Without one (group scope) the
// communicators wait exactly as before. The recovery channel
// (recovery_channel.h) is the one real source; tests may fake it.
//
// Thread safety: requested() is called from the thread that issued the
// collectives (communicator.h's one thread), never from backend threads.
#pragma once

#include "trainer/error.h"

namespace ddprun::trainer {

class AbortSource {
 public:
  virtual ~AbortSource() = default;
  // Readable when requested() may have changed; -1 when nothing can change
  // it any more (poll() ignores a negative descriptor).
  virtual int fd() const = 0;
  // Reads what fd() has without blocking; true once the collectives of
  // this generation are to be abandoned (a peer failed).
  virtual bool requested() = 0;
};

// A collective abandoned because the AbortSource asked: the communicator
// is broken for good, and its buffers may still be written by backend
// threads (keep them alive: trainer.cc leaks them on purpose).
class CollectiveAborted : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

}  // namespace ddprun::trainer
