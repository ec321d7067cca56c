// `ddprun --version`, the subcommands `ddprun --help` lists, and the version
// `ddprun doctor` writes: the real program, run as a user would.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "base/version.h"
#include "tests/agent/ddprun_process.h"

using ddprun::testing::run_ddprun;

TEST_CASE("ddprun --version prints the release and the git commit, exits 0") {
  const auto r = run_ddprun({"--version"});
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  CHECK(r.out == std::string("ddprun ") + ddprun::base::version() + "\n");
  // "0.1.0" or "0.1.0 (git cb53aa1-dirty)": a release, then where it was built from.
  CHECK(std::regex_match(ddprun::base::package_version(), std::regex(R"(\d+\.\d+\.\d+)")));
  CHECK(std::regex_match(r.out, std::regex(R"(ddprun \d+\.\d+\.\d+( \(git [0-9A-Za-z._+-]+\))?\n)")));
  // A program's own --version is the program's: everything after it is passed on.
  const auto passed = run_ddprun({"--no-python", "/bin/echo", "x", "--version"});
  CHECK(passed.status == 0);
  CHECK(passed.out.find("x --version\n") != std::string::npos);
}

TEST_CASE("ddprun --help lists each subcommand on one line, and each has its own --help") {
  const auto r = run_ddprun({"--help"});
  CHECK(r.status == 0);
  CHECK(r.out.find("--version") != std::string::npos);
  for (const std::string name : {"status", "stacks", "attach", "doctor"}) {
    CAPTURE(name);
    CHECK(std::regex_search(r.out, std::regex("\n  ddprun " + name + "[^\n]* {2,}[a-z][^\n]+\n")));
    const auto sub = run_ddprun({name, "--help"});
    CHECK(sub.status == 0);
    CHECK(sub.out.find("ddprun " + name) != std::string::npos);
  }
}

TEST_CASE("ddprun doctor names the version that judged the machine (text and JSON)") {
  // Quick checks only: no port to probe, no nvidia-smi. Its exit status
  // depends on this machine (1 when a check fails); the report is printed either way.
  const auto text = run_ddprun({"doctor", "--port=0", "--nvidia-smi", ""});
  CHECK((text.status == 0 || text.status == 1));
  CHECK(text.out.find(std::string("checked by ddprun ") + ddprun::base::version() + "\n") !=
        std::string::npos);
  const auto json = run_ddprun({"doctor", "--json", "--port=0", "--nvidia-smi", ""});
  CHECK((json.status == 0 || json.status == 1));
  CHECK(nlohmann::json::parse(json.out)["ddprun_version"] == ddprun::base::version());
}
