// One Attempt on a fake launcher and a ManualClock, with a hook that
// records what the attempt tells it: the fixture of attempt_test.cc and
// attempt_recovery_test.cc.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <optional>
#include <vector>

#include "agent/attempt.h"
#include "base/clock.h"
#include "base/duration.h"
#include "tests/agent/fake_launcher.h"
#include "tests/common/temp_dir.h"

namespace ddprun::agent::test {

namespace ag = ddprun::agent;

// Records what the attempt tells its hooks.
struct Recorder : ag::AgentHooks {
  ag::AttemptControl* control = nullptr;
  std::vector<int> exited;  // local ranks, in order
  std::vector<ag::RecoveryEvent> recoveries;
  std::optional<ag::Failure> failed;
  std::optional<ag::AttemptResult> ended;
  void workers_started(const ag::AttemptInfo&, ag::AttemptControl& c) override { control = &c; }
  void worker_exited(const ag::WorkerEnd& end) override { exited.push_back(end.worker.local_rank); }
  void attempt_failed(const ag::Failure& root) override { failed = root; }
  void attempt_ended(const ag::AttemptResult& result) override { ended = result; }
  void recovery(const ag::RecoveryEvent& e) override { recoveries.push_back(e); }
};

// One attempt of `workers` workers, with its fakes.
struct Harness {
  // `tweak` changes the options before the attempt is made.
  // `tweak_setup` changes the attempt's setup (a multi-node round).
  explicit Harness(int workers, double term_timeout_s = 5.0,
                   const std::function<void(ag::Options&)>& tweak = {},
                   const std::function<void(ag::AttemptSetup&)>& tweak_setup = {}) {
    options.command = {"/bin/true"};
    options.term_timeout = ddprun::base::millis_from_seconds(term_timeout_s);
    options.nproc_per_node = workers;
    if (tweak) tweak(options);
    ag::AttemptSetup setup;
    setup.round.local_world_size = workers;
    setup.round.world_size = workers;
    setup.run_id = "unit";
    setup.run_dir = dir.path();
    setup.runtime_dir = dir.path();
    setup.program_path = "/bin/true";
    if (tweak_setup) tweak_setup(setup);
    attempt.emplace(io, clock, launcher, options, setup, std::vector<ag::AgentHooks*>{&hooks});
  }
  // Starts the workers; their pipes (held by no process) reach EOF at once.
  void start() {
    attempt->start();
    io.poll();
  }
  void reap() {
    launcher.reap(*attempt);
    io.poll();
  }

  ddprun::testing::TempDir dir;
  boost::asio::io_context io;
  ddprun::base::ManualClock clock;
  FakeLauncher launcher;
  ag::Options options;
  Recorder hooks;
  std::optional<ag::Attempt> attempt;
};

}  // namespace ddprun::agent::test
