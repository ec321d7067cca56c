#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "trainer/sampler.h"

using ddprun::trainer::DistributedSampler;

namespace {

// The indices all ranks of `world` take in steps starting at `from` until
// `to` global samples are consumed.
std::vector<int64_t> consume(DistributedSampler& s, int world, int64_t batch, int64_t from,
                             int64_t to) {
  std::vector<int64_t> got;
  std::vector<int64_t> buf(batch);
  for (int64_t pos = from; pos < to; pos += batch * world) {
    for (int r = 0; r < world; ++r) {
      s.rank_batch(pos, r, batch, buf.data());
      got.insert(got.end(), buf.begin(), buf.end());
    }
  }
  return got;
}

}  // namespace

TEST_CASE("sampler: each epoch is a permutation, different per epoch and seed") {
  DistributedSampler s(1500, 7);
  std::vector<int64_t> e0 = s.permutation(0);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1500; ++i) REQUIRE(sorted[i] == i);
  CHECK(e0 != s.permutation(1));
  DistributedSampler other(1500, 8);
  CHECK(e0 != other.permutation(0));
  DistributedSampler again(1500, 7);
  CHECK(e0 == again.permutation(0));
}

TEST_CASE("sampler: ranks of one step take disjoint slices that cover the epoch") {
  const int64_t n = 96;
  for (int world : {1, 2, 3, 4}) {
    DistributedSampler s(n, 1);
    std::vector<int64_t> got = consume(s, world, 4, 0, n);
    CHECK(int64_t(got.size()) == n);
    CHECK(std::set<int64_t>(got.begin(), got.end()).size() == size_t(n));
    // Rank r of a step reads exactly stream positions [pos + r*b, pos + (r+1)*b).
    std::vector<int64_t> buf(4);
    s.rank_batch(8 * world, world - 1, 4, buf.data());
    for (int i = 0; i < 4; ++i) CHECK(buf[i] == s.index_at(8 * world + (world - 1) * 4 + i));
  }
}

TEST_CASE("sampler: a restart with another world size neither repeats nor skips") {
  const int64_t n = 120;
  DistributedSampler s(n, 3);
  // 2 ranks x batch 6 for 4 steps (48 samples), then 3 ranks x batch 4 to the end.
  std::vector<int64_t> first = consume(s, 2, 6, 0, 48);
  DistributedSampler restarted(n, 3);
  std::vector<int64_t> rest = consume(restarted, 3, 4, 48, n);
  std::vector<int64_t> all = first;
  all.insert(all.end(), rest.begin(), rest.end());
  CHECK(all.size() == size_t(n));
  CHECK(std::set<int64_t>(all.begin(), all.end()).size() == size_t(n));
  CHECK(all == s.permutation(0));
}

TEST_CASE("sampler: a step crossing the epoch boundary continues with the next epoch") {
  DistributedSampler s(10, 5);
  std::vector<int64_t> buf(4);
  s.rank_batch(8, 0, 4, buf.data());
  CHECK(buf[0] == s.permutation(0)[8]);
  CHECK(buf[1] == s.permutation(0)[9]);
  CHECK(buf[2] == s.permutation(1)[0]);
  CHECK(buf[3] == s.permutation(1)[1]);
}
