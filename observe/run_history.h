// RunHistory: what a run's log folder says happened, read for `ddprun
// report` (report_html.h): the events.jsonl the watchdog and the monitor
// write (watchdog/event_log.h; "progress" events carry each rank's step)
// and each attempt's hang_report.json (docs/hang_report.schema.json).
//
// Reads a running job's folder too: a last line without its newline is
// one the writer has not finished, left out with a note; a hang report
// not written yet is a note. Every other defect is a ReportInputError
// naming the file (and line). Files are opened through base::SafeDir (no
// symlink below the run folder is followed).
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddprun::observe {

// The run folder or one of its files cannot be used; what() is one line
// naming the file ("RUN/events.jsonl:12: ...").
class ReportInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Times are seconds since the run's first event (monotonic clock).
struct StepPoint {
  double t = 0;
  int64_t step = 0;
  int attempt = 0;
};

// Something that happened to some ranks at one moment: a worker's exit, a
// restart, a rank's failure and recovery, a straggler's start and end.
struct Mark {
  double t = 0;
  std::string kind;  // the event's name (worker_exit, restart, rank_recovered, ...)
  std::vector<int> ranks;
  std::string text;  // the event's reason
  int attempt = 0;
};

struct StackText {
  int rank = -1;
  std::string method;  // python_faulthandler, py-spy, eu-stack, ...
  std::string text;
};

struct Hang {
  double t = 0;
  int attempt = 0;
  std::string kind;  // heartbeat_timeout, ...
  int culprit = -1;  // -1: nobody blamed
  std::vector<int> stalled;
  std::string detail;
  std::string evidence;
  std::string culprit_state;
  std::vector<StackText> stacks;  // from the attempt's hang report, culprit's first
  std::string report_note;        // why there are no stacks, when there are none
};

struct AttemptSpan {
  int attempt = 0;
  double start = 0;
  std::vector<int> ranks;
};

struct RunHistory {
  std::string run_dir;
  std::string started_at;  // ISO 8601 UTC of the first event
  std::string version;     // ddprun's version that wrote it
  double duration = 0;     // seconds from the first event to the last
  bool ended = false;      // a "done" event: the job is over
  std::string outcome;     // the "done" event's reason
  int restarts = 0;
  int recoveries = 0;
  std::vector<int> ranks;  // every rank seen, ascending
  std::vector<AttemptSpan> attempts;
  std::map<int, std::vector<StepPoint>> steps;  // per rank, in time order
  std::vector<Mark> marks;
  std::vector<Hang> hangs;
  // Straggler periods per rank: [start, end); end = duration while it lasts.
  std::map<int, std::vector<std::pair<double, double>>> straggling;
  std::vector<std::string> notes;  // for the reader: dropped events, a partial line
};

// Reads `run_dir` (the folder holding events.jsonl). Throws ReportInputError.
RunHistory read_run(const std::string& run_dir);

// The same from events.jsonl's text, for tests: `hang_report` gives an
// attempt's hang_report.json text, nullopt when there is none.
using HangReportSource = std::function<std::optional<std::string>(int attempt)>;
RunHistory parse_run(const std::string& run_dir, const std::string& events_text,
                     const HangReportSource& hang_report);

// Where an attempt's hang report lies, as errors name it.
std::string hang_report_path(const std::string& run_dir, int attempt);

}  // namespace ddprun::observe
