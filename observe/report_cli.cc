#include "observe/report_cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>

#include "base/safe_file.h"
#include "observe/report_html.h"
#include "observe/run_history.h"

namespace ddprun::observe {

namespace {

// Through the folder's descriptor, replaced atomically: a symlink planted
// at the output's name is replaced, never followed.
void write_report(const std::string& path, const std::string& html) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..")
    throw base::FileError(path + ": not a file name", EISDIR);
  base::SafeDir::open(dir).write_atomically(name, html, false);
}

}  // namespace

int report_main(int argc, char** argv) {
  CLI::App app("ddprun report: one self-contained HTML page of a run (timelines per rank, step "
               "times, restarts, hangs with their culprit and stacks), from its log folder",
               "ddprun report");
  std::string run_dir;
  std::string output = "report.html";
  app.add_option("run_dir", run_dir,
                 "the run's log folder, the one holding events.jsonl (ddprun logs its name; "
                 "--log-dir/<run-id>_<random>)")
      ->required();
  app.add_option("-o,--output", output, "the HTML file to write (replaced)")->capture_default_str();
  app.footer("Exit status: 0 written, 1 the run folder or a file in it cannot be read or is "
             "malformed (the line names it), 2 wrong flags, 3 the output cannot be written.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "ddprun report: %s (see ddprun report --help)\n", e.what());
    return kReportUsage;
  }
  while (run_dir.size() > 1 && run_dir.back() == '/') run_dir.pop_back();
  std::string html;
  try {
    html = render_report(read_run(run_dir));
  } catch (const ReportInputError& e) {
    std::fprintf(stderr, "ddprun report: %s\n", e.what());
    return kReportBadInput;
  }
  try {
    write_report(output, html);
  } catch (const base::FileError& e) {
    std::fprintf(stderr, "ddprun report: cannot write the report: %s\n", e.what());
    return kReportNotWritten;
  }
  std::fprintf(stderr, "ddprun report: wrote %s\n", output.c_str());
  return kReportWritten;
}

}  // namespace ddprun::observe
