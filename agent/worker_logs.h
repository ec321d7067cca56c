// Where one worker's output is filed: its folder below the run's
// (attempt_<n>/<local rank>/ or standby_<n>/, with the error file's name)
// and its stdout.log and stderr.log, by torchrun's rules: a redirected
// stream goes to its file only, a teed one to its file and the console
// (tee wins); --log-dir files every one.
#pragma once

#include <string>

#include "agent/attempt_types.h"
#include "agent/options.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {

struct LogPlace {
  std::string run_dir;     // the run's log folder
  int attempt_index = 0;   // names attempt_<n>/
  bool log_every_stream = false;  // --log-dir: every stream gets a file
};

struct WorkerLogs {
  int shown = 0;  // the kStd* bits of the streams that go to the console
  base::ScopedFd out, err;  // the open log files (or none)
};

// Creates the worker's folder `leaf` below attempt_<n>/ and opens its log
// files, naming them (and the error file) in `w`. A `replacement` goes on
// in the slot's files, appending. Throws SpawnError.
WorkerLogs open_worker_logs(const Options& options, const LogPlace& place, WorkerInfo& w,
                            const std::string& leaf, bool replacement);

}  // namespace ddprun::agent
