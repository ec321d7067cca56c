// Communicator for ranks on one host, through shared memory.
//
// Gloo over loopback TCP spends milliseconds a step copying a 1 MB gradient
// through the kernel on a 2-core machine; ranks that share a host can sum
// in shared memory instead. Rank 0 creates a POSIX shm segment (name shared
// through the store, unlinked once every rank mapped it): a header with
// per-rank progress counters, then two sets of slots, one slot per rank.
//
// All-reduce number c uses slot set c % 2. Each rank copies its data into
// its slot and bumps its `posted` counter ("post"); to finish, it waits for
// every rank's post, sums all slots in rank order straight into its tensor
// (so every rank ends with the same bits, those of Gloo for 2 ranks) and
// bumps its `consumed` counter. A set is reused only after every rank
// consumed its previous collective, so one wait a collective replaces the
// three barriers of a reduce-scatter, and there is no thread: allreduce_async
// posts on the caller's thread and returns (backward goes on while the peers
// post); the handle's wait() sums. Each rank reads every slot, fine for the
// few ranks one host holds. Tensors larger than a slot go chunk by chunk,
// synchronously.
//
// Waits spin for `spin` (a peer on another core usually arrives within
// microseconds), then sleep on a futex so a waiting rank gives its core to
// the others; every wait has the communicator's deadline, and a sleeping
// rank checks every 100 ms whether a peer process died (pidfd), failing the
// collective rather than waiting out the deadline (with an AbortSource,
// every 2 ms, and the source too). After a failure every later call fails
// at once. Calls come from one thread at a time, in the
// same order on every rank (as communicator.h requires).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "trainer/abort_source.h"
#include "trainer/communicator.h"
#include "trainer/error.h"

namespace c10d {
class Store;
}

namespace ddprun::trainer {

struct ShmOptions {
  int rank = 0;
  int world_size = 1;
  int64_t slot_bytes = 4 << 20;  // per-rank staging area; larger tensors go in chunks
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // Busy-wait this long before sleeping: short, because on a host with as
  // many ranks as cores a spinning rank steals the core its peer needs.
  std::chrono::microseconds spin = std::chrono::microseconds(10);
  std::string key_prefix = "ddprun_train/";  // store key for the segment name
  // --restart-scope=rank: a sleeping wait wakes every 2 ms instead of every
  // 100 ms, checks the peers' pidfds and this source, and throws
  // CollectiveAborted once it asks (abort_source.h). nullptr: as before.
  AbortSource* abort = nullptr;
};

// /dev/shm has no room for the segment. Rank 0 reserves every byte of it
// (posix_fallocate) before any rank maps it: a sparse segment on a full
// tmpfs maps fine and then kills each rank with SIGBUS at its first touch,
// in every attempt. Rank 0 tells the others through the store, so every
// rank throws this and they all choose the same fallback.
class ShmNoRoom : public TrainerError {
 public:
  using TrainerError::TrainerError;
};

// Throws ShmNoRoom on every rank when /dev/shm is too small, TrainerError
// for other failures.
std::unique_ptr<Communicator> make_shm_communicator(c10d::Store& store, const ShmOptions& options);

}  // namespace ddprun::trainer
