// The seams other components plug into, exercised in process with real
// workers: hooks see every step, a hook can fail the attempt with its own
// reason after signalling chosen workers, and the restart policy decides.
#include <doctest/doctest.h>
#include <signal.h>

#include <boost/asio/steady_timer.hpp>

#include "agent/agent.h"

extern char** environ;

using namespace ddprun::agent;

namespace {

Options block_options() {
  Options o;
  o.nproc_per_node = 2;
  o.command = {TEST_WORKER, "block"};
  o.term_timeout = std::chrono::seconds(5);
  o.signals_to_handle = {SIGINT, SIGTERM};
  for (char** e = environ; *e; ++e) o.base_env.emplace_back(*e);
  return o;
}

// Fails the attempt once every worker has said "ready": SIGUSR1 to local
// rank 1 first, then the normal teardown.
class HangHook : public AgentHooks {
 public:
  void add_worker_env(const AttemptInfo&, int local_rank, EnvMap& env) override {
    env["HOOK_VAR"] = std::to_string(local_rank);
    ++env_calls;
  }
  void workers_started(const AttemptInfo& a, AttemptControl& c) override {
    started = static_cast<int>(a.workers.size());
    control = &c;
  }
  void output(int, Stream stream, std::string_view data) override {
    if (stream == Stream::kStdout) ready += static_cast<int>(count(data));
    if (ready == 2 && control) {
      FailRequest req;
      req.reason = "hang: rank 1 missed heartbeats for 5 s";
      req.local_rank = 1;
      req.exit_code = 5;
      req.signal = SIGUSR1;
      req.targets = {1};
      control->fail_attempt(req);
      control = nullptr;
    }
  }
  void worker_exited(const WorkerEnd& end) override { ends.push_back(end); }
  void attempt_ended(const AttemptResult& r) override { results.push_back(r); }

  static size_t count(std::string_view data) {
    size_t n = 0;
    for (size_t pos = data.find("ready"); pos != std::string_view::npos;
         pos = data.find("ready", pos + 1))
      ++n;
    return n;
  }

  int env_calls = 0;
  int started = 0;
  int ready = 0;
  AttemptControl* control = nullptr;
  std::vector<WorkerEnd> ends;
  std::vector<AttemptResult> results;
};

class CountingPolicy : public RestartPolicy {
 public:
  RestartDecision decide(const AttemptResult&, int) override {
    ++calls;
    return {false, std::chrono::milliseconds(0), "custom policy says stop"};
  }
  int calls = 0;
};

}  // namespace

TEST_CASE("a hook fails the attempt with its reason after signalling chosen workers") {
  HangHook hook;
  auto policy = std::make_unique<CountingPolicy>();
  CountingPolicy* p = policy.get();
  Agent agent(block_options(), nullptr, std::move(policy));
  agent.add_hooks(&hook);
  int status = agent.run();
  CHECK(status == 5);
  CHECK(hook.env_calls == 2);
  CHECK(hook.started == 2);
  CHECK(p->calls == 1);
  REQUIRE(hook.results.size() == 1);
  const AttemptResult& r = hook.results[0];
  CHECK(r.outcome == Outcome::kFailed);
  REQUIRE(r.root);
  CHECK(r.root->reason == "hang: rank 1 missed heartbeats for 5 s");
  REQUIRE(r.ends.size() == 2);
  // Rank 1 got the chosen signal first; rank 0 then the normal SIGTERM.
  CHECK(r.ends[0].worker.local_rank == 1);
  CHECK(r.ends[0].status.describe() == "signal SIGUSR1");
  CHECK(r.ends[1].worker.local_rank == 0);
  CHECK(r.ends[1].status.describe() == "signal SIGTERM");
}
