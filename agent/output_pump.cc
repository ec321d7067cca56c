#include "agent/output_pump.h"

#include <errno.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/asio/error.hpp>

#include "agent/interactive_line.h"

namespace ddprun::agent {

OutputPump::OutputPump(boost::asio::io_context& io, base::ScopedFd read_fd, PumpConfig config)
    : pipe_(io, read_fd.release()),  // Asio owns it from here (closed in finish())
      config_(std::move(config)),
      splitter_(config_.prefix),
      quiet_(io) {
  if (config_.log.valid()) {
    if (!config_.log_writer) config_.log_writer = std::make_shared<base::QueuedWriter>();
    log_ = config_.log_writer->add(std::move(config_.log), config_.log_path);
  }
}

void OutputPump::start() { read_more(); }

void OutputPump::set_lossy() {
  lossy_ = true;
  if (paused_) {
    paused_ = false;
    read_more();
  }
}

void OutputPump::read_more() {
  pipe_.async_read_some(boost::asio::buffer(buf_),
                        [this, alive = alive_.token()](const boost::system::error_code& ec, size_t n) {
                          if (!alive || !open_) return;
                          if (n > 0) handle(buf_.data(), n);
                          // EOF; EIO from a pseudo-terminal whose worker side closed.
                          if (ec) {
                            finish();
                            return;
                          }
                          if (!lossy_ && config_.console && config_.console->full()) {
                            paused_ = true;  // back-pressure: the worker waits, not the agent
                            config_.console->when_room([this, alive] {
                              if (!alive || !open_ || !paused_) return;
                              paused_ = false;
                              read_more();
                            });
                            return;
                          }
                          read_more();
                        });
}

void OutputPump::handle(const char* data, size_t size) {
  check_log();
  if (log_) log_.write(std::string_view(data, size));
  const std::string_view bytes(data, size);
  if (config_.before_console) config_.before_console();  // may call set_interactive
  const size_t nl = bytes.rfind('\n');
  if (nl == std::string_view::npos) {
    line_.append(bytes);
  } else {
    line_.assign(bytes.substr(nl + 1));
  }
  if (line_.size() > InteractiveLine::kMaxKept) line_.erase(0, line_.size() - InteractiveLine::kMaxKept);
  if (interactive_ && leaving_) {
    // Readline has left: what it wrote before (its last echo, the Enter)
    // often comes after that, so passthrough ends with this read's last
    // line, and what follows it is lines again.
    size_t end = nl == std::string_view::npos ? size : nl + 1;
    if (!config_.console->write_interactive(this, bytes.substr(0, end))) end = 0;
    if (nl != std::string_view::npos || end == 0) stop_interactive();
    if (end < size) to_lines(data + end, size - end);
  } else if (interactive_ && !config_.console->write_interactive(this, bytes)) {
    stop_interactive();  // another rank has the keyboard now
    to_lines(data, size);
  } else if (!interactive_) {
    to_lines(data, size);
  }
  if (config_.on_data) config_.on_data(std::string_view(data, size));
}

void OutputPump::check_log() {
  // The writer's thread found the file failing since the last read: from
  // here on the console keeps what the file cannot.
  const int err = log_ ? log_.error() : 0;
  if (!err) return;
  // What the file did not take reaches the console, unless it did already.
  std::string lost = config_.shown ? std::string() : log_.take_unwritten();
  log_ = base::QueuedFile();
  config_.shown = true;
  if (config_.on_log_error) config_.on_log_error(config_.log_path, err);
  if (!lost.empty()) to_lines(lost.data(), lost.size());
}

void OutputPump::to_lines(const char* data, size_t size) {
  if (config_.console && config_.shown && config_.raw) {
    to_console_raw(data, size);
  } else if (config_.console && config_.shown) {
    batch_.clear();
    if (config_.console->take_typed_over(this)) splitter_.new_line();
    splitter_.feed(data, size, config_.console->holds_line(this), batch_);
    to_console(batch_);
    // Only a terminal shows partial lines: there a person waits for a prompt
    // or a bar, while a pipe's reader is better served by whole lines (a
    // line split in two writes by a descheduled worker stays whole).
    if (splitter_.pending() > 0 && config_.console->terminal()) {
      last_data_ = std::chrono::steady_clock::now();
      arm_quiet_timer();
    }
  }
}

void OutputPump::stop_interactive() {
  if (!interactive_) return;
  interactive_ = leaving_ = false;
  config_.console->end_interactive(this);
  splitter_.new_line();
}

void OutputPump::set_interactive(bool on, const void* companion) {
  if (!on) {
    leaving_ = interactive_;  // at the end of the next line (handle())
    return;
  }
  leaving_ = false;
  if (interactive_ || !(config_.console && config_.shown && config_.console->terminal())) return;
  interactive_ = true;
  // What the splitter still holds was never shown: the console draws it
  // with the rest of the line.
  const size_t held = config_.raw ? 0 : splitter_.pending();
  splitter_.discard_pending();
  // Untouched bytes (prefix off) are all on the screen; prefixed ones when
  // the console's open line is still ours.
  std::optional<size_t> shown;
  if (config_.raw)
    shown = line_.size();
  else if (config_.console->open_line() == this)
    shown = line_.size() >= held ? line_.size() - held : 0;
  config_.console->begin_interactive(this, config_.raw ? "" : config_.prefix, line_, shown,
                                     companion);
}

void OutputPump::to_console_raw(const char* data, size_t size) {
  // On a terminal every byte goes at once (a prompt, a bar). On a pipe the
  // bytes up to the last newline go and the rest waits for its newline (or
  // the end), so two ranks' lines never mix inside a line; nothing is added
  // or changed either way. The console never ends a raw line for another
  // source (leaves_line_open stays false).
  if (config_.console->terminal()) {
    if (lossy_ && config_.console->full())
      config_.console->drop(size);
    else
      config_.console->write_untouched(std::string_view(data, size));
    return;
  }
  const char* p = data + size;
  while (p > data && p[-1] != '\n') --p;
  if (p > data) {
    batch_.swap(raw_pending_);
    batch_.append(data, static_cast<size_t>(p - data));
    raw_pending_.clear();
    to_console(batch_, false);
  }
  raw_pending_.append(p, static_cast<size_t>(data + size - p));
  if (raw_pending_.size() > LineSplitter::kDefaultMaxLine) {
    batch_.swap(raw_pending_);
    raw_pending_.clear();
    to_console(batch_, false);
  }
}

void OutputPump::to_console(std::string& bytes) { to_console(bytes, splitter_.line_open()); }

void OutputPump::to_console(std::string& bytes, bool leaves_line_open) {
  if (bytes.empty()) return;
  if (lossy_ && config_.console->full()) {
    config_.console->drop(bytes.size());
    return;
  }
  config_.console->write(this, bytes, leaves_line_open);
}

void OutputPump::arm_quiet_timer() {
  if (quiet_armed_) return;
  quiet_armed_ = true;
  quiet_.expires_at(last_data_ + kQuiet);
  quiet_.async_wait([this, alive = alive_.token()](const boost::system::error_code& ec) {
    if (!alive) return;
    quiet_armed_ = false;
    if (ec || !open_ || interactive_ || splitter_.pending() == 0) return;
    if (std::chrono::steady_clock::now() < last_data_ + kQuiet) {
      arm_quiet_timer();  // more came meanwhile: wait for the quiet again
      return;
    }
    batch_.clear();
    if (config_.console->take_typed_over(this)) splitter_.new_line();
    splitter_.show_pending(config_.console->holds_line(this), batch_);
    to_console(batch_);
  });
}

void OutputPump::finish() {
  if (!open_) return;
  open_ = false;
  quiet_.cancel();
  stop_interactive();  // the worker is gone, perhaps in its prompt
  check_log();  // a failure the writer found since the last read
  if (config_.console && config_.shown && config_.raw) {
    batch_.swap(raw_pending_);
    raw_pending_.clear();
    to_console(batch_, false);
  } else if (config_.console && config_.shown) {
    batch_.clear();
    if (config_.console->take_typed_over(this)) splitter_.new_line();
    splitter_.flush(config_.console->holds_line(this), batch_);
    to_console(batch_);
  }
  boost::system::error_code ignored;
  pipe_.close(ignored);
  log_ = base::QueuedFile();  // the writer closes it once its bytes are out
  if (config_.on_eof) config_.on_eof();
}

bool OutputPump::unread() {
  if (!open_) return false;
  int n = 0;
  // FIONREAD on a pipe and TIOCINQ (the same number) on a pty master: the
  // bytes queued for this read end.
  return ::ioctl(pipe_.native_handle(), FIONREAD, &n) == 0 && n > 0;
}

void OutputPump::close() {
  if (!open_) return;
  // Drain what is already readable without blocking, so the last lines of
  // a killed worker are not lost; the console takes what it can.
  lossy_ = true;
  pipe_.non_blocking(true);
  for (;;) {
    ssize_t n = ::read(pipe_.native_handle(), buf_.data(), buf_.size());
    if (n > 0) {
      handle(buf_.data(), static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  finish();
}

}  // namespace ddprun::agent
