// Tells why a rank found no input: every rank but --stdin-rank reads
// /dev/null, so its input() raises EOFError and pdb/breakpoint() quits with
// bdb.BdbQuit. Watching that rank's stderr for those two Python lines, the
// agent says once which rank reads standard input and which flag moves it.
// (Reads of /dev/null themselves leave no trace the agent could see.)
//
// Pure: fed the stream's bytes, in pieces split anywhere. Not thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace ddprun::agent {

class StdinHint {
 public:
  // True once, on the piece that completes the first marker.
  bool feed(std::string_view data);

  // The one-line hint for `rank`, which read no input; `stdin_rank` is the
  // rank that reads it (-1: none).
  static std::string message(int rank, int stdin_rank);

 private:
  std::string tail_;  // the last bytes, for a marker split between pieces
  bool told_ = false;
};

}  // namespace ddprun::agent
