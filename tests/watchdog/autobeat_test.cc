// Automatic heartbeats from unmodified PyTorch scripts: ddprun's bootstrap
// (introspect/python/sitecustomize.py + watchdog/python/ddprun_autobeat.py)
// on the workers' PYTHONPATH, a real HeartbeatServer, a real interpreter.
// Interpreter: test_python() -- Debian's /usr/bin/python3 with torch 1.13;
// the torch2 label (tests/torch2, torch2.watchdog.python) runs these again
// against the torch 2.x venv.
#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <nlohmann/json.hpp>

#include "tests/common/slurp.h"
#include "tests/common/test_python.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/heartbeat_server.h"

namespace wd = ddprun::watchdog;
using namespace wd::testing;
using wd::BeatKind;

namespace {

// Torch imports slowly on a busy machine: a generous deadline, no threshold.
constexpr auto kScriptDeadline = std::chrono::seconds(180);

// Runs `script` as a worker of rank 1 under a heartbeat socket and returns
// every datagram it sent, reading them while it runs (an AF_UNIX datagram
// queue holds only net.unix.max_dgram_qlen of them, 10 by default) until
// `last` arrives; then the worker must exit 0.
std::vector<wd::Beat> run_worker(const std::string& script,
                                 const std::function<bool(const wd::Beat&)>& last) {
  TempDir dir;
  boost::asio::io_context io;
  std::vector<wd::Beat> beats;
  bool ended = false;
  wd::HeartbeatServer server(io, wd::choose_socket_path(dir.path()), [&](const wd::Beat& b) {
    beats.push_back(b);
    ended = ended || last(b);
  });
  const std::string err = dir.path() + "/stderr";
  Child child({test_python(), std::string(WATCHDOG_SCRIPTS) + "/" + script},
              {{"DDPRUN_HEARTBEAT_SOCKET", server.path()},
               {"RANK", "1"},
               {"PYTHONPATH", std::string(INTROSPECT_PYTHON_DIR) + ":" + WATCHDOG_PYTHON_DIR}},
              /*capture_stdout=*/false, err);
  const bool arrived = run_until(io, [&] { return ended; }, kScriptDeadline);
  const auto status = child.wait_for(std::chrono::seconds(60));
  INFO(script << " stderr: " << slurp(err));
  REQUIRE(arrived);
  REQUIRE(status.has_value());
  REQUIRE(WIFEXITED(*status));
  REQUIRE(WEXITSTATUS(*status) == 0);
  for (const auto& b : beats) CHECK(b.global_rank == 1);
  CHECK(server.malformed_received() == 0);
  return beats;
}

std::string describe(const std::vector<wd::Beat>& beats) {
  std::string out;
  for (const auto& b : beats) {
    const char* k[] = {"hb", "ab", "fw", "ss", "se"};
    out += std::string(k[static_cast<int>(b.kind)]) + " " + std::to_string(b.step) +
           (b.section.empty() ? "" : " " + b.section) + "; ";
  }
  return out;
}

}  // namespace

TEST_CASE("an unmodified torch script beats per optimizer step, in eval forwards and "
          "around checkpoints") {
  const auto beats = run_worker("autobeat_train.py", [](const wd::Beat& b) {
    return b.kind == BeatKind::kAuto && b.step == 6;
  });
  INFO(describe(beats));
  // The optimizer steps, in order: 1..5, then 6 after the checkpoints.
  std::vector<int64_t> steps;
  std::size_t step5 = 0, step6 = 0;
  for (std::size_t i = 0; i < beats.size(); ++i) {
    if (beats[i].kind != BeatKind::kAuto) continue;
    steps.push_back(beats[i].step);
    if (beats[i].step == 5) step5 = i;
    if (beats[i].step == 6) step6 = i;
  }
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  REQUIRE(step5 < step6);
  // Between them: the eval loop's forward beats, then three checkpoint
  // sections (save, load, the save that raised) -- none from the DataLoader
  // worker's own torch.save.
  std::size_t forwards = 0;
  std::vector<std::pair<BeatKind, std::string>> sections;
  for (std::size_t i = step5 + 1; i < step6; ++i) {
    if (beats[i].kind == BeatKind::kForward) {
      // The eval loop ran before the checkpoints (after them: step 6's forward).
      if (sections.empty()) ++forwards;
    } else {
      sections.emplace_back(beats[i].kind, beats[i].section);
    }
  }
  CHECK(forwards >= 2);
  const std::pair<BeatKind, std::string> ss{BeatKind::kSectionStart, "checkpoint"};
  const std::pair<BeatKind, std::string> se{BeatKind::kSectionEnd, "checkpoint"};
  CHECK(sections == std::vector<std::pair<BeatKind, std::string>>{ss, se, ss, se, ss, se});
  for (const auto& b : beats) CHECK(b.kind != BeatKind::kExplicit);
}

TEST_CASE("torch.distributed.checkpoint save and load are checkpoint sections (torch 2.x; "
          "torch 1.13 has no dcp.save and sends none)") {
  Child probe({test_python(), "-c", "import torch.distributed.checkpoint as d; d.save"},
              {{"DDPRUN_HEARTBEAT_SOCKET", ""}});
  const auto probed = probe.wait_for(kScriptDeadline);
  REQUIRE(probed.has_value());
  const bool has_dcp = WIFEXITED(*probed) && WEXITSTATUS(*probed) == 0;
  const auto beats = run_worker("autobeat_dcp.py", [](const wd::Beat& b) {
    return b.kind == BeatKind::kAuto && b.step == 1;
  });
  INFO(describe(beats));
  std::vector<std::pair<BeatKind, std::string>> sections;
  for (const auto& b : beats) {
    if (b.kind == BeatKind::kSectionStart || b.kind == BeatKind::kSectionEnd) {
      sections.emplace_back(b.kind, b.section);
    }
  }
  // One section each: the torch.save calls inside dcp.save nest in it.
  const std::pair<BeatKind, std::string> ss{BeatKind::kSectionStart, "checkpoint"};
  const std::pair<BeatKind, std::string> se{BeatKind::kSectionEnd, "checkpoint"};
  using Sections = std::vector<std::pair<BeatKind, std::string>>;
  CHECK(sections == (has_dcp ? Sections{ss, se, ss, se} : Sections{}));
}

TEST_CASE("an explicit beat() in a torch script stops the automatic beats") {
  const auto beats = run_worker("autobeat_explicit.py", [](const wd::Beat& b) {
    return b.kind == BeatKind::kExplicit && b.step == 103;
  });
  INFO(describe(beats));
  std::vector<std::pair<BeatKind, int64_t>> seen;
  for (const auto& b : beats) {
    if (b.kind != BeatKind::kForward) seen.emplace_back(b.kind, b.step);
  }
  CHECK(seen == std::vector<std::pair<BeatKind, int64_t>>{{BeatKind::kAuto, 1},
                                                          {BeatKind::kAuto, 2},
                                                          {BeatKind::kExplicit, 101},
                                                          {BeatKind::kExplicit, 102},
                                                          {BeatKind::kExplicit, 103}});
}

TEST_CASE("ddprun's Python bootstrap imports no torch for a script that never does") {
  TempDir dir;
  const std::string script = std::string(WATCHDOG_SCRIPTS) + "/autobeat_no_torch.py";
  const std::string pythonpath = std::string(INTROSPECT_PYTHON_DIR) + ":" + WATCHDOG_PYTHON_DIR;
  // Under ddprun the hook is installed, but neither torch nor the client is
  // imported; outside ddprun nothing is installed at all.
  Child under({test_python(), script},
              {{"DDPRUN_HEARTBEAT_SOCKET", dir.path() + "/hb.sock"}, {"PYTHONPATH", pythonpath}},
              /*capture_stdout=*/true);
  CHECK(under.wait_for_output("torch=False hook=True client=False\n", kScriptDeadline));
  CHECK(WEXITSTATUS(under.wait()) == 0);
  Child outside({test_python(), script},
                {{"DDPRUN_HEARTBEAT_SOCKET", ""}, {"PYTHONPATH", pythonpath}},
                /*capture_stdout=*/true);
  CHECK(outside.wait_for_output("torch=False hook=False client=False\n", kScriptDeadline));
  CHECK(WEXITSTATUS(outside.wait()) == 0);
}

TEST_CASE("the bootstrap leaves a 200-module model's children on PyTorch's fast path: no "
          "global hook, one hooked module, nothing of ddprun pickled or scripted") {
  TempDir dir;
  const std::string out = dir.path() + "/counts.json", err = dir.path() + "/stderr";
  Child child({test_python(), std::string(WATCHDOG_SCRIPTS) + "/autobeat_fast_path.py"},
              {{"DDPRUN_HEARTBEAT_SOCKET", dir.path() + "/hb.sock"},
               {"RANK", "0"},
               {"PYTHONPATH", std::string(INTROSPECT_PYTHON_DIR) + ":" + WATCHDOG_PYTHON_DIR}},
              /*capture_stdout=*/false, err, out);
  const auto status = child.wait_for(kScriptDeadline);
  INFO("stderr: " << slurp(err));
  REQUIRE(status.has_value());
  REQUIRE(WIFEXITED(*status));
  REQUIRE(WEXITSTATUS(*status) == 0);
  const auto counts = nlohmann::json::parse(slurp(out));
  INFO(counts.dump());
  // The count that is the cost: a global hook takes every module call off
  // the fast path; a hook on the outermost module costs one call a pass.
  CHECK(counts["global"] == 0);
  CHECK(counts["hooked"] == nlohmann::json::array({""}));
  CHECK(counts["children_hooked"] == 0);
  CHECK(counts["pickled_hooks"] == 0);
  CHECK(counts["deepcopy_hooks"] == 0);
  CHECK(counts["pickle_names_ddprun"] == false);
  CHECK(counts["scripted"] == 4);
  CHECK(counts["traced"] == 4);
  CHECK(counts["hooked_after_jit"] == nlohmann::json::array({""}));
  // Wrapped in DDP: the wrapper and the model (ddp.module(x) in evaluations).
  CHECK(counts["ddp_hooked"] == nlohmann::json::array({"", "module"}));
  CHECK(counts["ddp_global"] == 0);
}
