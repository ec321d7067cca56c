// The watchdog's guard record (watchdog/guard_record.h) on record.h's
// codec, and two nodes' PeerGuards exchanging it through a real ddprun
// store: what one node publishes reaches the other field for field.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "rendezvous/record.h"
#include "tests/rendezvous/test_util.h"
#include "watchdog/guard_record.h"
#include "watchdog/heartbeat_wire.h"
#include "watchdog/peer_guards.h"

namespace wd = ddprun::watchdog;
using ddprun::rendezvous::RecordError;
using ddprun::rendezvous::testing::ServerThread;
using namespace std::chrono_literals;

namespace {

wd::NodeRecord full_record() {
  wd::NodeRecord r;
  r.guards = {{0, "checkpoint", 41'500ms}, {1, "setup", -250ms}};  // a guard may be just past
  r.stall = wd::PeerStall{3, 1207, 2'250ms};
  r.blamed = {3, 5};
  return r;
}

}  // namespace

TEST_CASE("a guard record reads back field for field, with or without a stall") {
  const auto bytes = wd::encode_guards(9, full_record());
  const wd::NodeGuards back = wd::decode_guards(2, bytes);
  CHECK(back.node == 2);
  CHECK(back.seq == 9);
  CHECK(back.record == full_record());

  const wd::NodeRecord bare{{{4, "eval", 1'000ms}}, std::nullopt, {}};
  CHECK(wd::decode_guards(0, wd::encode_guards(1, bare)).record == bare);
  CHECK(wd::decode_guards(0, wd::encode_guards(1, {})).record == wd::NodeRecord{});

  // A section longer than the heartbeat wire allows is cut, never refused.
  wd::NodeRecord long_section{{{0, std::string(40, 's'), 1ms}}, std::nullopt, {}};
  CHECK(wd::decode_guards(0, wd::encode_guards(1, long_section)).record.guards[0].section ==
        std::string(wd::heartbeat_wire::kMaxSectionBytes, 's'));
  wd::NodeRecord bad_rank{{{-1, "x", 1ms}}, std::nullopt, {}};
  CHECK_THROWS_WITH_AS(wd::encode_guards(1, bad_rank), doctest::Contains("rank -1"), RecordError);
}

TEST_CASE("a damaged guard record is refused, naming the node and the defect") {
  const auto whole = wd::encode_guards(9, full_record());
  for (size_t n = 0; n < whole.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(wd::decode_guards(1, {whole.begin(), whole.begin() + n}), RecordError);
  }
  auto trailing = whole;
  trailing.push_back(0);
  CHECK_THROWS_WITH_AS(wd::decode_guards(1, trailing),
                       "node 1's guard record: 1 bytes after its end", RecordError);
  // The JSON this record was before: a node running an older ddprun.
  const std::string json = R"({"seq":1,"guards":[]})";
  CHECK_THROWS_WITH_AS(wd::decode_guards(1, {json.begin(), json.end()}),
                       doctest::Contains("no DWG magic"), RecordError);
  // The stall flag sits after the two guards: 14 header bytes, then per
  // guard rank 4 + length 2 + section + remaining 8.
  auto flag = whole;
  flag[14 + (4 + 2 + 10 + 8) + (4 + 2 + 5 + 8)] = 2;
  CHECK_THROWS_WITH_AS(wd::decode_guards(1, flag), doctest::Contains("stall flag 2"), RecordError);
  auto rank = whole;
  rank[14] = 0xff;  // the first guard's rank, far past kMaxRank
  CHECK_THROWS_WITH_AS(wd::decode_guards(1, rank), doctest::Contains("guard rank"), RecordError);
}

TEST_CASE("two nodes' PeerGuards exchange their records through the job's store") {
  ServerThread store;
  const std::string addr = "127.0.0.1:" + std::to_string(store.port());
  std::promise<std::vector<wd::NodeGuards>> seen;
  auto got = seen.get_future();
  bool delivered = false;  // on node 1's PeerGuards thread only
  wd::PeerGuards reader({addr, "", "job/round_0/", 1, 2}, [&](std::vector<wd::NodeGuards> fresh) {
    if (delivered) return;
    delivered = true;
    seen.set_value(std::move(fresh));
  });
  wd::PeerGuards writer({addr, "", "job/round_0/", 0, 2}, [](std::vector<wd::NodeGuards>) {});
  writer.publish(full_record());
  REQUIRE(got.wait_for(30s) == std::future_status::ready);
  const auto fresh = got.get();
  REQUIRE(fresh.size() == 1);
  CHECK(fresh[0].node == 0);
  CHECK(fresh[0].seq == 1);
  CHECK(fresh[0].record == full_record());
}
