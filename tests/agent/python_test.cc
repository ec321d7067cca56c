// Unmodified PyTorch programs train under ddprun (Debian's python3-torch).
#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/agent/ddprun_process.h"
#include "tests/common/skip.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_python.h"

using namespace ddprun::testing;

namespace {

const std::string kPython = test_python();

// Why `path` cannot be used, or "" when it can.
std::string missing(const std::string& path) {
  return access(path.c_str(), R_OK) == 0 ? "" : path + " is missing";
}

}  // namespace

TEST_CASE("ddp_reference.py trains unmodified with 2 workers and gloo") {
  std::string script = std::string(BENCH_DIR) + "/ddp_reference.py";
  for (const auto& p : {script, kPython})
    if (!missing(p).empty()) SKIP_TEST(missing(p));
  auto r = run_ddprun({"--nproc-per-node=2", script, "--data", DATA_DIR, "--steps", "30"},
                      {std::string("DDPRUN_PYTHON=") + kPython}, Seconds(240));
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(lines_with(r.out, "[default0]:rank 0 steps 30 ").size() == 1);
  CHECK(lines_with(r.out, "[default1]:rank 1 steps 30 ").size() == 1);
}

TEST_CASE("two jobs started at the same moment get different ports and both succeed") {
  std::string script = std::string(WORKERS_DIR) + "/gloo_allreduce.py";
  if (!missing(kPython).empty()) SKIP_TEST(missing(kPython));
  std::vector<std::string> env = {std::string("DDPRUN_PYTHON=") + kPython};
  DdprunProcess a({"--nproc-per-node=2", script}, env);
  DdprunProcess b({"--nproc-per-node=2", script}, env);
  auto ra = a.finish(Seconds(240));
  auto rb = b.finish(Seconds(240));
  INFO(ra.err, rb.err);
  REQUIRE(ra.status == 0);
  REQUIRE(rb.status == 0);
  auto la = lines_with(ra.out, "[default0]:rank 0 sum 1 port ");
  auto lb = lines_with(rb.out, "[default0]:rank 0 sum 1 port ");
  REQUIRE(la.size() == 1);
  REQUIRE(lb.size() == 1);
  CHECK(la[0] != lb[0]);  // the lines differ only in the port
}

TEST_CASE("ddp_reference.py --model cnn --lr-scale linear trains with 2 workers") {
  std::string script = std::string(BENCH_DIR) + "/ddp_reference.py";
  for (const auto& p : {script, kPython})
    if (!missing(p).empty()) SKIP_TEST(missing(p));
  auto r = run_ddprun({"--nproc-per-node=2", script, "--model", "cnn", "--lr-scale", "linear",
                       "--lr", "0.05", "--steps", "20"},
                      {"DDPRUN_PYTHON=" + kPython}, Seconds(240));
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(lines_with(r.out, "[default0]:rank 0 steps 20 ").size() == 1);
}

TEST_CASE("a Python worker's @record error file reaches the failure summary") {
  std::string script = std::string(WORKERS_DIR) + "/record_error.py";
  if (!missing(kPython).empty()) SKIP_TEST(missing(kPython));
  MESSAGE("python: " << kPython);
  auto r = run_ddprun({"--nproc-per-node=1", script}, {"DDPRUN_PYTHON=" + kPython}, Seconds(120));
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("  error: RuntimeError: loss is NaN at step 7") != std::string::npos);
  CHECK(r.err.find("  traceback:\n    Traceback (most recent call last):\n") != std::string::npos);
}

TEST_CASE("without --log-dir the summary names the @record error file, kept after the exit") {
  std::string script = std::string(WORKERS_DIR) + "/record_error.py";
  if (!missing(kPython).empty()) SKIP_TEST(missing(kPython));
  MESSAGE("python: " << kPython);
  TempDir tmp;  // TMPDIR: the kept folder goes there, removed with the test's
  auto r = run_ddprun({"--nproc-per-node=2", script},
                      {"DDPRUN_PYTHON=" + kPython, "TMPDIR=" + tmp.path()}, Seconds(120));
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  CHECK(r.status == 1);
  const auto lines = lines_with(r.err, "  error file: ");
  REQUIRE(lines.size() == 1);
  const std::string path = lines[0].substr(std::string("  error file: ").size());
  CHECK(path.rfind(tmp.path() + "/ddprun_logs.", 0) == 0);
  CHECK(path.find("/attempt_0/") != std::string::npos);
  CHECK(path.substr(path.size() - 11) == "/error.json");
  // Kept after ddprun's exit: torch's record of the exception, whole.
  std::ifstream kept(path);
  std::stringstream text;
  text << kept.rdbuf();
  CHECK(text.str().find("loss is NaN at step 7") != std::string::npos);
  CHECK(text.str().find("py_callstack") != std::string::npos);  // torch 1.13 and 2.x
}

TEST_CASE("workers that open a c10d TCPStore themselves run under ddprun") {
  std::string script = std::string(WORKERS_DIR) + "/c10d_store.py";
  if (!missing(kPython).empty()) SKIP_TEST(missing(kPython));
  auto r = run_ddprun({"--nproc-per-node=2", script}, {"DDPRUN_PYTHON=" + kPython}, Seconds(180));
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(lines_with(r.out, "[default0]:rank 0 store ok 0,1").size() == 1);
  CHECK(lines_with(r.out, "[default1]:rank 1 store ok 0,1").size() == 1);
}

TEST_CASE("every rank joins the agent's TCPStore at MASTER_ADDR:MASTER_PORT, across a restart") {
  // tests/agent/workers/agent_tcpstore.py: TCPStore(..., is_master=False) on
  // every rank, set/get/add/wait/compare_set and env:// gloo in both
  // attempts, attempt 1 finding the store emptied (torch 1.13 under
  // agent.python, 2.x under torch2.agent.python).
  std::string script = std::string(WORKERS_DIR) + "/agent_tcpstore.py";
  if (!missing(kPython).empty()) SKIP_TEST(missing(kPython));
  auto r = run_ddprun({"--nproc-per-node=2", "--max-restarts=1", script},
                      {"DDPRUN_PYTHON=" + kPython}, Seconds(240));
  REQUIRE_FALSE(r.timed_out);
  INFO(r.out);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(lines_with(r.out, "[default0]:rank 0 agent store ok attempt 1 values 0,1 allreduce 3").size() == 1);
  CHECK(lines_with(r.out, "[default1]:rank 1 agent store ok attempt 1 values 0,1 allreduce 3").size() == 1);
}
