// The job protocol's steps on a Store (job_protocol.h).
#include <algorithm>
#include <chrono>

#include "rendezvous/job_protocol.h"

namespace ddprun::rendezvous {
namespace {
using Clock = std::chrono::steady_clock;
// How long linger() blocks at once before it looks again at who is gone.
constexpr Duration kLingerSlice{100};
}  // namespace

bool publish_end(Store& store, const JobKeys& keys, int64_t r, const RoundEnd& end) {
  const Bytes desired = encode_round_end(end);
  if (store.compare_set(keys.end(r), {}, desired) != desired) return false;
  if (end.spends_restart()) store.add(keys.restarts(), 1);
  return true;
}

std::optional<RoundEnd> read_end(Store& store, const JobKeys& keys, int64_t r) {
  if (!store.check({keys.end(r)})) return std::nullopt;
  return decode_round_end(store.get(keys.end(r), Duration(0)));
}

RoundEnd await_end(Store& store, const JobKeys& keys, int64_t r, const std::string& node,
                   Duration timeout) {
  Bytes value = store.get(keys.end(r), timeout);
  // Acknowledged before decoding: a record this node cannot read still
  // tells the host that nobody here waits for it any longer.
  try {
    store.set(keys.end_seen(r, node), to_bytes("1"));
  } catch (const StoreError&) {
  }
  return decode_round_end(value);
}

std::vector<std::string> linger(Store& store, const JobKeys& keys, int64_t r,
                                const std::vector<std::string>& peers, Duration limit) {
  const auto deadline = Clock::now() + limit;
  std::vector<std::string> pending = peers;
  while (!pending.empty()) {
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [&](const std::string& n) {
                                   return store.check({keys.end_seen(r, n)}) ||
                                          store.check({keys.dead(r, n)});
                                 }),
                  pending.end());
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    if (pending.empty() || left.count() <= 0) break;
    std::vector<std::string> acks;
    for (const auto& n : pending) acks.push_back(keys.end_seen(r, n));
    try {
      store.wait(acks, std::min(left, kLingerSlice));
      pending.clear();  // every pending peer read it
    } catch (const TimeoutError&) {
    }
  }
  return pending;
}

std::optional<bool> outcomes_within(Store& store, const JobKeys& keys, int64_t r,
                                    const std::vector<std::string>& nodes, Duration slice) {
  std::vector<std::string> wanted;
  for (const auto& n : nodes) wanted.push_back(keys.outcome(r, n));
  try {
    auto values = store.multi_get(wanted, slice);
    return std::all_of(values.begin(), values.end(), [](const Bytes& v) { return v == outcome_ok(); });
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

bool publish_rank_failure(Store& store, const JobKeys& keys, int64_t r, const RankFailure& failure) {
  const Bytes desired = encode_rank_failure(failure);
  return store.compare_set(keys.rank_failure(r, failure.generation), {}, desired) == desired;
}

std::optional<RankFailure> read_rank_failure(Store& store, const JobKeys& keys, int64_t r,
                                             int64_t g) {
  if (!store.check({keys.rank_failure(r, g)})) return std::nullopt;
  return decode_rank_failure(store.get(keys.rank_failure(r, g), Duration(0)));
}

RankFailure await_rank_failure(Store& store, const JobKeys& keys, int64_t r, int64_t g,
                               Duration timeout) {
  return decode_rank_failure(store.get(keys.rank_failure(r, g), timeout));
}

std::optional<RankFailure> watch_rank_failure(Store& store, const JobKeys& keys, int64_t r,
                                              int64_t g, const std::function<bool()>& stop,
                                              Duration slice) {
  while (!stop()) {
    try {
      return await_rank_failure(store, keys, r, g, slice);
    } catch (const TimeoutError&) {
      // not yet: look at `stop` again
    }
  }
  return std::nullopt;
}

void publish_generation_joined(Store& store, const JobKeys& keys, int64_t r, int64_t g,
                               int nodes) {
  if (store.add(keys.generation_joined(r, g), 1) >= nodes)
    store.set(keys.generation_formed(r, g), to_bytes("1"));
}

bool generation_formed_within(Store& store, const JobKeys& keys, int64_t r, int64_t g,
                              Duration slice) {
  try {
    store.wait({keys.generation_formed(r, g)}, slice);
    return true;
  } catch (const TimeoutError&) {
    return false;
  }
}

}  // namespace ddprun::rendezvous
