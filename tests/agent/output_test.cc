// Console lines are whole and prefixed; log files per attempt and rank.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/agent/ddprun_process.h"
#include "tests/common/run_folder.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {


std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}


}  // namespace

TEST_CASE("50,000 lines from 4 workers come out whole and prefixed") {
  constexpr int kWorkers = 4, kLines = 12500;
  auto r = run_ddprun({"--nproc-per-node=4", TEST_WORKER, "lines", std::to_string(kLines)},
                      {}, Seconds(120));
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.status == 0);
  std::vector<int> next(kWorkers, 0);
  int bad = 0;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    // "[default<r>]:rank=<r> line=<i> " + 'x' * (i % 97)
    int rank = -1, i = -1;
    char tail[2];
    if (std::sscanf(line.c_str(), "[default%d]:rank=%*d line=%d%1c", &rank, &i, tail) != 3 ||
        rank < 0 || rank >= kWorkers) {
      ++bad;
      continue;
    }
    std::string expected = "[default" + std::to_string(rank) + "]:rank=" + std::to_string(rank) +
                           " line=" + std::to_string(i) + " " + std::string(i % 97, 'x');
    if (line != expected || i != next[rank]) {
      ++bad;
      continue;
    }
    ++next[rank];
  }
  CHECK(bad == 0);
  for (int rank = 0; rank < kWorkers; ++rank) CHECK(next[rank] == kLines);
}

TEST_CASE("--log-dir writes per attempt and rank files; -r keeps a stream off the console") {
  TempDir dir;
  auto r = run_ddprun({"--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=logs", "--log-dir",
                       dir.path(), "-r", "0:1", TEST_WORKER, "crash-first", "1", "3"});
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.status == 0);
  std::string run = run_folder(dir.path(), "logs");
  REQUIRE(!run.empty());
  for (int attempt = 0; attempt < 2; ++attempt)
    for (int rank = 0; rank < 2; ++rank) {
      std::string d = run + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(rank);
      CAPTURE(d);
      CHECK(slurp(d + "/stdout.log").rfind("start rank=" + std::to_string(rank) + " restart=" +
                                               std::to_string(attempt), 0) == 0);
      CHECK(fs::exists(d + "/stderr.log"));
    }
  CHECK(lines_with(r.out, "[default0]:").empty());  // redirected
  CHECK(lines_with(r.out, "[default1]:start").size() == 2);
}

TEST_CASE("the prefix template, the rank filter and a partial last line") {
  auto r = run_ddprun({"--nproc-per-node=2", "--local-ranks-filter=1",
                       "--log-line-prefix-template=${role_name}/${rank}/${local_rank}| ",
                       "--role=w", "--no-python", "/usr/bin/printf", "a\\nno newline"});
  REQUIRE(r.status == 0);
  CHECK(r.out == "w/1/1| a\nw/1/1| no newline\n");
}
