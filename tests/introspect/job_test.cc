// ddprun status, stacks and the straggler report on real jobs (Python
// workers run by Debian's /usr/bin/python3; a native worker).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/agent/ddprun_process.h"
#include "tests/common/python_stack_tools.h"
#include "tests/common/temp_dir.h"

namespace {

using namespace ddprun::testing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr const char* kPython = "/usr/bin/python3";

std::string script() { return std::string(INTROSPECT_SCRIPTS) + "/beating_worker.py"; }

// A job under its own registry and run id, ended by creating `until`.
struct Job {
  TempDir dir;
  std::string registry = dir.file("registry");
  std::string until = dir.file("until");
  std::string run_id = "introspect-" + std::to_string(::getpid());
  std::vector<std::string> env() const {
    return {"DDPRUN_REGISTRY_DIR=" + registry, std::string("DDPRUN_PYTHON=") + kPython};
  }
  Job() { ::mkdir(registry.c_str(), 0700); }
  void release() const { std::ofstream(until).put('\n'); }
  // `ddprun <sub> run_id args...` under this job's registry.
  ddprun::testing::Finished ask(const std::string& sub, std::vector<std::string> args = {}) const {
    args.insert(args.begin(), {sub, run_id});
    return run_ddprun(args, env(), std::chrono::seconds(90));
  }
  json status() const {
    const auto r = ask("status", {"--json"});
    INFO("status stderr: " << r.err);
    REQUIRE(r.status == 0);
    return json::parse(r.out)["agents"].at(0);
  }
};

bool has_lines(const std::string& out, std::initializer_list<const char*> needles) {
  for (const char* n : needles)
    if (out.find(n) == std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("status on a two-rank job shows both ranks with advancing steps") {
  Job job;
  DdprunProcess p({"--nproc-per-node", "2", "--rdzv-id", job.run_id, "--heartbeat-timeout",
                   "60", script(), "--until", job.until},
                  job.env());
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return has_lines(o, {"ready 0", "ready 1"}); },
                            std::chrono::seconds(60)));
  const json first = job.status();
  CHECK(first["run_id"] == job.run_id);
  CHECK(first["restarts"] == 0);
  REQUIRE(first["workers"].size() == 2);
  // Steps are sampled each second: ask until both ranks moved past their first answer.
  bool advanced = false;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  json later;
  while (!advanced && Clock::now() < deadline) {
    later = job.status();
    advanced = true;
    for (int i = 0; i < 2; ++i) {
      const auto& a = first["workers"][i];
      const auto& b = later["workers"][i];
      if (!b["step"].is_number() || !a["step"].is_number() || b["step"] <= a["step"] ||
          !b["steps_per_s"].is_number()) {
        advanced = false;
      }
    }
  }
  CHECK(advanced);
  for (int i = 0; i < 2; ++i) {
    CHECK(later["workers"][i]["rank"] == i);
    CHECK(later["workers"][i]["pid"].get<int>() > 0);
  }
  for (const auto& w : later["workers"]) {
    CHECK(w["beat_age_s"].is_number());
    CHECK(w["rss_bytes"].get<double>() > 0);
    CHECK(w["steps_per_s"].get<double>() > 0);
  }
  // The table: a header and one line per rank.
  const auto table = job.ask("status");
  CHECK(table.status == 0);
  CHECK(table.out.find("RANK") != std::string::npos);
  CHECK(table.out.find("\n0 ") != std::string::npos);
  CHECK(table.out.find("\n1 ") != std::string::npos);
  job.release();
  const auto end = p.finish(std::chrono::seconds(60));
  CHECK(end.status == 0);
  // Gone from the registry with the agent.
  const auto after = job.ask("status");
  CHECK(after.status == 1);
  CHECK(after.err.find("no running ddprun agent of run " + job.run_id) != std::string::npos);
}

TEST_CASE("stacks returns a Python worker's traceback from inside time.sleep, and the job "
          "then finishes normally") {
  Job job;
  DdprunProcess p({"--nproc-per-node", "2", "--rdzv-id", job.run_id, script(), "--until",
                   job.until},
                  job.env());
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return has_lines(o, {"ready 0", "ready 1"}); },
                            std::chrono::seconds(60)));
  const auto r = job.ask("stacks", {"--rank", "1", "--json"});
  INFO("stacks stderr: " << r.err);
  REQUIRE(r.status == 0);
  const json stacks = json::parse(r.out)["agents"].at(0)["stacks"];
  REQUIRE(stacks.size() == 1);
  CHECK(stacks[0]["rank"] == 1);
  const std::string py = stacks[0]["python"];
  INFO("python: " << py << "\nnote: " << stacks[0]["python_note"]);
  CHECK(py.find("in wait_here") != std::string::npos);
  CHECK(py.find("beating_worker.py") != std::string::npos);
  // Its native stack is in the sleep too (eu-stack or gdb name time_sleep).
  const std::string native = stacks[0]["native"];
  CHECK(!native.empty());
  // Every rank by default, as text.
  const auto all = job.ask("stacks");
  CHECK(all.status == 0);
  CHECK(all.out.find("=== rank 0") != std::string::npos);
  CHECK(all.out.find("=== rank 1") != std::string::npos);
  job.release();
  const auto end = p.finish(std::chrono::seconds(60));
  CHECK(end.status == 0);
  CHECK(has_lines(end.out, {"done 0", "done 1"}));
}

TEST_CASE("stacks returns a native worker's stack, and the job then finishes normally") {
  Job job;
  DdprunProcess p({"--nproc-per-node", "1", "--rdzv-id", job.run_id, NATIVE_WORKER, job.until},
                  job.env());
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return has_lines(o, {"ready"}); },
                            std::chrono::seconds(60)));
  const auto r = job.ask("stacks", {"--json"});
  INFO("stacks stderr: " << r.err);
  REQUIRE(r.status == 0);
  const json s = json::parse(r.out)["agents"].at(0)["stacks"].at(0);
  INFO("native: " << s["native"] << "\nnote: " << s["native_note"]);
  CHECK(s["rank"] == 0);
  CHECK(s["native"].get<std::string>().find("introspect_test_wait_here") != std::string::npos);
  CHECK(s["python"] == "");
  job.release();
  const auto end = p.finish(std::chrono::seconds(60));
  CHECK(end.status == 0);
  CHECK(end.out.find("done") != std::string::npos);
}

TEST_CASE("a rank slowed down on purpose is named as the straggler") {
  Job job;
  const std::string logs = job.dir.file("logs");
  DdprunProcess p({"--nproc-per-node", "3", "--rdzv-id", job.run_id, "--log-dir", logs,
                   "--straggler-window", "3", "--straggler-fraction", "0.5", script(), "--until",
                   job.until, "--slow-rank", "1", "--slow-factor", "10"},
                  job.env());
  REQUIRE(p.wait_for_stdout(
      [](const std::string& o) { return has_lines(o, {"ready 0", "ready 1", "ready 2"}); },
      std::chrono::seconds(60)));
  // Rank 1 beats at a tenth of the others' rate; once a full window is
  // sampled, status names it (and only it).
  json st;
  bool named = false;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!named && Clock::now() < deadline) {
    st = job.status();
    named = st["workers"][1]["straggler"] == true;
  }
  REQUIRE(named);
  CHECK(st["workers"][0]["straggler"] == false);
  CHECK(st["workers"][2]["straggler"] == false);
  job.release();
  const auto end = p.finish(std::chrono::seconds(60));
  CHECK(end.status == 0);
  CHECK(end.err.find("straggler: rank 1") != std::string::npos);
  // The event log has it too (in the run's folder, <run_id>_<random>).
  std::string run_dir;
  for (const auto& e : std::filesystem::directory_iterator(logs))
    if (e.path().filename().string().rfind(job.run_id + "_", 0) == 0) run_dir = e.path().string();
  REQUIRE(!run_dir.empty());
  std::ifstream events(run_dir + "/events.jsonl");
  std::string line;
  bool logged = false;
  while (std::getline(events, line)) {
    const json e = json::parse(line);
    if (e["event"] == "straggler") {
      CHECK(e["ranks"] == json::array({1}));
      logged = true;
    }
  }
  CHECK(logged);
}

TEST_CASE("py-spy: stacks reads the Python stack of a worker started with python -I, which "
          "ddprun's sitecustomize never reached") {
  if (!ddprun::testing::py_spy_available()) {
    MESSAGE("SKIP: no py-spy in " << PYTOOLS_BIN << " or on PATH (scripts/setup-pytools.sh)");
    std::exit(77);
  }
  Job job;
  auto env = job.env();
  env.push_back(ddprun::testing::python_tools_path_env());  // the agent finds py-spy on PATH
  DdprunProcess p({"--nproc-per-node", "1", "--rdzv-id", job.run_id, kPython, "-I",
                   std::string(INTROSPECT_SCRIPTS) + "/isolated_worker.py", job.until},
                  env);
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return has_lines(o, {"ready"}); },
                            std::chrono::seconds(60)));
  const auto r = job.ask("stacks", {"--json"});
  INFO("stacks stderr: " << r.err);
  REQUIRE(r.status == 0);
  const json stacks = json::parse(r.out)["agents"].at(0)["stacks"];
  REQUIRE(stacks.size() == 1);
  INFO("python: " << stacks[0]["python"] << "\nnote: " << stacks[0]["python_note"]);
  CHECK(stacks[0]["python_method"] == "py-spy");
  CHECK(stacks[0]["python"].get<std::string>().find("wait_isolated (") != std::string::npos);
  CHECK(stacks[0]["python"].get<std::string>().find("isolated_worker.py:12)") != std::string::npos);
  job.release();
  CHECK(p.finish(std::chrono::seconds(60)).status == 0);
}
