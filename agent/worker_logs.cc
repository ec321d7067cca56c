// Where a worker's output is filed (worker_logs.h).
#include "agent/worker_logs.h"

#include "agent/spawn.h"
#include "base/contract.h"
#include "base/safe_file.h"

namespace ddprun::agent {
namespace {

std::string make_worker_dir(const LogPlace& place, WorkerInfo& w, const std::string& slot_dir) {
  const std::string leaf = std::string(base::kFileAttemptDirPrefix) +
                           std::to_string(place.attempt_index) + "/" + slot_dir;
  const std::string dir = place.run_dir + "/" + leaf;
  w.error_file = dir + "/" + base::kFileErrorJson;
  try {
    // Below the run folder nothing is followed: attempt_<n>/<rank> are
    // created or opened by descriptor from it.
    base::SafeDir folder = base::SafeDir::open(place.run_dir).subdir(leaf, true);
    folder.remove(base::kFileErrorJson);  // a stale file would be blamed on this attempt
  } catch (const base::FileError& e) {
    throw SpawnError(std::string("cannot create log directory: ") + e.what(), e.error());
  }
  return dir;
}

}  // namespace

WorkerLogs open_worker_logs(const Options& options, const LogPlace& place, WorkerInfo& w,
                            const std::string& leaf, bool replacement) {
  const std::string dir = make_worker_dir(place, w, leaf);
  // torchrun's rules: a redirected stream goes to its file only, a teed
  // one to its file and the console (tee wins); --log-dir files every one.
  // A standby has the rules every local rank has (-r 3), not a listed
  // rank's, and is not shown under --local-ranks-filter.
  int redirected = options.redirects.for_rank(w.local_rank);
  int teed = options.tee.for_rank(w.local_rank);
  int filed = place.log_every_stream ? kStdAll : (redirected | teed);
  WorkerLogs logs;
  logs.shown = kStdAll & ~(redirected & ~teed);
  if (!options.local_ranks_filter.empty() && !options.local_ranks_filter.count(w.local_rank))
    logs.shown = kStdNone;
  // Not opened (a walk from /) when no stream is filed.
  if (filed != kStdNone) {
    try {
      // By the folder's descriptor, never through a symlink (base/safe_file.h).
      const base::SafeDir folder = base::SafeDir::open(dir);
      // A replacement goes on in the slot's files: what the replaced
      // process wrote last (its traceback) stays above.
      auto open_log = [&](const char* name) {
        return replacement ? folder.open_append(name) : folder.open_truncate(name);
      };
      if (filed & kStdOut) {
        w.stdout_log = dir + "/" + base::kFileStdoutLog;
        logs.out = open_log(base::kFileStdoutLog);
      }
      if (filed & kStdErr) {
        w.stderr_log = dir + "/" + base::kFileStderrLog;
        logs.err = open_log(base::kFileStderrLog);
      }
    } catch (const base::FileError& e) {
      throw SpawnError(std::string("cannot open log file: ") + e.what(), e.error());
    }
  }
  return logs;
}

}  // namespace ddprun::agent
