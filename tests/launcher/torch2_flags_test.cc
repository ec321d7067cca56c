// torchrun 2.x's newer flags on the real ddprun: --virtual-local-rank,
// --event-log-handler, --shutdown-timeout, and the flags refused with a
// reason (--numa-binding: numa_binding_test.cc; every flag of the installed
// torchrun: tests/torch2/torchrun_parity_test.py).
#include <doctest/doctest.h>

#include "base/version.h"
#include "tests/agent/ddprun_process.h"

using ddprun::testing::lines_with;
using ddprun::testing::run_ddprun;

TEST_CASE("--virtual-local-rank: LOCAL_RANK 0 and one GPU each, by torchrun's rule") {
  auto r = run_ddprun({"--nproc-per-node=2", "--virtual-local-rank", "/usr/bin/printenv",
                       "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"},
                      {"CUDA_VISIBLE_DEVICES=3,5"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(lines_with(r.out, "[default0]:0").size() == 1);
  CHECK(lines_with(r.out, "[default0]:3").size() == 1);
  CHECK(lines_with(r.out, "[default1]:0").size() == 1);
  CHECK(lines_with(r.out, "[default1]:5").size() == 1);
  auto short_list = run_ddprun({"--nproc-per-node=2", "--virtual-local-rank", "/bin/true"},
                               {"CUDA_VISIBLE_DEVICES=3"});
  CHECK(short_list.status == 2);
  CHECK(short_list.err ==
        "ddprun: --virtual-local-rank: CUDA_VISIBLE_DEVICES=3 names fewer GPUs than "
        "--nproc-per-node=2 (see ddprun --help)\n");
}

TEST_CASE("--event-log-handler=console puts each event line on stderr; null does not") {
  auto console = run_ddprun({"--event-log-handler=console", "/bin/true"});
  INFO(console.err);
  REQUIRE(console.status == 0);
  // Keys in order: every line names the version that wrote it (watchdog/event_log.cc).
  const std::string head = std::string("ddprun: event: {\"attempt\":0,\"ddprun_version\":\"") +
                           ddprun::base::version() + "\",";
  CHECK(lines_with(console.err, head + "\"event\":\"start\"").size() == 1);
  CHECK(lines_with(console.err, head + "\"event\":\"done\"").size() == 1);
  auto quiet = run_ddprun({"--event-log-handler", "null", "/bin/true"});
  REQUIRE(quiet.status == 0);
  CHECK(lines_with(quiet.err, "ddprun: event:").empty());
}

TEST_CASE("torch 2.x flags ddprun cannot honour are refused with the reason") {
  struct Case {
    std::vector<std::string> args;
    std::string starts;
  };
  for (const Case& c : std::vector<Case>{
           {{"--logs-specs=mine"}, "ddprun: --logs-specs=mine: names a Python entry point"},
           {{"--event-log-handler=dynamic_rendezvous"},
            "ddprun: --event-log-handler=dynamic_rendezvous: not available in ddprun"},
           {{"--duplicate-stdout-filters=loss"}, "ddprun: --duplicate-stdout-filters=loss: not supported"},
           {{"--print-completion", "bash"}, "ddprun: --print-completion: not available"},
           {{"--numa-binding=rack"}, "ddprun: --numa-binding: rack not in {"}}) {
    std::vector<std::string> args = c.args;
    args.push_back("/bin/true");
    auto r = run_ddprun(args);
    CAPTURE(r.err);
    CHECK(r.status == 2);
    CHECK(r.err.rfind(c.starts, 0) == 0);
  }
  // --shutdown-timeout is --term-timeout's torchrun 2.x name.
  CHECK(run_ddprun({"--shutdown-timeout=5", "/bin/true"}).status == 0);
}
