// Communicator for ranks on one host, through shared memory.
//
// Gloo over loopback TCP spends milliseconds a step copying a 1 MB gradient
// through the kernel on a 2-core machine; ranks that share a host can sum
// in shared memory instead. Rank 0 creates a POSIX shm segment (name shared
// through the store, unlinked once every rank mapped it): a header with a
// barrier, then one slot per rank. All-reduce, per chunk of a slot: each
// rank copies its chunk in, barrier, rank r sums portion r over all slots in
// rank order (so every rank ends with the same bits), barrier, each rank
// copies every portion out, barrier.
//
// Collectives run in order on one worker thread, so allreduce_async returns
// at once and buckets overlap backward as with Gloo. Every barrier has the
// communicator's deadline, and a waiting rank checks every 100 ms whether a
// peer process died (its pid is in the header), failing the collective
// rather than waiting out the deadline.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "trainer/communicator.h"

namespace c10d {
class Store;
}

namespace ddprun::trainer {

struct ShmOptions {
  int rank = 0;
  int world_size = 1;
  int64_t slot_bytes = 4 << 20;  // per-rank staging area; larger tensors go in chunks
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  std::string key_prefix = "ddprun_train/";  // store key for the segment name
};

std::unique_ptr<Communicator> make_shm_communicator(c10d::Store& store, const ShmOptions& options);

}  // namespace ddprun::trainer
