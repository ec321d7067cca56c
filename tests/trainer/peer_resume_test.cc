// Rank-scoped recovery's pieces with ranks as threads of this process:
// waits that give up when an AbortSource asks (gloo and shm, well before
// --collective-timeout), and resume_from_peer() picking the lowest rank with
// the most committed steps when survivors disagree by the step in flight.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "base/scoped_fd.h"
#include "rendezvous/hash_store.h"
#include "trainer/abort_source.h"
#include "trainer/c10d_store_adapter.h"
#include "trainer/gloo_communicator.h"
#include "trainer/resume.h"
#include "trainer/shm_communicator.h"

using namespace ddprun;
using namespace ddprun::trainer;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// The recovery channel's stand-in: fire() from any thread.
class FakeAbort : public AbortSource {
 public:
  int fd() const override { return fd_.get(); }
  bool requested() override { return fired_.load(); }
  void fire() {
    fired_.store(true);
    const uint64_t one = 1;
    REQUIRE(::write(fd_.get(), &one, sizeof one) == sizeof one);
  }

 private:
  base::ScopedFd fd_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::atomic<bool> fired_{false};
};

std::unique_ptr<Communicator> make(const std::string& backend, int rank, int world,
                                   const std::shared_ptr<rendezvous::HashStore>& ours,
                                   AbortSource* abort) {
  auto store = c10::make_intrusive<C10dStoreAdapter>(ours, 30s);
  if (backend == "gloo") {
    GlooOptions o;
    o.rank = rank;
    o.world_size = world;
    o.timeout = 30s;
    o.abort = abort;
    return std::make_unique<GlooCommunicator>(store, o);
  }
  ShmOptions o;
  o.rank = rank;
  o.world_size = world;
  o.timeout = 30s;
  o.abort = abort;
  return make_shm_communicator(*store, o);
}

// What the abort test abandons, never freed (see there).
struct Abandoned {
  std::vector<CollectiveHandle*> handles;
  std::vector<Communicator*> comms;
};
Abandoned& abandoned() {
  static auto* kept = new Abandoned;
  return *kept;
}

}  // namespace

TEST_CASE("an abort source ends a blocked all-reduce at once, not after --collective-timeout") {
  for (const std::string backend : {"gloo", "shm"}) {
    CAPTURE(backend);
    auto ours = std::make_shared<rendezvous::HashStore>();
    FakeAbort abort;
    std::unique_ptr<Communicator> comms[2];
    {
      std::thread peer([&] { comms[1] = make(backend, 1, 2, ours, nullptr); });
      comms[0] = make(backend, 0, 2, ours, &abort);
      peer.join();
    }
    // Rank 1 never joins the collective: rank 0 would wait 30 s.
    at::Tensor t = at::ones({1000});
    auto handle = comms[0]->allreduce_async(t);
    Clock::time_point fired;
    std::thread firer([&] {
      // Pacing, not synchronisation: either order passes (an abort fired
      // before the wait ends it at once); 200 ms makes the blocked case the
      // usual one.
      std::this_thread::sleep_for(200ms);
      fired = Clock::now();
      abort.fire();
    });
    // CollectiveAborted, not the 30 s timeout's error: the abort ended it
    // (the time it took is printed, not asserted).
    CHECK_THROWS_AS(handle->wait(), CollectiveAborted);
    const auto took = Clock::now() - fired;
    firer.join();
    MESSAGE(backend << ": abandoned "
                    << std::chrono::duration_cast<std::chrono::microseconds>(took).count()
                    << " us after the abort");
    // Later calls fail at once too.
    CHECK_THROWS(comms[0]->barrier());
    // Abandoned, as trainer.cc does: gloo's thread may still be in the
    // all-reduce, and the tensor and communicator stay alive for it.
    // Kept reachable from a global, so LeakSanitizer does not report them
    // and no destructor ever joins the stuck thread.
    abandoned().handles.push_back(handle.release());
    abandoned().comms.push_back(comms[0].release());
  }
}

TEST_CASE("resume_from_peer: the lowest rank with the most committed steps is the source") {
  // Rank 0 did not commit the step in flight, ranks 1 and 2 did, rank 3 is
  // the replacement: every rank ends with rank 1's state.
  const int world = 4;
  const int64_t committed[world] = {6, 7, 7, -1};
  auto ours = std::make_shared<rendezvous::HashStore>();
  std::vector<PeerResume> got(world);
  std::vector<TrainState> states(world);
  std::vector<std::string> errors(world);
  auto rank_main = [&](int rank) {
    try {
      auto comm = make("gloo", rank, world, ours, nullptr);
      TrainState& s = states[rank];
      s.params = {at::full({5, 3}, float(rank + 1)), at::full({7}, float(-rank))};
      s.momentum = {at::full({5, 3}, 0.5f * float(rank)), at::full({7}, float(rank * rank))};
      Resume mine;
      mine.position = 1000 * rank;
      mine.loss = 0.25 * rank;
      got[rank] = resume_from_peer(*comm, s, at::Device(at::kCPU), committed[rank], mine);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(errors[r] == "");
    CHECK(got[r].source == 1);
    CHECK(got[r].resume.step == 7);
    CHECK(got[r].resume.position == 1000);
    CHECK(got[r].resume.loss == 0.25);
    CHECK(states[r].params[0].equal(at::full({5, 3}, 2.0f)));
    CHECK(states[r].params[1].equal(at::full({7}, -1.0f)));
    CHECK(states[r].momentum[0].equal(at::full({5, 3}, 0.5f)));
    CHECK(states[r].momentum[1].equal(at::full({7}, 1.0f)));
  }
}

TEST_CASE("resume_from_peer: a generation of replacements only is refused in one line") {
  auto ours = std::make_shared<rendezvous::HashStore>();
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    try {
      auto comm = make("gloo", rank, 2, ours, nullptr);
      TrainState s;
      s.params = {at::zeros({3})};
      resume_from_peer(*comm, s, at::Device(at::kCPU), -1, Resume{});
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread r0(rank_main, 0), r1(rank_main, 1);
  r0.join();
  r1.join();
  for (const std::string& e : errors) CHECK(e.find("no rank of the new generation holds") != std::string::npos);
}
