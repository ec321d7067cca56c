#include "trainer/sampler.h"

#include "trainer/error.h"

#include <string>

namespace ddprun::trainer {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias.
uint64_t uniform_below(uint64_t& state, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = splitmix64(state);
  } while (x >= limit);
  return x % bound;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, uint64_t seed)
    : n_(dataset_size), seed_(seed) {
  if (n_ <= 0) throw TrainerError("sampler: empty data set");
}

const std::vector<int64_t>& DistributedSampler::permutation(int64_t epoch) {
  if (epoch == cached_epoch_) return perm_;
  perm_.resize(n_);
  for (int64_t i = 0; i < n_; ++i) perm_[i] = i;
  uint64_t state = seed_ * 0x2545F4914F6CDD1DULL ^ (uint64_t(epoch) + 0x632BE59BD9B4E019ULL);
  for (int64_t i = n_ - 1; i > 0; --i) {
    const int64_t j = int64_t(uniform_below(state, uint64_t(i) + 1));
    std::swap(perm_[i], perm_[j]);
  }
  cached_epoch_ = epoch;
  return perm_;
}

int64_t DistributedSampler::index_at(int64_t position) {
  if (position < 0) throw TrainerError("sampler: negative position " + std::to_string(position));
  return permutation(position / n_)[position % n_];
}

void DistributedSampler::rank_batch(int64_t position, int rank, int64_t batch,
                                    int64_t* out) {
  const int64_t start = position + int64_t(rank) * batch;
  for (int64_t i = 0; i < batch; ++i) out[i] = index_at(start + i);
}

}  // namespace ddprun::trainer
