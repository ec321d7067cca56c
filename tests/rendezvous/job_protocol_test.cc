// The job protocol's record codec and steps (rendezvous/job_protocol.h):
// a round's end written by one node is read back, field for field, by the
// others; anything that is not such a record is rejected with a clear
// error; the host's linger ends when every peer has read the end or is gone.
#include <doctest/doctest.h>

#include <atomic>
#include <future>

#include "rendezvous/hash_store.h"
#include "rendezvous/job_protocol.h"
#include "rendezvous/rendezvous_error.h"
#include "test_util.h"

using namespace ddprun::rendezvous;
using namespace std::chrono_literals;

namespace {

RoundEnd signalled() {
  RoundEnd e;
  e.kind = RoundEnd::kSignalled;
  e.exit_status = 130;
  e.signal = 2;
  e.node = "vm:123:abcd";
  e.reason = "node vm:123:abcd at 10.0.0.1: its agent was stopped by SIGINT";
  e.store_closes = true;
  e.forward_signal = true;
  return e;
}

void check_same(const RoundEnd& a, const RoundEnd& b) {
  CHECK(a.kind == b.kind);
  CHECK(a.exit_status == b.exit_status);
  CHECK(a.signal == b.signal);
  CHECK(a.node == b.node);
  CHECK(a.reason == b.reason);
  CHECK(a.store_closes == b.store_closes);
  CHECK(a.forward_signal == b.forward_signal);
}

}  // namespace

TEST_CASE("a round end record reads back field for field, for every kind") {
  for (auto kind : {RoundEnd::kFailed, RoundEnd::kScaleUp, RoundEnd::kPeerDead,
                    RoundEnd::kStoreLost, RoundEnd::kSignalled}) {
    RoundEnd e = signalled();
    e.kind = kind;
    e.store_closes = kind == RoundEnd::kSignalled;
    CAPTURE(kind_name(kind));
    check_same(decode_round_end(encode_round_end(e)), e);
  }
  RoundEnd empty;  // no node, no reason
  check_same(decode_round_end(encode_round_end(empty)), empty);
}

TEST_CASE("a round end record keeps its limits: long fields are cut, bad numbers refused") {
  RoundEnd e = signalled();
  e.reason = std::string(kMaxEndReason + 100, 'r');
  e.node = std::string(kMaxEndNode + 1, 'n');
  RoundEnd back = decode_round_end(encode_round_end(e));
  CHECK(back.reason == std::string(kMaxEndReason, 'r'));
  CHECK(back.node == std::string(kMaxEndNode, 'n'));
  e = signalled();
  e.exit_status = 256;
  CHECK_THROWS_WITH_AS(encode_round_end(e), doctest::Contains("exit status 256"), RecordError);
  e = signalled();
  e.signal = -1;
  CHECK_THROWS_WITH_AS(encode_round_end(e), doctest::Contains("signal -1"), RecordError);
}

TEST_CASE("a truncated round end record is refused at every length, naming what is missing") {
  const Bytes whole = encode_round_end(signalled());
  for (size_t n = 0; n < whole.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(decode_round_end(Bytes(whole.begin(), whole.begin() + n)), RecordError);
  }
  CHECK_THROWS_WITH_AS(decode_round_end(Bytes(whole.begin(), whole.begin() + 4)),
                       doctest::Contains("shorter than its 8-byte header"), RecordError);
  CHECK_THROWS_WITH_AS(decode_round_end(Bytes(whole.begin(), whole.begin() + 12)),
                       doctest::Contains("truncated inside the node id"), RecordError);
}

TEST_CASE("an oversized, garbled or foreign round end record is refused with its defect named") {
  const Bytes good = encode_round_end(signalled());
  Bytes trailing = good;
  trailing.push_back(0);
  CHECK_THROWS_WITH_AS(decode_round_end(trailing), doctest::Contains("1 bytes after its end"),
                       RecordError);
  Bytes huge = good;  // a reason length past the limit
  const size_t reason_len_at = 8 + 2 + signalled().node.size();
  huge[reason_len_at] = 0xff;
  huge[reason_len_at + 1] = 0xff;
  CHECK_THROWS_WITH_AS(decode_round_end(huge), doctest::Contains("reason of 65535 bytes, the limit is"),
                       RecordError);
  Bytes version = good;
  version[3] = 9;
  CHECK_THROWS_WITH_AS(decode_round_end(version), doctest::Contains("version 9, this ddprun reads 1"),
                       RecordError);
  Bytes kind = good;
  kind[4] = 0;
  CHECK_THROWS_WITH_AS(decode_round_end(kind), doctest::Contains("unknown kind 0"), RecordError);
  Bytes flags = good;
  flags[7] = 0x80;
  CHECK_THROWS_WITH_AS(decode_round_end(flags), doctest::Contains("unknown flags"), RecordError);
  // What ddprun wrote before the record existed: a sentence.
  CHECK_THROWS_WITH_AS(decode_round_end(to_bytes("failed: node x: worker rank 3 (exit status 7)")),
                       doctest::Contains("no DRE magic"), RecordError);
}

TEST_CASE("the first end published wins the round and counts one restart; a scale-up counts none") {
  HashStore store;
  JobKeys keys("job");
  RoundEnd first = signalled();
  RoundEnd second = signalled();
  second.node = "other";
  CHECK(publish_end(store, keys, 3, first));
  CHECK_FALSE(publish_end(store, keys, 3, second));
  CHECK(store.add(keys.restarts(), 0) == 1);
  check_same(*read_end(store, keys, 3), first);
  CHECK_FALSE(read_end(store, keys, 4));
  RoundEnd up;
  up.kind = RoundEnd::kScaleUp;
  up.exit_status = 0;
  CHECK(publish_end(store, keys, 4, up));
  CHECK(store.add(keys.restarts(), 0) == 1);
  // Reading with await_end acknowledges it for a lingering host.
  check_same(await_end(store, keys, 3, "reader", 0ms), first);
  CHECK(store.check({keys.end_seen(3, "reader")}));
}

TEST_CASE("the host's linger ends when every peer has read the end or is gone, else at its deadline") {
  HashStore store;
  JobKeys keys("job");
  publish_end(store, keys, 0, signalled());
  store.set(keys.dead(0, "gone"), to_bytes("1"));  // its connection closed
  auto reader = std::async(std::launch::async, [&] { return await_end(store, keys, 0, "peer", 10s); });
  auto left = ddprun::rendezvous::linger(store, keys, 0, {"peer", "gone"}, 30s);
  CHECK(left.empty());
  CHECK(reader.get().signal == 2);
  // A peer that never reads: linger gives up at its deadline and names it.
  CHECK(ddprun::rendezvous::linger(store, keys, 0, {"silent"}, 200ms) == std::vector<std::string>{"silent"});
}

TEST_CASE("the exit barrier's slice tells missing outcomes from failed ones") {
  HashStore store;
  JobKeys keys("job");
  CHECK_FALSE(outcomes_within(store, keys, 1, {"a", "b"}, 10ms));
  store.set(keys.outcome(1, "a"), outcome_ok());
  store.set(keys.outcome(1, "b"), outcome_ok());
  CHECK(outcomes_within(store, keys, 1, {"a", "b"}, 10ms) == std::optional<bool>(true));
  store.set(keys.outcome(1, "b"), outcome_failed());
  CHECK(outcomes_within(store, keys, 1, {"a", "b"}, 10ms) == std::optional<bool>(false));
}

namespace {
RankFailure two_ranks() {
  RankFailure f;
  f.generation = 3;
  f.ranks = {2, 5};
  f.cause = RankFailure::kHang;
  f.node = "vm:456:ef01";
  return f;
}
void check_same(const RankFailure& a, const RankFailure& b) {
  CHECK(a.generation == b.generation);
  CHECK(a.ranks == b.ranks);
  CHECK(a.cause == b.cause);
  CHECK(a.node == b.node);
}
}  // namespace

TEST_CASE("a rank failure record reads back field for field, and keeps its limits") {
  check_same(decode_rank_failure(encode_rank_failure(two_ranks())), two_ranks());
  RankFailure edge = two_ranks();
  edge.generation = kMaxGeneration;
  edge.ranks = {0, static_cast<int>(kMaxFailedRank - 1)};
  edge.cause = RankFailure::kExit;
  edge.node = std::string(kMaxEndNode + 1, 'n');
  RankFailure back = decode_rank_failure(encode_rank_failure(edge));
  CHECK(back.node == std::string(kMaxEndNode, 'n'));
  edge.node = back.node;
  check_same(back, edge);
  CHECK(std::string(cause_name(RankFailure::kHang)) == "hang");

  RankFailure bad = two_ranks();
  bad.ranks = {};
  CHECK_THROWS_WITH_AS(encode_rank_failure(bad), doctest::Contains("0 ranks"), RecordError);
  bad.ranks = {5, 2};
  CHECK_THROWS_WITH_AS(encode_rank_failure(bad), doctest::Contains("not ascending"), RecordError);
  bad.ranks = {static_cast<int>(kMaxFailedRank)};
  CHECK_THROWS_WITH_AS(encode_rank_failure(bad), doctest::Contains("outside"), RecordError);
  bad = two_ranks();
  bad.generation = -1;
  CHECK_THROWS_WITH_AS(encode_rank_failure(bad), doctest::Contains("generation -1"), RecordError);
}

TEST_CASE("a damaged rank failure record is refused, naming the defect") {
  const Bytes whole = encode_rank_failure(two_ranks());
  for (size_t n = 0; n < whole.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(decode_rank_failure(Bytes(whole.begin(), whole.begin() + n)), RecordError);
  }
  Bytes trailing = whole;
  trailing.push_back(0);
  CHECK_THROWS_WITH_AS(decode_rank_failure(trailing), doctest::Contains("1 bytes after its end"),
                       RecordError);
  Bytes version = whole;
  version[3] = 9;
  CHECK_THROWS_WITH_AS(decode_rank_failure(version), doctest::Contains("version 9"), RecordError);
  Bytes cause = whole;
  cause[4] = 7;
  CHECK_THROWS_WITH_AS(decode_rank_failure(cause), doctest::Contains("unknown cause 7"), RecordError);
  Bytes count = whole;
  count[10] = 200;  // more ranks than bytes
  CHECK_THROWS_WITH_AS(decode_rank_failure(count), doctest::Contains("truncated inside the ranks"),
                       RecordError);
  // A round's end is not a rank failure.
  CHECK_THROWS_WITH_AS(decode_rank_failure(encode_round_end(signalled())),
                       doctest::Contains("no DRF magic"), RecordError);
}

TEST_CASE("a generation opens once: a second failure loses; it is recovered when every node joined") {
  HashStore store;
  JobKeys keys("job");
  CHECK_FALSE(read_rank_failure(store, keys, 2, 3));
  CHECK_THROWS_AS(await_rank_failure(store, keys, 2, 3, 10ms), TimeoutError);
  // A peer's watcher blocks on the record and wakes when it is written.
  auto watcher = std::async(std::launch::async, [&] { return await_rank_failure(store, keys, 2, 3, 30s); });
  CHECK(publish_rank_failure(store, keys, 2, two_ranks()));
  check_same(watcher.get(), two_ranks());
  // Another node's failure for the same generation comes second: the
  // caller ends the round as a group restart instead.
  RankFailure other = two_ranks();
  other.node = "vm:789:0000";
  other.ranks = {7};
  CHECK_FALSE(publish_rank_failure(store, keys, 2, other));
  check_same(*read_rank_failure(store, keys, 2, 3), two_ranks());
  CHECK_FALSE(read_rank_failure(store, keys, 1, 3));  // rounds are apart

  CHECK_FALSE(generation_formed_within(store, keys, 2, 3, 10ms));
  publish_generation_joined(store, keys, 2, 3, 2);
  CHECK_FALSE(generation_formed_within(store, keys, 2, 3, 10ms));
  publish_generation_joined(store, keys, 2, 3, 2);
  CHECK(generation_formed_within(store, keys, 2, 3, 10ms));
  CHECK_FALSE(generation_formed_within(store, keys, 2, 4, 10ms));
}

TEST_CASE("another node's agent wakes on the failure record as the store delivers it, and stops when asked") {
  testing::ServerThread server;
  Client watcher_store(server.client_options());
  Client failing_store(server.client_options());
  JobKeys keys("job");
  std::atomic<bool> stop{false};
  // A slice far longer than the test: the watcher can return the record
  // only because the store woke its waiting get, never by looking again.
  auto watcher = std::async(std::launch::async, [&] {
    auto f = watch_rank_failure(watcher_store, keys, 0, 3, [&] { return stop.load(); }, 60s);
    return std::make_pair(f, std::chrono::steady_clock::now());
  });
  REQUIRE(server.wait_for_state([](auto& s) { return s.waiters() == 1; }));
  const auto written = std::chrono::steady_clock::now();
  REQUIRE(publish_rank_failure(failing_store, keys, 0, two_ranks()));
  auto [seen, woke] = watcher.get();
  REQUIRE(seen);
  check_same(*seen, two_ranks());
  MESSAGE("write to wake: "
          << std::chrono::duration_cast<std::chrono::microseconds>(woke - written).count() << " us");
  // Asked to stop (the round ended), it returns within one slice.
  auto idle = std::async(std::launch::async, [&] {
    return watch_rank_failure(watcher_store, keys, 0, 4, [&] { return stop.load(); }, 20ms);
  });
  REQUIRE(server.wait_for_state([](auto& s) { return s.waiters() == 1; }));
  stop = true;
  CHECK_FALSE(idle.get());
}

TEST_CASE("the round formed record reads back, and a value that is none names its key") {
  const Formed f{3, 17};
  const Formed back = decode_formed(encode_formed(f), "rdzv/j/r0/closed");
  CHECK(back.size == 3);
  CHECK(back.closer == 17);
  // The text this record was before: a node running an older ddprun.
  CHECK_THROWS_WITH_AS(decode_formed(to_bytes("3\t17"), "rdzv/j/r0/closed"),
                       doctest::Contains("rdzv/j/r0/closed: round formed record: 4 bytes"),
                       RendezvousError);
  Bytes negative = encode_formed({-1, 0});
  CHECK_THROWS_WITH_AS(decode_formed(negative, "k"), doctest::Contains("size -1"), RendezvousError);
}

TEST_CASE("the record codec: integers big-endian, texts cut at their limit, counts bounded") {
  constexpr RecordKind kind{"test record", {'T', 'S', 'T'}, 2};
  const Bytes bytes = RecordWriter(kind)
                          .u8(7)
                          .u16(0x0102)
                          .u32(0x03040506)
                          .i64(-2)
                          .text("abcdef", 4)
                          .count(2, 2, "items")
                          .take();
  CHECK(bytes == Bytes{'T', 'S', 'T', 2, 7, 1, 2, 3, 4, 5, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                       0xff, 0xfe, 0, 4, 'a', 'b', 'c', 'd', 0, 2});
  RecordReader r(bytes, kind, 5);
  CHECK(r.u8("a") == 7);
  CHECK(r.u16("b") == 0x0102);
  CHECK(r.u32("c") == 0x03040506u);
  CHECK(r.i64("d") == -2);
  CHECK_THROWS_WITH_AS(RecordReader(bytes, kind, 5).fail("x"), "test record: x", RecordError);
  CHECK(r.text(4, "e") == "abcd");
  // Two items of 1 byte promised, none left: refused before any is read.
  CHECK_THROWS_WITH_AS(r.count(2, 1, "items"),
                       doctest::Contains("truncated inside the items (0 bytes for 2 items)"),
                       RecordError);
  CHECK_THROWS_WITH_AS(RecordWriter(kind).count(3, 2, "items"),
                       "test record: 3 items, it holds at most 2", RecordError);
  RecordReader done(bytes, kind, 5);
  CHECK_THROWS_WITH_AS(done.finish(), "test record: 23 bytes after its end", RecordError);
}
