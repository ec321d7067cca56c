// `ddprun report RUN_DIR [-o FILE]`: the run report (report_html.h) of a
// run's log folder, written without following a symlink (base::SafeDir).
#pragma once

namespace ddprun::observe {

// Exit statuses of `ddprun report` (docs/observability.md).
inline constexpr int kReportWritten = 0;
inline constexpr int kReportBadInput = 1;   // the run folder or a file in it
inline constexpr int kReportUsage = 2;      // wrong flags
inline constexpr int kReportNotWritten = 3; // the output file

// argv[0] is "report".
int report_main(int argc, char** argv);

}  // namespace ddprun::observe
