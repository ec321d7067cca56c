#include "agent/failure_summary.h"

#include <sstream>

namespace ddprun::agent {
namespace {

// The local rank's last end: with --restart-scope=rank a slot may have
// ended more than once (a replaced rank, then its replacement).
const WorkerEnd* end_of(const AttemptResult& r, int local_rank) {
  for (auto it = r.ends.rbegin(); it != r.ends.rend(); ++it)
    if (it->worker.local_rank == local_rank) return &*it;
  return nullptr;
}

void indent(std::ostringstream& out, const std::string& text, const char* pad) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out << pad << line << '\n';
}

}  // namespace

std::string root_cause_line(const AttemptResult& r) {
  if (!r.root) return "no failure recorded";
  const Failure& f = *r.root;
  const WorkerEnd* end = f.local_rank ? end_of(r, *f.local_rank) : nullptr;
  if (f.status && end) return worker_name(end->worker) + " failed with " + f.status->describe();
  if (end) return f.reason + " [" + worker_name(end->worker) + "]";
  return f.reason;
}

std::string failure_summary(const AttemptResult& r, const std::string& host,
                            const std::string& verdict) {
  std::ostringstream out;
  out << "ddprun: attempt " << r.restart_count << " failed on " << host << "; " << verdict
      << '\n';
  out << "  root cause: " << root_cause_line(r) << '\n';
  if (r.root) {
    const Failure& f = *r.root;
    if (f.error) {
      out << "  error: " << f.error->message << '\n';
      if (!f.error->traceback.empty()) {
        out << "  traceback:\n";
        indent(out, f.error->traceback, "    ");
      }
    }
    if (f.local_rank) {
      if (const WorkerEnd* end = end_of(r, *f.local_rank)) {
        // torchrun's summary names it too: the whole record, beyond the lines above.
        if (f.error) out << "  error file: " << end->worker.error_file << '\n';
        if (!end->worker.stdout_log.empty()) out << "  stdout: " << end->worker.stdout_log << '\n';
        if (!end->worker.stderr_log.empty()) out << "  stderr: " << end->worker.stderr_log << '\n';
      }
    }
  }
  bool header = false;
  const WorkerEnd* root_end =
      r.root && r.root->status && r.root->local_rank ? end_of(r, *r.root->local_rank) : nullptr;
  for (const auto& e : r.ends) {
    if (&e == root_end) continue;
    if (!header) out << "  ended with it:\n";
    header = true;
    out << "    " << worker_name(e.worker) << ": " << e.status.describe() << '\n';
  }
  return out.str();
}

}  // namespace ddprun::agent
