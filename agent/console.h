// The agent's console: one destination (ddprun's stdout or stderr) that
// every worker stream and the agent's own messages write to.
//
// Writes go to a thread of its own (started with the first bytes) through a
// queue, so the event loop never blocks on a console nobody reads (`| less`
// left unscrolled, Ctrl-S, a stalled pipe). The queue is bounded by back-pressure, not by dropping:
// once it holds kHighWater bytes, full() is true and the output pumps stop
// reading their workers' pipes (the workers then block in write(), as they
// would on a slow terminal under torchrun); when_room() resumes them on the
// loop once the writer has caught up. Only a teardown (drop()) and the exit
// (drain_until's deadline) give up on bytes, and the log files keep them.
//
// It also knows which source's line is open on the console (text written
// without its newline yet: a prompt, a `\r` progress bar). Another source
// writing first ends that line with "\n", so lines of different ranks never
// mix; the interrupted source learns it from open_line() and marks its
// continuation (line_splitter.h).
//
// On a terminal, lines rewritten with '\r' (progress bars) live in a
// region pinned below the other output, one line per source, updated in
// place and cut to the width (live_region.h); other sources' lines and
// ddprun's own scroll above it.
//
// ddprun's own log lines (log_sink.h) come from any thread through
// write_line(), which never waits for the console either: past kHighWater
// plus kLogRoom queued bytes a line is not queued, only counted.
//
// Thread safety: write_line(), drain_until(), bytes_queued() and
// bytes_written() on any thread; the rest on the loop thread. Everything
// the writer thread sees is under the queue's mutex.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <boost/asio/io_context.hpp>

namespace ddprun::agent {

class Console {
 public:
  // Queued bytes at which full() turns true (the pumps pause).
  static constexpr size_t kHighWater = 1 << 20;
  // Room past kHighWater for ddprun's own lines: with the workers paused
  // they still show, up to this much, then they are counted, not queued.
  static constexpr size_t kLogRoom = 64 << 10;

  // Writes to `fd` (not owned, not made non-blocking: it is shared with
  // the shell). `terminal`: fd is a terminal (decides the pty path).
  Console(boost::asio::io_context& io, int fd, bool terminal);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Queues `bytes` from `source` (any stable address; nullptr for the
  // agent's own messages). Ends another source's open line first;
  // `leaves_line_open` makes `source` the owner of the console's line.
  void write(const void* source, std::string_view bytes, bool leaves_line_open = false);
  // Any thread: one whole line of ddprun's own (with its newline), queued
  // unless the console is kLogRoom past full; false when it was not.
  bool write_line(std::string_view line);
  // The source whose line is open on the console (nullptr: none).
  const void* open_line() const;
  // `source`'s line is still its own: open on the console, or its progress
  // bar in the live region (a terminal's bars, live_region.h).
  bool holds_line(const void* source) const;
  // Queues `bytes` as they are: no line of another source is ended, no bar
  // handling (--log-line-prefix-template=none).
  void write_untouched(std::string_view bytes);
  // Raw passthrough (interactive_line.h): `source`'s readline has the
  // keyboard. Its bytes go out as write_interactive() gives them, with
  // `prefix` only at line starts and after '\r'; its line stays the last
  // on the screen: output of others takes the row and the line is drawn
  // again below it (and below the progress bars). `line`: the source's
  // bytes since its last newline; `shown`: how many of them are on the
  // screen already, the cursor after them (none: the line is drawn anew).
  // `companion`: the worker's other stream, whose open line (a prompt) the
  // echo continues.
  void begin_interactive(const void* source, std::string prefix, std::string_view line,
                         std::optional<size_t> shown, const void* companion = nullptr);
  // False (nothing written) when `source` no longer has the keyboard.
  bool write_interactive(const void* source, std::string_view bytes);
  // Back to lines; an open line of `source` is ended.
  void end_interactive(const void* source);
  // A line was typed at this terminal: its echoed newline ended the open
  // line (a prompt's). Its owner then starts a new line, unmarked.
  void line_typed();
  // True once for the source whose open line line_typed() ended.
  bool take_typed_over(const void* source);
  bool full() const;
  // Counts bytes not shown because the console was full during a teardown.
  void drop(size_t bytes) { dropped_ += bytes; }
  size_t dropped() const { return dropped_; }
  // Runs `resume` on the loop once the queue is below half of kHighWater
  // (at once, posted, when it already is).
  void when_room(std::function<void()> resume);
  // Any thread: waits until every queued byte is written, the console
  // failed (closed), or `deadline`. True when nothing is left queued.
  bool drain_until(std::chrono::steady_clock::time_point deadline);
  size_t bytes_queued() const;
  // Bytes the writer has written so far (progress, for the exit's wait).
  size_t bytes_written() const;
  bool terminal() const { return terminal_; }
  int fd() const { return fd_; }

 private:
  struct Queue;
  static void writer_main(std::shared_ptr<Queue> q, int fd);
  // Starts the writer thread once, then wakes it: bytes were queued.
  void wake_writer();

  boost::asio::io_context& io_;
  int fd_;
  bool terminal_;
  size_t dropped_ = 0;
  // Shared with the writer thread, which may outlive this object when it is
  // stuck in write() at exit (then it is detached; the process ends it).
  std::shared_ptr<Queue> q_;
  std::once_flag writer_started_;
  std::thread writer_;  // started by the first wake_writer()
};

// ddprun's stdout and stderr consoles; `err` is `out` itself when both
// descriptors are the same file (a terminal, `2>&1`), so one queue keeps
// their order.
struct Consoles {
  std::shared_ptr<Console> out;
  std::shared_ptr<Console> err;
};
Consoles open_consoles(boost::asio::io_context& io, int out_fd = 1, int err_fd = 2);

}  // namespace ddprun::agent
