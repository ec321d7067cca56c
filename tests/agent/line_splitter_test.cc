// What the console shows of one worker stream: whole prefixed lines, `\r`
// rewrites, held partial lines, cut and interrupted lines marked.
#include <doctest/doctest.h>

#include <string>

#include "agent/line_splitter.h"

using namespace ddprun::agent;

namespace {

std::string feed(LineSplitter& s, const std::string& data, bool open = true) {
  std::string out;
  s.feed(data.data(), data.size(), open, out);
  return out;
}

}  // namespace

TEST_CASE("lines are carried over between reads and prefixed whole") {
  LineSplitter s("[p]:");
  CHECK(feed(s, "ab").empty());
  CHECK(feed(s, "c\nde\nf") == "[p]:abc\n[p]:de\n");
  std::string out;
  s.flush(true, out);
  CHECK(out == "[p]:f\n");
  out.clear();
  s.flush(true, out);
  CHECK(out.empty());
}

TEST_CASE("an empty line keeps its prefix") {
  LineSplitter s("[p]:");
  CHECK(feed(s, "\n\n") == "[p]:\n[p]:\n");
}

TEST_CASE("a line longer than the limit is cut into marked pieces") {
  LineSplitter s(">", 4);
  CHECK(feed(s, "abcdefghij\n") == ">abcd\n>[...] efgh\n>[...] ij\n");
  CHECK(feed(s, "abcd") == "");
  CHECK(feed(s, "\n") == ">abcd\n");  // exactly the limit: no empty extra line
  // Held text past the limit is shown at once, not kept growing.
  CHECK(feed(s, "abcdef") == ">abcd\n>[...] ef");
  CHECK(s.pending() == 0);
  CHECK(feed(s, "\n") == "\n");
}

TEST_CASE("a held partial line is shown on demand and continued without a new prefix") {
  LineSplitter s("[p]:");
  CHECK(feed(s, "name? ").empty());
  CHECK(s.pending() == 6);
  std::string out;
  s.show_pending(true, out);
  CHECK(out == "[p]:name? ");
  CHECK(s.line_open());
  CHECK(feed(s, "bob\n") == "bob\n");
  CHECK_FALSE(s.line_open());
}

TEST_CASE("a carriage return rewrites the line with its prefix") {
  LineSplitter s("[p]:");
  CHECK(feed(s, "\r 10%") == "");  // a '\r' at the start of a line moves nothing
  std::string out;
  s.show_pending(true, out);
  CHECK(out == "[p]: 10%");
  CHECK(feed(s, "\r 20%\r") == "\r[p]: 20%\r");
  CHECK(s.line_open());
  CHECK(feed(s, " 30%\n") == "[p]: 30%\n");
  CHECK(feed(s, "a\r\n") == "[p]:a\r\n");
}

TEST_CASE("a shown line that another rank interrupted continues marked") {
  LineSplitter s("[p]:");
  feed(s, "loading");
  std::string out;
  s.show_pending(true, out);
  CHECK(out == "[p]:loading");
  // The console ended our line with "\n" for another rank: open is false.
  CHECK(feed(s, " done\n", false) == "[p]:[...]  done\n");
  // Interrupted right before the newline: that newline is not repeated.
  feed(s, "x");
  out.clear();
  s.show_pending(true, out);
  CHECK(feed(s, "\nnext\n", false) == "[p]:next\n");
  // Interrupted after a '\r': the rewrite starts a fresh line, unmarked.
  CHECK(feed(s, "\r 1%\r") == "[p]: 1%\r");
  CHECK(feed(s, " 2%\n", false) == "[p]: 2%\n");
}

TEST_CASE("the end of a stream closes an open line only if it is still ours") {
  LineSplitter a("[a]:"), b("[b]:");
  std::string out;
  feed(a, "x");
  a.show_pending(true, out);
  out.clear();
  a.flush(true, out);
  CHECK(out == "\n");
  feed(b, "y");
  out.clear();
  b.show_pending(true, out);
  out.clear();
  b.flush(false, out);
  CHECK(out.empty());
}
