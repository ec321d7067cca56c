// A one-rank ddprun job whose Python worker beats until told to stop, with a
// registry of its own, started and waited for: the fixture of the control
// socket tests (status_test.cc, other_user_test.cc).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

#include "introspect/registry.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

namespace ddprun::testing {

struct OneRankJob {
  // run_prefix names the job (its --rdzv-id is run_prefix-<test pid>).
  explicit OneRankJob(const std::string& run_prefix)
      : registry(made_private(dir.file("registry"))),
        until(dir.file("until")),
        run_id(run_prefix + "-" + std::to_string(::getpid())),
        job({"--nproc-per-node", "1", "--rdzv-id", run_id,
             std::string(INTROSPECT_SCRIPTS) + "/beating_worker.py", "--until", until},
            {"DDPRUN_REGISTRY_DIR=" + registry, "DDPRUN_PYTHON=/usr/bin/python3"}) {
    REQUIRE(job.wait_for_stdout(
        [](const std::string& o) { return o.find("ready 0") != std::string::npos; },
        std::chrono::seconds(60)));
    const auto agents = ddprun::introspect::list_agents(registry, run_id);
    REQUIRE(agents.size() == 1);
    socket = agents[0].socket;
  }

  // Lets the worker end; the job is then expected to finish with 0.
  void finish() {
    std::ofstream(until).put('\n');
    CHECK(job.finish(std::chrono::seconds(60)).status == 0);
  }

  TempDir dir;
  std::string registry, until, run_id;
  DdprunProcess job;
  std::string socket;  // the agent's control socket

 private:
  static std::string made_private(const std::string& path) {
    ::mkdir(path.c_str(), 0700);
    return path;
  }
};

}  // namespace ddprun::testing
