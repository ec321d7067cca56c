// Communicator over NCCL, called directly (CUDA tensors).
//
// Rank 0 draws an ncclUniqueId and publishes it in the store under
// "<key_prefix>nccl_id"; the others read it (store timeout) and every rank
// calls ncclCommInitRank on device `device`. Collectives run on a stream of
// their own: each waits for LibTorch's current stream (an event); a handle's
// wait() blocks until the collective finished (communicator.h), within
// `timeout`, then orders the current stream after it. A collective that
// does not finish in time, or an asynchronous NCCL error, aborts the
// communicator (ncclCommAbort) and throws: a GPU hang becomes a clean
// worker failure the agent restarts, as torch's NCCL watchdog makes it.
// With an AbortSource (rank scope) a failure announced on the recovery
// channel aborts it the same way, at once: NCCL kernels waiting on a dead
// peer never finish by themselves.
//
// Built only when CUDA, NCCL and a CUDA-enabled LibTorch are found
// (DDPRUN_WITH_NCCL); elsewhere `--backend nccl` is refused by the trainer.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "trainer/abort_source.h"
#include "trainer/communicator.h"

namespace c10d {
class Store;
}

namespace ddprun::trainer {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;                  // CUDA device index (LOCAL_RANK)
  std::string key_prefix = "ddprun_train/";
  std::chrono::milliseconds timeout = std::chrono::seconds(300);  // --collective-timeout
  // --restart-scope=rank: a wait also polls this; once it asks, the
  // communicator is aborted (ncclCommAbort) and the wait throws
  // CollectiveAborted (abort_source.h). nullptr: as before.
  AbortSource* abort = nullptr;
};

// Whether this build has the NCCL backend and a GPU is visible; `why` gets
// the reason when not.
bool nccl_available(std::string* why);

// Throws TrainerError when this build has no NCCL backend.
std::unique_ptr<Communicator> make_nccl_communicator(c10d::Store& store,
                                                     const NcclOptions& options);

}  // namespace ddprun::trainer
