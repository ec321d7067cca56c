// Turns one worker stream's bytes into what the console shows: every line
// with the rank's prefix, whole, never mixed with another rank's.
//
// - Complete lines (and text up to a `\r`) are rendered at once; the text
//   after the last newline or `\r` is held until the worker has been quiet
//   for a moment (the pump's timer calls show_pending()), so a prompt or a
//   progress bar shows without waiting for its newline.
// - `\r` rewrites the line in place: the prefix is written again after it,
//   so a progress bar keeps its prefix on the terminal.
// - A line longer than max_line bytes (between two `\n`/`\r`) is cut
//   there; each further piece starts with the prefix and kContinuation.
//   A shown partial line that another rank's output interrupted (the
//   console ended it with "\n") continues the same way.
//
// Each call's output goes to the console in one write, so nothing mixes
// within it. `open` tells each call whether this stream's line is still
// the console's open line (Console::open_line()). Not thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ddprun::agent {

class LineSplitter {
 public:
  // Lines stay whole up to this many bytes (README: "Using it").
  static constexpr size_t kDefaultMaxLine = 1 << 20;
  // Starts every piece of a cut or interrupted line after its prefix.
  static constexpr std::string_view kContinuation = "[...] ";

  explicit LineSplitter(std::string prefix, size_t max_line = kDefaultMaxLine)
      : prefix_(std::move(prefix)), max_line_(max_line) {}

  // Appends the rendering of every complete line and `\r` segment of
  // `data` to `out`; the rest is held.
  void feed(const char* data, size_t size, bool open, std::string& out);
  // Appends the held text (the worker has gone quiet); the line stays open.
  void show_pending(bool open, std::string& out);
  // End of stream: the held text, and a newline for an open line.
  void flush(bool open, std::string& out);
  // The console's line was ended for us (a typed line's echo): what
  // follows starts a new line, with the prefix, unmarked.
  void new_line() { on_console_ = after_cr_ = continued_ = false, column_ = 0; }
  // Forgets the held text (raw passthrough shows it: output_pump.h).
  void discard_pending() { pending_.clear(); }
  // Lines started from now on carry `prefix` (a standby that became a rank).
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  // Bytes held, not yet shown.
  size_t pending() const { return pending_.size(); }
  // True when the last output left this stream's line open (no newline).
  bool line_open() const { return on_console_; }

 private:
  void render(const char* data, size_t size, bool open, std::string& out);
  void start_segment(std::string& out);

  std::string prefix_;
  size_t max_line_;
  std::string pending_;      // bytes of the current line not rendered yet
  size_t column_ = 0;        // bytes of the current segment rendered
  bool on_console_ = false;  // our line has text on the console, no newline yet
  bool after_cr_ = false;    // ... and the last byte rendered was '\r'
  bool continued_ = false;   // the next text continues a cut or interrupted line
};

// The template that turns the prefix off: each worker's bytes reach the
// console untouched (no prefix, no line handling), as torchrun's output when
// it does not capture it, so `ddprun ... | jq` reads the program's bytes.
inline constexpr std::string_view kPrefixOff = "none";
inline bool prefix_off(const std::string& tmpl) { return tmpl == kPrefixOff; }

// Expands ${role_name} ${rank} ${local_rank} ${host} in `tmpl`; an empty
// template gives torchrun's "[<role><local_rank>]:", kPrefixOff "".
std::string make_line_prefix(const std::string& tmpl, const std::string& role, int rank,
                             int local_rank, const std::string& host);

}  // namespace ddprun::agent
