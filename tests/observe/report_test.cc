// `ddprun report`: reading a run folder (a partial one too), the page's
// contents and escaping, and the exit statuses on bad input.
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "observe/report_charts.h"
#include "observe/report_cli.h"
#include "observe/report_html.h"
#include "observe/run_history.h"
#include "tests/common/slurp.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::observe;
using ddprun::testing::slurp;
using ddprun::testing::TempDir;

namespace {

// Attempt 0: two ranks, rank 1 stalls at step 5 and is blamed; a restart;
// attempt 1 runs to the end.
const char* kEvents =
    R"({"event":"start","time":"2026-12-06T08:00:00Z","monotonic_s":100.0,"attempt":0,"ranks":[],"reason":"job started","ddprun_version":"0.1.0"}
{"event":"rendezvous","monotonic_s":100.1,"attempt":0,"ranks":[0,1],"reason":"workers started"}
{"event":"progress","monotonic_s":101.0,"attempt":0,"ranks":[0,1],"steps":[10,5]}
{"event":"progress","monotonic_s":102.0,"attempt":0,"ranks":[0,1],"steps":[20,5]}
{"event":"hang_detected","monotonic_s":104.0,"attempt":0,"ranks":[0,1],"culprit":1,"kind":"heartbeat_timeout","reason":"rank 1 <script>alert(1)</script> stopped"}
{"event":"worker_exit","monotonic_s":104.1,"attempt":0,"ranks":[1],"reason":"signal SIGABRT"}
{"event":"restart","monotonic_s":104.2,"attempt":0,"ranks":[],"reason":"restart 1 of 3"}
{"event":"rendezvous","monotonic_s":104.3,"attempt":1,"ranks":[0,1],"reason":"workers started"}
{"event":"progress","monotonic_s":105.0,"attempt":1,"ranks":[0,1],"steps":[8,8]}
{"event":"progress","monotonic_s":106.0,"attempt":1,"ranks":[0,1],"steps":[18,18]}
{"event":"done","monotonic_s":106.5,"attempt":1,"ranks":[],"reason":"succeeded"}
)";

const char* kHangReport =
    R"({"culprit_rank":1,"stacks":[{"rank":0,"method":"py-spy","text":"in allreduce"},{"rank":1,"method":"python_faulthandler","text":"File \"train.py\", line 82 in main"}]})";

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

int run_report(std::vector<std::string> args) {
  args.insert(args.begin(), "report");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return report_main(static_cast<int>(argv.size()), argv.data());
}

void make_run(const TempDir& t) {
  write(t.file("events.jsonl"), kEvents);
  ::mkdir(t.file("attempt_0").c_str(), 0755);
  write(t.file("attempt_0/hang_report.json"), kHangReport);
}

}  // namespace

TEST_CASE("a run with a hang and a restart is read with its culprit, stacks and steps") {
  TempDir t;
  make_run(t);
  const RunHistory run = read_run(t.path());
  CHECK(run.ranks == std::vector<int>{0, 1});
  CHECK(run.restarts == 1);
  CHECK(run.attempts.size() == 2);
  CHECK(run.ended);
  REQUIRE(run.hangs.size() == 1);
  CHECK(run.hangs[0].culprit == 1);
  REQUIRE(run.hangs[0].stacks.size() == 2);
  CHECK(run.hangs[0].stacks[0].rank == 1);  // the culprit's first
  CHECK(run.steps.at(0).size() == 4);
  CHECK(run.duration == doctest::Approx(6.5));
  const auto times = step_times(run);
  // Rank 1 made no step in attempt 0: its only sample is attempt 1's.
  CHECK(times.at(1).samples.size() == 1);
  CHECK(times.at(0).median == doctest::Approx(0.1));
}

TEST_CASE("the page names the culprit, counts the restarts, has one timeline per rank, escapes text") {
  TempDir t;
  make_run(t);
  const std::string html = render_report(read_run(t.path()));
  CHECK(html.find("id=\"restarts\">1<") != std::string::npos);
  CHECK(html.find("id=\"culprit\" data-rank=\"1\">rank 1<") != std::string::npos);
  CHECK(count(html, "<div class=\"timeline\" data-rank=") == 2);
  CHECK(html.find("<script>") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(1)&lt;/script&gt;") != std::string::npos);
  CHECK(html.find("http://") == std::string::npos);  // nothing fetched
  CHECK(html.find("https://") == std::string::npos);
}

TEST_CASE("a running job's folder: an unfinished last line is left out, a missing hang report noted") {
  TempDir t;
  std::string text = kEvents;
  text = text.substr(0, text.find("{\"event\":\"restart\""));
  write(t.file("events.jsonl"), text + "{\"event\":\"resta");
  const RunHistory run = read_run(t.path());
  CHECK_FALSE(run.ended);
  CHECK(run.restarts == 0);
  REQUIRE(run.hangs.size() == 1);
  CHECK(run.hangs[0].report_note.find("hang_report.json") != std::string::npos);
  REQUIRE(run.notes.size() == 1);
  CHECK(run.notes[0].find("events.jsonl:7: an unfinished last line") != std::string::npos);
  CHECK(render_report(run).find("id=\"status\">running<") != std::string::npos);
}

TEST_CASE("straggler ranks: the agent's events and a median step time far above the others'") {
  RunHistory run;
  run.ranks = {0, 1, 2};
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 5; ++i)
      run.steps[r].push_back({static_cast<double>(i), (r == 2 ? 3 : 10) * int64_t(i), 0});
  run.straggling[0] = {{1.0, 2.0}};
  CHECK(straggler_ranks(run, step_times(run)) == std::vector<int>{0, 2});
}

TEST_CASE("bad input: one line naming the file, exit status 1; wrong flags 2; unwritable output 3") {
  TempDir t;
  CHECK(run_report({t.path()}) == kReportBadInput);  // no events.jsonl
  CHECK_THROWS_WITH_AS(read_run(t.path()), doctest::Contains("events.jsonl"), ReportInputError);
  write(t.file("events.jsonl"), std::string(kEvents) + "not json\n{\"event\":\"done\"}\n");
  CHECK_THROWS_WITH_AS(read_run(t.path()), doctest::Contains("/events.jsonl:12: not JSON"),
                       ReportInputError);
  make_run(t);
  write(t.file("attempt_0/hang_report.json"), "{truncated");
  CHECK_THROWS_WITH_AS(read_run(t.path()), doctest::Contains("attempt_0/hang_report.json: not JSON"),
                       ReportInputError);
  write(t.file("attempt_0/hang_report.json"), kHangReport);
  CHECK(run_report({}) == kReportUsage);
  CHECK(run_report({t.path(), "-o", t.path() + "/no/such/folder/r.html"}) == kReportNotWritten);
  CHECK(run_report({t.path(), "-o", t.file("r.html")}) == kReportWritten);
  CHECK(slurp(t.file("r.html")).rfind("<!DOCTYPE html>", 0) == 0);
}

TEST_CASE("the output replaces a symlink at its name, never writing through it") {
  TempDir t;
  make_run(t);
  write(t.file("victim"), "keep");
  REQUIRE(::symlink(t.file("victim").c_str(), t.file("r.html").c_str()) == 0);
  CHECK(run_report({t.path(), "-o", t.file("r.html")}) == kReportWritten);
  CHECK(slurp(t.file("victim")) == "keep");
  struct stat st {};
  REQUIRE(::lstat(t.file("r.html").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
}
