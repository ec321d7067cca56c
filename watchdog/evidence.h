// The evidence rule: what the agent can see of a stalled job from outside,
// and the verdict it draws, so that a learned step bound below the floor
// can end a real freeze without waiting for the floor, and a slow but
// living job is left alone.
//
// When no rank has progressed for the step's learned bound (factor x the
// longest gap seen, at least LearnerOptions::min_evidence_bound) and that
// bound is below the floor, each live rank of the node is sampled twice,
// `window` apart: its Python stack (dumped by the worker itself,
// live_stack.h), the CPU time and I/O bytes of its process and every
// descendant (a DataLoader's workers, a subprocess), and its state.
//
// A rank shows life when, between the two samples, its process tree did
// I/O, its main thread's Python stack moved (any of the four dumps across
// the window differs from the first in more than the innermost line: a
// loop without a call in it, `while True: x += 1`, stays put), it sat in uninterruptible
// I/O (D), or its main thread waits on its own children (a DataLoader's
// queue, subprocess.wait) or on a socket (an HTTP call): those may be slow
// for a reason the agent cannot judge. Ranks in a collective (python_stack.h) are the
// waiters; the others are in their own code.
//
// Verdict, in order:
//   1. any rank shows life -> alive;
//   2. a rank without a Python stack (a native program, `python -I`) ->
//      alive: nothing says where it is;
//   3. no rank waits in a collective -> alive (every rank is in its own
//      code: a longer phase, not a freeze);
//   4. every rank waits in a collective -> hung on one node (a deadlock,
//      or ranks in different collectives: a mismatch, both named), alive
//      with other nodes (the rank they wait for may be there: its own node
//      judges it);
//   5. otherwise -> hung: the ranks outside any collective, whose stacks
//      did not move and which did no I/O, are the culprits (spinning when
//      they burnt CPU, asleep or blocked when not), and the waiters their
//      victims. A backward pass that burns CPU is computing, not waiting.
// Alive waits for the full timeout (the floor), said once per stall.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "watchdog/python_stack.h"

namespace ddprun::watchdog {

struct RankSample {
  int rank = -1;
  pid_t pid = 0;
  bool gone = false;
  char state = '?';                  // the main process's
  uint64_t cpu_ticks = 0;            // the process tree's utime + stime
  std::optional<uint64_t> io_bytes;  // the process tree's rchar + wchar
  std::optional<std::string> python; // its live Python dump
  // Dumps taken between the pair's two samples (the second sample's only).
  std::vector<std::string> between;
  // Bytes those dumps made the rank write (not its own I/O).
  uint64_t dump_bytes = 0;
  std::string note;                  // why there is no Python dump
};

// I/O and CPU of `pid`'s tree; with `dump`, its Python stack first (so the
// dump's own write is not counted as the rank's I/O by a later sample).
RankSample sample_rank(int rank, pid_t pid, bool dump, std::chrono::milliseconds dump_timeout);
// The same, counters read before the dump (the second sample of a pair).
RankSample sample_rank_counters_first(int rank, pid_t pid, bool dump,
                                      std::chrono::milliseconds dump_timeout);

enum class CulpritState { kNone, kSpinning, kAsleep, kBlockedWriting, kDeadlock, kMismatch };
const char* to_string(CulpritState s);

struct Judgement {
  bool hung = false;
  std::string why;              // one clause, for the console and the report
  std::vector<int> culprits;    // global ranks, when hung
  CulpritState state = CulpritState::kNone;
  // Ranks whose stacks wait in a collective, and what each waits in.
  std::vector<std::pair<int, std::string>> waiting;
};

// `before` and `after` pair by rank; `cpu_busy_ticks` is how many ticks of
// CPU over the window make a rank busy; `other_nodes`: the job spans nodes.
Judgement judge(const std::vector<RankSample>& before, const std::vector<RankSample>& after,
                uint64_t cpu_busy_ticks, bool other_nodes);

}  // namespace ddprun::watchdog
