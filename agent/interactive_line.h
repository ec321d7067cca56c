// The console line of the worker whose readline has the keyboard (raw
// passthrough, stdin_forwarder.h): its bytes reach the terminal as they
// come, echo and redraw included (`\r`, `\b`, escape sequences), so the
// line readline draws is the line on the screen. Only the rank's prefix is
// added: at the start of each line and after each `\r` that more text
// follows (readline's redraws go back to column 0 and print the prompt
// again), never inside the worker's text. The worker's window is the
// console's less the prefix (worker_streams.h), so its columns match.
//
// It keeps the bytes since the last newline, so the line can be drawn
// again from its start after other output took the screen row (replay()):
// the same bytes from the same column give the same line.
//
// Pure: composes bytes. Not thread-safe (the console calls it under its
// queue's mutex).
#pragma once

#include <string>
#include <string_view>

namespace ddprun::agent {

class InteractiveLine {
 public:
  // Past this many bytes on one line the kept text starts at its last '\r'
  // (a redraw from column 0), so replay() stays bounded.
  static constexpr size_t kMaxKept = 16 << 10;

  explicit InteractiveLine(std::string prefix = {}) : prefix_(std::move(prefix)) {}
  // Appends what the terminal gets for `bytes` to `out`, continuing the line.
  void write(std::string_view bytes, std::string& out);
  // Appends the current line drawn again from column 0 to `out`.
  void replay(std::string& out) const;
  // The cursor is at the start of a line with nothing of ours on it.
  bool at_line_start() const { return line_start_; }
  const std::string& kept() const { return kept_; }
  const std::string& prefix() const { return prefix_; }
  // The source had this on its line already (shown before it took the
  // keyboard): kept for replay, not written.
  void adopt(std::string_view line);
  // The cursor is on a line another stream of the worker began (its
  // prompt): no prefix before what follows.
  void continue_line() { kept_.clear(), line_start_ = cr_ = false; }

 private:
  // Renders `bytes` from state (line_start, cr) into `out`.
  void render(std::string_view bytes, bool& line_start, bool& cr, std::string& out) const;

  std::string prefix_;
  std::string kept_;        // the worker's bytes since its last '\n'
  bool line_start_ = true;  // the next text starts a line: prefix first
  bool cr_ = false;         // the last byte was '\r': prefix before more text
};

}  // namespace ddprun::agent
