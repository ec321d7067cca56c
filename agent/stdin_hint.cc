#include "agent/stdin_hint.h"

#include <algorithm>

namespace ddprun::agent {
namespace {

constexpr std::string_view kMarkers[] = {
    "EOFError: EOF when reading a line",  // input()
    "bdb.BdbQuit",                        // pdb, breakpoint()
};
constexpr size_t kLongest = 40;

}  // namespace

bool StdinHint::feed(std::string_view data) {
  if (told_) return false;
  tail_.append(data.substr(data.size() > 4096 ? data.size() - 4096 : 0));
  for (auto m : kMarkers)
    if (tail_.find(m) != std::string::npos) {
      told_ = true;
      tail_.clear();
      return true;
    }
  if (tail_.size() > kLongest) tail_.erase(0, tail_.size() - kLongest);
  return false;
}

std::string StdinHint::message(int rank, int stdin_rank) {
  std::string r = std::to_string(rank);
  if (stdin_rank < 0)
    return "rank " + r + " read standard input, but no rank gets it (--stdin-rank=none); " +
           "--stdin-rank=" + r + " gives it to rank " + r;
  return "rank " + r + " read standard input, but only rank " + std::to_string(stdin_rank) +
         " gets it (the others read /dev/null); --stdin-rank=" + r + " gives it to rank " + r;
}

}  // namespace ddprun::agent
