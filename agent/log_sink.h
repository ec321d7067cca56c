// Where ddprun's own log lines go (spdlog's default logger has this sink).
//
// Until the agent's console exists (flag parsing, the first store
// connection) and after it is gone, lines are written to stderr directly:
// no event loop runs then that a slow stderr could stall. While a console
// is attached (Agent::run), a line is queued to its writer thread instead
// (Console::write_line), in order with the workers' output, so a stderr
// nobody reads (`2>&1 | less`, Ctrl-S) never blocks the thread that logs,
// whichever it is (the loop, the store host, the keep-alive, a join). A
// line the console has no room for is counted, not shown, and the count is
// reported at exit. With a log file attached (--log-dir) every line also
// goes there, shown or not, and so do the lines logged before it was
// attached (up to kEarlyBytes of them); a writer thread of its own writes
// the file (base/queued_writer.h), so a stalled log folder stalls no
// thread that logs either.
//
// Thread safety: every method on any thread (one mutex, mu_). A sink of
// its own rather than spdlog's base_sink<Mutex>: spdlog's compiled library
// instantiates that for std::mutex only, which the analysis cannot see.
#pragma once

#include <spdlog/formatter.h>
#include <spdlog/sinks/sink.h>

#include <chrono>
#include <memory>
#include <string>

#include "agent/console.h"
#include "base/mutex.h"
#include "base/queued_writer.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {

class LogSink : public spdlog::sinks::sink {
 public:
  LogSink();
  // `console` null: back to stderr directly.
  void attach_console(std::shared_ptr<Console> console);
  // Every line from now on is appended to `file` too (an invalid fd: none).
  void attach_file(base::ScopedFd file);
  // Waits up to `deadline` for the file's queued lines, then lets it go;
  // what it could not take is said on stderr. Later lines skip the file.
  void close_file(std::chrono::steady_clock::time_point deadline);
  // Lines the console had no room for.
  size_t lines_not_shown();

  // spdlog::sinks::sink
  void log(const spdlog::details::log_msg& msg) override;
  void flush() override {}
  void set_pattern(const std::string& pattern) override;
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override;

 private:
  base::Mutex mu_;
  std::unique_ptr<spdlog::formatter> formatter_ GUARDED_BY(mu_);
  std::shared_ptr<Console> console_ GUARDED_BY(mu_);
  std::unique_ptr<base::QueuedWriter> writer_ GUARDED_BY(mu_);  // made by attach_file
  base::QueuedFile file_ GUARDED_BY(mu_);
  size_t not_shown_ GUARDED_BY(mu_) = 0;
  // Lines logged before attach_file, kept for the file (bounded: a run
  // without --log-dir never attaches one).
  static constexpr size_t kEarlyBytes = 64 * 1024;
  std::string early_ GUARDED_BY(mu_);
  bool early_closed_ GUARDED_BY(mu_) = false;
};

}  // namespace ddprun::agent
