// Distributed sampler over global sample indices.
//
// The job reads one global stream of sample indices: epoch e is a
// permutation of [0, N) drawn from (seed, e), and stream position p holds
// perm_{p / N}[p % N]. A step consumes batch * world positions; rank r takes
// the r-th slice of `batch`. The only state is the position (global samples
// consumed), so a restart that resumes at the checkpointed position with a
// different world size neither repeats nor skips a sample within the epoch.
//
// The shuffle is our own (splitmix64 + Fisher-Yates with rejection), not
// std::shuffle, so every platform and standard library draws the same order.
// Thread-compatible: one sampler per thread.
#pragma once

#include <cstdint>
#include <vector>

namespace ddprun::trainer {

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, uint64_t seed);

  int64_t dataset_size() const { return n_; }

  // The sample index at global stream position `position`.
  int64_t index_at(int64_t position);

  // Writes the `batch` indices rank `rank` trains on in the step that starts
  // at global position `position`: positions [position + rank * batch,
  // position + (rank + 1) * batch).
  void rank_batch(int64_t position, int rank, int64_t batch, int64_t* out);

  // The permutation of one epoch (exposed for tests).
  const std::vector<int64_t>& permutation(int64_t epoch);

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace ddprun::trainer
