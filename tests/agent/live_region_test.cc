// LiveRegion's bytes: bars redrawn in place with the line cleared to its
// end, other lines printed above them, widths counted without escapes.
// (agent.progress_bars checks the same on a real terminal emulator.)
#include <doctest/doctest.h>

#include <string>

#include "agent/line_splitter.h"
#include "agent/interactive_line.h"
#include "agent/live_region.h"

namespace ag = ddprun::agent;

namespace {
int a, b;  // two sources
}  // namespace

TEST_CASE("a bar's update rewrites its line and clears what the longer one left") {
  ag::LiveRegion r;
  r.set_width(40);
  std::string out;
  CHECK_FALSE(r.write(&a, "\r[0]:bar 1 long tail", true, out));
  CHECK(out == "\r[0]:bar 1 long tail\x1b[K");
  CHECK(r.holds(&a));
  out.clear();
  r.write(&a, "\r[0]:bar 2", true, out);
  CHECK(out == "\r[0]:bar 2\x1b[K");
}

TEST_CASE("two sources' bars get a line each; a log line goes above them") {
  ag::LiveRegion r;
  r.set_width(40);
  std::string out;
  r.write(&a, "\r[0]:a 1", true, out);
  r.write(&b, "\r[1]:b 1", true, out);
  out.clear();
  r.write(&a, "\r[0]:a 2", true, out);
  // Up to the region's first line, both redrawn.
  CHECK(out == "\x1b[1A\r[0]:a 2\x1b[K\n\r[1]:b 1\x1b[K");
  out.clear();
  r.write(nullptr, "log\n", true, out);
  CHECK(out == "\r\x1b[1A\x1b[Jlog\n\r[0]:a 2\x1b[K\n\r[1]:b 1\x1b[K");
  // Rank 0's bar ends: its last text stays above, the region shrinks.
  out.clear();
  r.write(&a, "\r[0]:a done\n", true, out);
  CHECK(out == "\r\x1b[1A\x1b[J[0]:a done\n\r[1]:b 1\x1b[K");
  CHECK_FALSE(r.holds(&a));
}

TEST_CASE("bars are cut to the width less one column; escapes and UTF-8 take none") {
  CHECK(ag::LiveRegion::columns("\x1b[32mab\x1b[0m\xe2\x96\x88") == 3);
  CHECK(ag::LiveRegion::cut("abcdef", 3) == "abc");
  CHECK(ag::LiveRegion::cut("\x1b[1mabcdef", 2) == "\x1b[1mab\x1b[0m");
  CHECK(ag::LiveRegion::cut("\xe2\x96\x88\xe2\x96\x88x", 2) == "\xe2\x96\x88\xe2\x96\x88");
  ag::LiveRegion r;
  r.set_width(6);
  std::string out;
  r.write(&a, "\r123456789", true, out);
  CHECK(out == "\r12345\x1b[K");
}

TEST_CASE("a prompt hides the region until a line completes; its own bar replaces it") {
  ag::LiveRegion r;
  r.set_width(40);
  std::string out;
  r.write(&a, "\rbar", true, out);
  out.clear();
  CHECK(r.write(&b, "name? ", true, out));  // a prompt: left open
  CHECK(out == "\r\x1b[Jname? ");
  out.clear();
  r.write(&b, "\rb bar", false, out);  // the prompt's line becomes b's bar
  CHECK(out == "\r\x1b[K\rbar\x1b[K\n\rb bar\x1b[K");
}

TEST_CASE("tqdm's writes through the line splitter: the bar shows each update, whole") {
  // tqdm writes "\r<bar>"; the splitter holds the text after the last '\r'
  // until the next write or the quiet timer, so the region gets "...\r" and
  // the next text in separate writes.
  ag::LineSplitter splitter("[0]:");
  ag::LiveRegion r;
  r.set_width(80);
  std::string out;
  for (int i = 0; i < 5; ++i) {
    std::string chunk, written = "\rbar " + std::to_string(i);
    splitter.feed(written.data(), written.size(), r.holds(&a), chunk);
    r.write(&a, chunk, true, out);
    if (i > 0) {
      REQUIRE(r.text_of(&a));
      CHECK(*r.text_of(&a) == "[0]:bar " + std::to_string(i - 1));
    }
    chunk.clear();
    if (i % 2 == 1) {  // the quiet timer shows the held text
      splitter.show_pending(r.holds(&a), chunk);
      r.write(&a, chunk, true, out);
      CHECK(*r.text_of(&a) == "[0]:bar " + std::to_string(i));
    }
  }
  std::string end;
  splitter.flush(r.holds(&a), end);
  out.clear();
  r.write(&a, end, true, out);
  CHECK(out == "\r\x1b[J[0]:bar 4\n");
  CHECK(r.empty());
}

TEST_CASE("after a typed line moved the cursor the region is drawn anew, not over it") {
  ag::LiveRegion r;
  r.set_width(40);
  std::string out;
  r.write(&a, "\rx", true, out);
  r.write(&b, "\ry", true, out);
  r.cursor_moved();
  out.clear();
  r.write(&a, "\rx2", true, out);
  CHECK(out == "\rx2\x1b[K\n\ry\x1b[K");  // no move up into the typed line
}

// The passthrough line (interactive_line.h): readline's bytes as written,
// the prefix only where a line starts or a '\r' goes back to column 0.
TEST_CASE("a passthrough line gets the prefix at line starts and after \\r, nowhere else") {
  ag::InteractiveLine l("[1]:");
  std::string out;
  l.write("(Pdb) p 6", out);
  l.write("*7\b\b\x1b[K", out);  // readline's own edits pass untouched
  CHECK(out == "[1]:(Pdb) p 6*7\b\b\x1b[K");
  out.clear();
  l.write("\r", out);  // a redraw from column 0: the prefix comes with its text
  CHECK(out == "\r");
  l.write("(Pdb) p 6*7\r\n42\n", out);
  CHECK(out == "\r[1]:(Pdb) p 6*7\r\n[1]:42\n");
  CHECK(l.at_line_start());
  out.clear();
  l.write("(Pdb) ab", out);
  l.write("\bX", out);
  out.clear();
  l.replay(out);  // the same bytes from column 0 draw the same line
  CHECK(out == "[1]:(Pdb) ab\bX");
}
