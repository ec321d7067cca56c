// Progress bars of several ranks on one terminal: a pinned region at the
// bottom of the screen with one line per source whose line is being
// rewritten with '\r' (a tqdm bar), updated in place, while other output
// scrolls above it.
//
// The console (console.h) hands every terminal write of a source to this
// class and appends the bytes it composes to its queue:
// - Complete lines (each ending in '\n'). The region is erased,
//   the lines are written, the region is drawn again below them. A line
//   that closes a live one (tqdm's last "\r...\n") leaves the region and
//   stays above it, as its final text (cut to the width too).
// - A source's open line after a '\r': its text replaces that
//   source's line in the region, every line redrawn and cleared to its end
//   (`\x1b[K`), so no stale characters stay. Lines are cut to the
//   terminal's width less one column (escape sequences and UTF-8
//   continuation bytes take none), so none wraps and the region's height is
//   its line count.
// - Text without a newline that is no bar (a prompt): the region is erased
//   and stays hidden until the next complete line or bar update.
// The cursor rests at the end of the region's last line.
//
// Pure: composes bytes, knows no descriptor. Not thread-safe (the console
// calls it under its queue's mutex).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

class LiveRegion {
 public:
  // Columns of the terminal (0: unknown, lines are not cut).
  void set_width(int columns) { width_ = columns; }
  // True while `source` has a line in the region.
  bool holds(const void* source) const;
  bool empty() const { return lines_.empty(); }
  // Something else moved the cursor (a typed line's echo): the region on
  // the screen is left as it is and drawn anew below on its next update.
  void cursor_moved() { drawn_ = 0; }
  // Lines of the region on the screen now (0: hidden).
  int drawn() const { return drawn_; }
  // Takes the region off the screen (the cursor at its first line's start,
  // cleared below) / draws it again there, the cursor ending at its last
  // line's end: a line kept below the region moves with it.
  void hide(std::string& out) { erase(out); }
  void show(std::string& out) {
    if (!lines_.empty()) draw(out);
  }
  // The text of `source`'s line in the region (nullptr: none).
  const std::string* text_of(const void* source) const;
  // `bytes`: what `source` wrote; `line_start`: the cursor is at the start
  // of a line (else it is at the end of `source`'s own open line). Appends
  // to `out`; true when it leaves a normal line (a prompt) open.
  bool write(const void* source, std::string_view bytes, bool line_start, std::string& out);
  // Terminal columns `text` takes (escape sequences none, UTF-8 one per
  // character).
  static size_t columns(std::string_view text);
  // `text` cut to `max` columns, escape sequences kept whole.
  static std::string cut(std::string_view text, size_t max);

 private:
  struct Line {
    const void* source;
    std::string text;
    bool after_cr;  // its last segment ended with '\r': the next replaces it
  };
  size_t max_columns() const;
  void erase(std::string& out);
  void draw(std::string& out);
  Line* find(const void* source);

  std::vector<Line> lines_;
  int width_ = 0;
  int drawn_ = 0;  // region lines on the screen now (0: hidden)
};

// What a terminal shows of a line rewritten with '\r', without the stale
// characters: the text after the last '\r' of `segment` replaces `line`;
// text without one is appended, or replaces it when the previous segment
// ended with '\r' (`after_cr`, updated).
void apply_carriage_returns(std::string& line, bool& after_cr, std::string_view segment);

}  // namespace ddprun::agent
