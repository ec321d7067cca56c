// base/recovery_wire.h: the recovery channel's packets (docs/RECOVERY.md),
// formatted and parsed; what a malformed packet is.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "base/recovery_wire.h"

namespace wire = ddprun::base::recovery_wire;

TEST_CASE("recovery packets round-trip: failed, ready, recovered, fallback, joined, assign") {
  wire::Message m;
  m.event = wire::Event::kFailed;
  m.generation = 3;
  m.ranks = {1, 7};
  m.cause = wire::Cause::kHang;
  CHECK(wire::format(m) == "event=failed generation=3 ranks=1,7 cause=hang");
  auto back = wire::parse(wire::format(m));
  REQUIRE(back);
  CHECK(back->event == wire::Event::kFailed);
  CHECK(back->generation == 3);
  CHECK(back->ranks == std::vector<int>{1, 7});
  CHECK(back->cause == wire::Cause::kHang);
  wire::Message f;
  f.event = wire::Event::kFallback;
  f.reason = wire::Fallback::kSecondFailure;
  CHECK(wire::format(f) == "event=fallback reason=second_failure");
  auto j = wire::parse("event=joined generation=2 rank=5\n");  // a newline is allowed
  REQUIRE(j);
  CHECK(j->event == wire::Event::kJoined);
  CHECK(j->generation == 2);
  CHECK(j->rank == 5);
  wire::Message a;
  a.event = wire::Event::kAssign;
  a.generation = 1;
  a.rank = 3;
  a.local_rank = 1;
  CHECK(wire::format(a) == "event=assign generation=1 rank=3 local_rank=1");
  auto as = wire::parse(wire::format(a));
  REQUIRE(as);
  CHECK(as->rank == 3);
  CHECK(as->local_rank == 1);
  CHECK(as->generation == 1);
  CHECK_FALSE(wire::parse("event=assign local_rank=-1"));
}

TEST_CASE("recovery packets: unknown keys and order are free; malformed ones are rejected") {
  auto m = wire::parse("rank=4 future=yes  event=joined generation=1");
  REQUIRE(m);
  CHECK(m->rank == 4);
  CHECK(m->generation == 1);
  CHECK_FALSE(wire::parse(""));
  CHECK_FALSE(wire::parse("generation=1 rank=0"));          // no event
  CHECK_FALSE(wire::parse("event=joined generation=x"));    // not a number
  CHECK_FALSE(wire::parse("event=joined generation=-1"));
  CHECK_FALSE(wire::parse("event=joined rank=16777216"));   // past kMaxRank
  CHECK_FALSE(wire::parse("event=failed ranks=1,,2"));
  CHECK_FALSE(wire::parse("event=joined junk"));            // not key=value
  CHECK_FALSE(wire::parse("event="));
  CHECK_FALSE(wire::parse("event=joined " + std::string(600, 'x') + "=1"));  // over 512 bytes
}

namespace {

// A cases-file packet: "\n", "\t" and "\xHH" escapes decoded.
std::string unescape(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
    } else if (text[i + 1] == 'n' || text[i + 1] == 't') {
      out += text[++i] == 'n' ? '\n' : '\t';
    } else if (text[i + 1] == 'x' && i + 3 < text.size()) {
      out += static_cast<char>(std::stoi(text.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("recovery packets: every event, cause and fallback reason reads back as itself; words "
          "not known here read as other, none and unknown") {
  for (auto e : {wire::Event::kFailed, wire::Event::kReady, wire::Event::kRecovered,
                 wire::Event::kFallback, wire::Event::kJoined, wire::Event::kAssign}) {
    wire::Message m;
    m.event = e;
    m.generation = 1;
    m.ranks = {0};
    m.rank = 0;
    m.local_rank = 0;
    CAPTURE(wire::name(e));
    const auto back = wire::parse(wire::format(m));
    REQUIRE(back);
    CHECK(back->event == e);
  }
  for (auto f : {wire::Fallback::kSecondFailure, wire::Fallback::kNoRestartLeft,
                 wire::Fallback::kNoRestartExitCode, wire::Fallback::kTimeout,
                 wire::Fallback::kGroupStopped, wire::Fallback::kSpawnFailed,
                 wire::Fallback::kStoreLost}) {
    wire::Message m;
    m.event = wire::Event::kFallback;
    m.reason = f;
    CAPTURE(wire::name(f));
    CHECK(wire::parse(wire::format(m))->reason == f);
  }
  const auto later = wire::parse("event=migrated generation=2 cause=oom reason=x");
  REQUIRE(later);
  CHECK(later->event == wire::Event::kOther);
  CHECK(later->cause == wire::Cause::kNone);
  const auto fb = wire::parse("event=fallback reason=preempted");
  REQUIRE(fb);
  CHECK(fb->reason == wire::Fallback::kOther);
  CHECK(wire::name(fb->reason) == "unknown");
}

TEST_CASE("recovery packets: the verdicts of recovery_wire_cases.txt, which the Python parser "
          "reaches too") {
  std::ifstream in(RECOVERY_WIRE_CASES);
  REQUIRE(in.good());
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.find(' ');
    const std::string verdict = line.substr(0, space);
    REQUIRE((verdict == "accept" || verdict == "reject"));
    const std::string packet = space == std::string::npos ? "" : unescape(line.substr(space + 1));
    CAPTURE(line);
    CHECK(wire::parse(packet).has_value() == (verdict == "accept"));
    ++cases;
  }
  CHECK(cases > 30);
}
