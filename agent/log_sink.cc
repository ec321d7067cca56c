#include "agent/log_sink.h"

#include <spdlog/pattern_formatter.h>
#include <unistd.h>

#include "base/contract.h"

namespace ddprun::agent {

LogSink::LogSink() : formatter_(std::make_unique<spdlog::pattern_formatter>()) {}

void LogSink::set_pattern(const std::string& pattern) {
  set_formatter(std::make_unique<spdlog::pattern_formatter>(pattern));
}

void LogSink::set_formatter(std::unique_ptr<spdlog::formatter> formatter) {
  base::MutexLock lock(mu_);
  formatter_ = std::move(formatter);
}

void LogSink::attach_console(std::shared_ptr<Console> console) {
  base::MutexLock lock(mu_);
  console_ = std::move(console);
}

void LogSink::attach_file(base::ScopedFd file) {
  base::MutexLock lock(mu_);
  file_ = base::QueuedFile();
  if (file) {
    // No on_error: the writer must not log (its line would come back here).
    base::QueuedWriter::Options o;
    o.close_wait = std::chrono::milliseconds(1000);
    if (!writer_) writer_ = std::make_unique<base::QueuedWriter>(std::move(o));
    file_ = writer_->add(std::move(file), base::kFileAgentLog);
  }
  // The lines logged before the run folder existed (the rendezvous join,
  // the first store connection) go first, so the file has all of them.
  if (file_) file_.write(early_);
  early_.clear();
  early_.shrink_to_fit();
  early_closed_ = true;
}

void LogSink::close_file(std::chrono::steady_clock::time_point deadline) {
  std::unique_ptr<base::QueuedWriter> writer;
  {
    base::MutexLock lock(mu_);
    file_ = base::QueuedFile();
    writer = std::move(writer_);
  }
  if (!writer) return;
  // Not under the sink's mutex: other threads may log while this waits.
  const std::string left = writer->close(deadline);
  if (left.empty()) return;
  const std::string line = "ddprun: " + left + "\n";
  (void)base::write_fully(STDERR_FILENO, line.data(), line.size());
}

size_t LogSink::lines_not_shown() {
  base::MutexLock lock(mu_);
  return not_shown_;
}

void LogSink::log(const spdlog::details::log_msg& msg) {
  base::MutexLock lock(mu_);
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  const std::string_view text(line.data(), line.size());
  // A file that fails is dropped: its lines still reach the console.
  if (file_ && file_.error()) file_ = base::QueuedFile();
  if (file_) file_.write(text);
  if (!file_ && !early_closed_ && early_.size() + text.size() <= kEarlyBytes) early_.append(text);
  if (!console_) {
    (void)base::write_fully(STDERR_FILENO, text.data(), text.size());
    return;
  }
  if (!console_->write_line(text)) ++not_shown_;
}

}  // namespace ddprun::agent
