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
  // The lines logged before the run folder existed (the rendezvous join,
  // the first store connection) go first, so the file has all of them.
  if (file_ && !early_.empty() && !base::write_fully(file_.get(), early_.data(), early_.size()))
    file_.reset();
  early_.clear();
  early_.shrink_to_fit();
  early_closed_ = true;
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
  if (!file_ && !early_closed_ && early_.size() + text.size() <= kEarlyBytes) early_.append(text);
  if (!console_) {
    (void)base::write_fully(STDERR_FILENO, text.data(), text.size());
    return;
  }
  if (!console_->write_line(text)) ++not_shown_;
}

}  // namespace ddprun::agent
