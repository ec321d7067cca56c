// One schema for both kinds of hang report: a report the agent wrote for a
// hung worker and one `ddprun attach` wrote are validated against
// docs/hang_report.schema.json with the jsonschema of scripts/setup-pytools.sh
// (.venv-pytools/bin/python; the test exits 77 without it). Workers are
// /bin/sh and /bin/sleep: no Python, no torch, a few seconds in all.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/agent/ddprun_process.h"
#include "tests/common/run_folder.h"
#include "tests/common/temp_dir.h"

namespace {

using ddprun::testing::DdprunProcess;
using ddprun::testing::TempDir;

std::string venv_python() { return std::string(PYTOOLS_BIN) + "/python"; }

bool jsonschema_available() {
  if (::access(venv_python().c_str(), X_OK) != 0) return false;
  DdprunProcess p({"-c", "import jsonschema"}, {}, venv_python());
  const auto r = p.finish(std::chrono::seconds(60));
  return !r.timed_out && r.status == 0;
}

}  // namespace

TEST_CASE("schema: attach says so in one line when it cannot write its report, still reports "
          "the hang, and exits 3") {
  TempDir dir;
  DdprunProcess sleeper({"600"}, {}, "/bin/sleep");
  // A folder where the report's name is taken by a folder: the rename
  // that writes hang_report.json fails (EISDIR), whoever runs the test.
  const std::string reports = dir.file("report");
  ::mkdir(reports.c_str(), 0700);
  ::mkdir((reports + "/hang_report.json").c_str(), 0700);
  const auto attach = ddprun::testing::run_ddprun(
      {"attach", std::to_string(sleeper.pid()), "--silence-timeout", "1", "--once", "--report-dir",
       reports},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << attach.out << "\nstderr: " << attach.err);
  CHECK(attach.status == 3);  // a hang, reported, its report not written (ddprun attach --help)
  CHECK(attach.out.find("HANG") != std::string::npos);
  const std::string line = "ddprun attach: cannot write the hang report in " + reports + ": ";
  const auto at = attach.out.find(line);
  REQUIRE(at != std::string::npos);
  const std::string said = attach.out.substr(at, attach.out.find('\n', at) - at);
  CHECK(said.find("hang_report.json: Is a directory") != std::string::npos);  // names file and errno
}

// After the write-error case: its skip (exit 77) would end the run.
TEST_CASE("schema: a ddprun hang report and a ddprun attach report validate against one schema") {
  if (!jsonschema_available()) {
    MESSAGE("SKIP: no jsonschema for " << venv_python() << " (scripts/setup-pytools.sh)");
    std::exit(77);
  }
  TempDir dir;
  // The agent's report: a worker that prints once and then stays silent.
  const std::string logs = dir.file("logs");
  const auto job = ddprun::testing::run_ddprun(
      {"--rdzv-id=schema", "--log-dir=" + logs, "--nproc-per-node=1", "--max-restarts=0",
       "--silence-timeout=1", "/bin/sh", "-c", "echo started; exec sleep 600"},
      {}, std::chrono::seconds(60));
  INFO("ddprun stderr: " << job.err);
  CHECK(job.status == 124);  // a freeze ended the job (docs/CONTRACTS.md)
  const std::string agent_report =
      ddprun::testing::run_folder(logs, "schema") + "/attempt_0/hang_report.json";

  // attach's report: a process with no CPU and no I/O.
  DdprunProcess sleeper({"600"}, {}, "/bin/sleep");
  const std::string reports = dir.file("report");
  ::mkdir(reports.c_str(), 0700);
  const auto attach = ddprun::testing::run_ddprun(
      {"attach", std::to_string(sleeper.pid()), "--silence-timeout", "1", "--once", "--report-dir",
       reports},
      {}, std::chrono::seconds(60));
  INFO("attach stdout: " << attach.out << "\nstderr: " << attach.err);
  CHECK(attach.status == 1);
  const std::string attach_report = reports + "/hang_report.json";

  DdprunProcess validator(
      {"-c",
       "import json, sys, jsonschema\n"
       "schema = json.load(open(sys.argv[1]))\n"
       "jsonschema.Draft202012Validator.check_schema(schema)\n"
       "for path in sys.argv[2:]:\n"
       "    jsonschema.Draft202012Validator(schema).validate(json.load(open(path)))\n"
       "    print('valid:', path)\n",
       std::string(DOCS_DIR) + "/hang_report.schema.json", agent_report, attach_report},
      {}, venv_python());
  const auto check = validator.finish(std::chrono::seconds(60));
  INFO("validator stdout: " << check.out << "\nstderr: " << check.err);
  CHECK(check.status == 0);
  CHECK(check.out.find("valid: " + agent_report) != std::string::npos);
  CHECK(check.out.find("valid: " + attach_report) != std::string::npos);
}
