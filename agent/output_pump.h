// Reads one worker stream (a pipe or a pseudo-terminal) on the event loop
// and sends it on: raw bytes to the log file, prefixed lines to the console
// (line_splitter.h), the bytes to a hook.
//
// Never blocks the loop: the console is a queue (console.h). While that
// queue is full the pump stops reading, so a console nobody reads throttles
// the worker through its own pipe, not the agent; during a teardown
// (set_lossy) it keeps reading and drops what the console cannot take, so
// the workers' exits are never held up by it. The log file keeps every
// byte either way. On a terminal, text without a newline is shown once the
// stream has been quiet for kQuiet.
//
// The log file is written by a QueuedWriter's thread (base/queued_writer.h),
// never on the loop: a stalled log folder (NFS) costs bytes past the
// writer's bound, marked in the file, not the agent's responsiveness. A log
// file that fails (full disk, quota, EIO) is reported once through
// on_log_error when the pump next reads; its stream then goes to the
// console even if it was redirected, so nothing more is lost silently.
//
// Owns its descriptors; close() stops reading and releases them.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/console.h"
#include "agent/line_splitter.h"
#include "base/liveness.h"
#include "base/queued_writer.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {

struct PumpConfig {
  std::string prefix;                // console line prefix
  // --log-line-prefix-template=none: bytes go to the console untouched, not
  // through the LineSplitter (on a pipe still in whole lines, see handle()).
  bool raw = false;
  std::shared_ptr<Console> console;  // null: never on the console
  bool shown = true;                 // false: console only if the log file fails
  base::ScopedFd log;                // none: no log file
  std::string log_path;              // for the error message and the drop notice
  // Writes `log` off the loop; null: the pump makes one of its own.
  std::shared_ptr<base::QueuedWriter> log_writer;
  std::function<void(std::string_view)> on_data;  // may be empty
  // Runs on each read before the console gets its bytes (may be empty):
  // the input forwarder looks at the worker's terminal mode there, so the
  // prompt readline writes goes out already as passthrough.
  std::function<void()> before_console;
  std::function<void()> on_eof;                   // called once
  // The log file failed (errno `err`); called once per pump.
  std::function<void(const std::string& path, int err)> on_log_error;
};

class OutputPump {
 public:
  // How long a stream must be quiet before its partial line is shown.
  static constexpr std::chrono::milliseconds kQuiet{20};

  // Takes ownership of `read_fd`.
  OutputPump(boost::asio::io_context& io, base::ScopedFd read_fd, PumpConfig config);
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  void start();
  // Stops reading now (draining what is readable without blocking and
  // flushing any partial line); on_eof runs if it has not.
  void close();
  bool open() const { return open_; }
  // True while the worker has written bytes this pump has not read yet (a
  // pipe or pty with input queued): a worker blocked on a full pipe looks
  // asleep and uses no CPU, so the failure drain asks this too.
  bool unread();
  // The stream's read end (a pty master: its window size is set on it).
  int fd() { return pipe_.native_handle(); }
  // Teardown: never pause for the console; drop what it cannot take.
  void set_lossy();
  // Raw passthrough (stdin_forwarder.h): the worker's readline has the
  // keyboard, so its bytes go to the console at once and as they are
  // (Console::write_interactive), its line kept last on the screen; off:
  // back to prefixed lines after the next newline it writes.
  // `companion`: the worker's other stream (Console::begin_interactive).
  void set_interactive(bool on, const void* companion = nullptr);
  // Console lines started from now on carry `prefix` (--standby-workers: a
  // standby's output once it was assigned a rank).
  void set_prefix(std::string prefix) {
    config_.prefix = prefix;
    splitter_.set_prefix(std::move(prefix));
  }
  // PumpConfig::before_console, set after the pump is made (the forwarder
  // learns of the worker once it runs).
  void set_before_console(std::function<void()> f) { config_.before_console = std::move(f); }

 private:
  void read_more();
  void handle(const char* data, size_t size);
  void to_console(std::string& bytes);
  void to_console(std::string& bytes, bool leaves_line_open);
  void to_console_raw(const char* data, size_t size);
  void arm_quiet_timer();
  // Prefixed lines (or untouched bytes) to the console.
  void to_lines(const char* data, size_t size);
  void stop_interactive();
  // Reports a log file the writer found failing (once) and shows what it lost.
  void check_log();
  void finish();

  boost::asio::posix::stream_descriptor pipe_;
  PumpConfig config_;
  base::QueuedFile log_;  // config_.log, queued to config_.log_writer
  LineSplitter splitter_;
  boost::asio::steady_timer quiet_;
  std::chrono::steady_clock::time_point last_data_;
  bool quiet_armed_ = false;
  bool paused_ = false;
  bool lossy_ = false;
  std::array<char, 64 * 1024> buf_;
  std::string batch_;
  std::string raw_pending_;  // raw mode on a pipe: the bytes after the last newline
  bool interactive_ = false;
  bool leaving_ = false;  // set_interactive(false) came: off after the next newline
  std::string line_;  // the bytes after the last newline (for set_interactive)
  bool open_ = true;
  // Handlers may run after this object is gone (aborted operations are
  // still delivered); they check this first. Last, so it clears before the
  // other members go.
  base::Liveness alive_;
};

}  // namespace ddprun::agent
