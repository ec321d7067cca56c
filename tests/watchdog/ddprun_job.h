// One ddprun run of the watchdog's end-to-end tests (integration_test,
// freeze_test), each in a fresh folder: the logs under <dir>/logs, the
// console in <dir>/ddprun.stderr and .stdout, and what the checks read
// back: the run folder, an attempt's folder, its hang report. Each test
// builds its own command line; how it is run and waited for is here.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/run_folder.h"
#include "tests/common/slurp.h"
#include "tests/common/test_python.h"
#include "tests/watchdog/test_util.h"

namespace ddprun::watchdog::testing {

struct DdprunJob {
  // `rdzv_id`: the --rdzv-id the test passes, which names the run folder.
  explicit DdprunJob(std::string rdzv_id) : rdzv_id(std::move(rdzv_id)) {}

  TempDir dir;
  std::string rdzv_id;
  int exit_code = -1;  // ddprun's exit status, 128 + the signal that killed it

  std::string log_dir() const { return dir.path() + "/logs"; }
  std::string run_dir() const { return ddprun::testing::run_folder(log_dir(), rdzv_id); }
  std::string attempt(int n) const { return run_dir() + "/attempt_" + std::to_string(n); }
  std::string console() const { return ddprun::testing::slurp(dir.path() + "/ddprun.stderr"); }
  nlohmann::json report(int attempt_no = 0) const {
    std::ifstream in(attempt(attempt_no) + "/hang_report.json");
    REQUIRE_MESSAGE(in.good(), "no hang report in attempt ", attempt_no);
    return nlohmann::json::parse(in);
  }

  // Runs `argv` (ddprun, or a shell that execs it) with the workers on the
  // torch interpreter (tests/common/test_python.h) unless `env` names
  // another; the test fails if it is still running after `deadline`.
  void run_argv(const std::vector<std::string>& argv, std::map<std::string, std::string> env,
                std::chrono::seconds deadline) {
    env.emplace("DDPRUN_PYTHON", ddprun::testing::test_python());
    Child ddprun(argv, env, false, dir.path() + "/ddprun.stderr", dir.path() + "/ddprun.stdout");
    auto status = ddprun.wait_for(deadline);
    REQUIRE_MESSAGE(status.has_value(), "ddprun did not finish within its deadline");
    exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  }
};

}  // namespace ddprun::watchdog::testing
