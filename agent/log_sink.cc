#include "agent/log_sink.h"

#include <unistd.h>

namespace ddprun::agent {

void LogSink::attach_console(std::shared_ptr<Console> console) {
  std::lock_guard<std::mutex> lock(mutex_);
  console_ = std::move(console);
}

void LogSink::attach_file(base::ScopedFd file) {
  std::lock_guard<std::mutex> lock(mutex_);
  file_ = std::move(file);
}

size_t LogSink::lines_not_shown() {
  std::lock_guard<std::mutex> lock(mutex_);
  return not_shown_;
}

void LogSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  const std::string_view text(line.data(), line.size());
  // A file that fails is dropped: its lines still reach the console.
  if (file_ && !base::write_fully(file_.get(), text.data(), text.size())) file_.reset();
  if (!console_) {
    (void)base::write_fully(STDERR_FILENO, text.data(), text.size());
    return;
  }
  if (!console_->write_line(text)) ++not_shown_;
}

}  // namespace ddprun::agent
