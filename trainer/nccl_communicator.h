// Communicator over NCCL, called directly (CUDA tensors).
//
// Rank 0 draws an ncclUniqueId and publishes it in the store under
// "<key_prefix>nccl_id"; the others read it (store timeout) and every rank
// calls ncclCommInitRank on device `device`. Collectives run on a stream of
// their own: each waits for LibTorch's default stream (an event), and a
// handle's wait() makes the default stream wait for the collective, so the
// host never blocks on an all-reduce and later kernels see its result.
//
// Built only when CUDA, NCCL and a CUDA-enabled LibTorch are found
// (DDPRUN_WITH_NCCL); elsewhere `--backend nccl` is refused by the trainer.
#pragma once

#include <chrono>
#include <memory>
#include <string>

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
};

// Whether this build has the NCCL backend and a GPU is visible; `why` gets
// the reason when not.
bool nccl_available(std::string* why);

// Throws TrainerError when this build has no NCCL backend.
std::unique_ptr<Communicator> make_nccl_communicator(c10d::Store& store,
                                                     const NcclOptions& options);

}  // namespace ddprun::trainer
