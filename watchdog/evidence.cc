#include "watchdog/evidence.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "base/proc_stat.h"
#include "base/procfs.h"
#include "watchdog/live_stack.h"

namespace ddprun::watchdog {

namespace {

void read_counters(RankSample& s) {
  const auto root = base::read_proc_stat(s.pid);
  if (!root || root->state == 'Z' || root->state == 'X') {
    s.gone = true;
    return;
  }
  s.state = root->state;
  uint64_t io = 0;
  bool io_known = true;
  for (pid_t p : base::process_tree(s.pid)) {
    if (const auto st = base::read_proc_stat(p)) s.cpu_ticks += st->utime + st->stime;
    if (const auto b = base::read_proc_io_bytes(p)) {
      io += *b;
    } else if (p == s.pid) {
      io_known = false;
    }
  }
  if (io_known) s.io_bytes = io;
}

void read_dump(RankSample& s, std::chrono::milliseconds timeout) {
  auto d = dump_python_stack(s.pid, timeout);
  if (d.ok) {
    s.python = std::move(d.text);
  } else {
    s.note = d.note;
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

RankSample sample_rank(int rank, pid_t pid, bool dump, std::chrono::milliseconds dump_timeout) {
  RankSample s;
  s.rank = rank;
  s.pid = pid;
  if (dump) read_dump(s, dump_timeout);
  read_counters(s);
  return s;
}

RankSample sample_rank_counters_first(int rank, pid_t pid, bool dump,
                                      std::chrono::milliseconds dump_timeout) {
  RankSample s;
  s.rank = rank;
  s.pid = pid;
  read_counters(s);
  if (dump && !s.gone) read_dump(s, dump_timeout);
  return s;
}

const char* to_string(CulpritState s) {
  switch (s) {
    case CulpritState::kNone: return "none";
    case CulpritState::kSpinning: return "spinning";
    case CulpritState::kAsleep: return "asleep";
    case CulpritState::kBlockedWriting: return "blocked_writing";
    case CulpritState::kDeadlock: return "deadlock";
    case CulpritState::kMismatch: return "mismatch";
  }
  return "none";
}

namespace {

// A rank the rule could not call alive on its own: where it stands, and
// whether it burnt CPU between the samples.
struct Still {
  int rank;
  PythonWhere where;
  bool busy;
};

// The innermost frame's line may differ (a loop's lines); a call made or
// returned, or an outer frame's line, is movement.
bool same_place(const PythonWhere& x, const PythonWhere& y) {
  if (x.frames.size() != y.frames.size()) return false;
  for (std::size_t i = 0; i < x.frames.size(); ++i) {
    const auto &fx = x.frames[i], &fy = y.frames[i];
    if (fx.file != fy.file || fx.function != fy.function || (i > 0 && fx.line != fy.line)) return false;
  }
  return true;
}

// Rules 1 and 2 for one rank sampled as `b`, then `a`: why the job is
// alive (or the verdict open) by this rank, or nothing, with `still` set.
std::optional<std::string> sign_of_life(const RankSample& b, const RankSample& a,
                                        uint64_t cpu_busy_ticks, std::optional<Still>& still) {
  // 1. life
  if (a.io_bytes && b.io_bytes && *a.io_bytes > *b.io_bytes + a.dump_bytes)
    return fmt::format("rank {} is alive: its processes did {} bytes of I/O", a.rank,
                       *a.io_bytes - *b.io_bytes - a.dump_bytes);
  if (a.state == 'D' || b.state == 'D')
    return fmt::format("rank {} is alive: in uninterruptible I/O (state D)", a.rank);
  // 2. no Python stack: nothing says where it is.
  if (!a.python || !b.python)
    return fmt::format("rank {} has no Python stack to judge by ({})", a.rank,
                       a.note.empty() ? b.note : a.note);
  PythonWhere wa = parse_python_stack(*a.python);
  const PythonWhere wb = parse_python_stack(*b.python);
  if (!wa.found || !wb.found) return fmt::format("rank {}'s Python stack names no main thread", a.rank);
  bool moved = !same_place(wa, wb);
  for (const auto& d : a.between) {
    const PythonWhere wd = parse_python_stack(d);
    if (wd.found && !same_place(wd, wb)) moved = true;
  }
  if (moved) return fmt::format("rank {} is alive: its Python stack moved (now {})", a.rank, wa.call_site);
  if (wa.waits_on_children)
    return fmt::format("rank {} waits on its own child processes ({})", a.rank, wa.call_site);
  if (wa.waits_on_network && wa.collective.empty())
    return fmt::format("rank {} waits on the network ({})", a.rank, wa.call_site);
  const bool busy = a.cpu_ticks - std::min(a.cpu_ticks, b.cpu_ticks) >= cpu_busy_ticks;
  // Runnable but hardly run: the machine starves it (a loaded host), which
  // says nothing about the program.
  if ((a.state == 'R' || b.state == 'R') && !busy)
    return fmt::format("rank {} is runnable but got little CPU (a loaded machine)", a.rank);
  if (busy && wa.in_backward)
    return fmt::format("rank {} is computing its backward pass (CPU busy)", a.rank);
  still = Still{a.rank, std::move(wa), busy};
  return std::nullopt;
}

// Rule 4 with every rank here in a collective: a deadlock or a mismatch
// on one node; with other nodes, the rank they wait for may be elsewhere.
void judge_all_waiting(const std::vector<Still>& seen,
                       const std::map<std::string, std::vector<int>>& by_collective,
                       bool other_nodes, Judgement& j) {
  if (other_nodes) {
    j.why = "every rank here waits in a collective: the rank they wait for may be on another node";
    return;
  }
  j.hung = true;
  if (by_collective.size() > 1) {
    j.state = CulpritState::kMismatch;
    std::vector<std::string> calls;
    for (const auto& s : seen)
      calls.push_back(fmt::format("rank {} in {} at {}", s.rank, s.where.collective, s.where.call_site));
    j.why = fmt::format("the ranks called different collectives: {}", fmt::join(calls, "; "));
    // The rank alone in its collective, when one is.
    for (const auto& [name, ranks] : by_collective)
      if (ranks.size() == 1 && seen.size() > 2) j.culprits.push_back(ranks[0]);
  } else {
    j.state = CulpritState::kDeadlock;
    j.why = fmt::format("every rank waits in {} and none moved: a deadlock",
                        by_collective.begin()->first);
  }
}

// Rule 5: the ranks outside any collective stopped the others.
void judge_culprits(const std::vector<Still>& seen, const std::vector<int>& outside, Judgement& j) {
  j.hung = true;
  j.culprits = outside;
  const Still* culprit = nullptr;
  for (const auto& s : seen)
    if (s.rank == outside.front()) culprit = &s;
  const bool writing = [&] {
    for (const auto& f : culprit->where.frames)
      if (f.function == "write" || f.function == "flush" || f.function == "save" || f.function == "_save")
        return true;
    return false;
  }();
  j.state = culprit->busy ? CulpritState::kSpinning
            : writing     ? CulpritState::kBlockedWriting
                          : CulpritState::kAsleep;
  std::vector<int> waiters;
  for (const auto& [r, _] : j.waiting) waiters.push_back(r);
  const char* doing = culprit->busy ? "spinning (CPU busy, stack unchanged, no I/O)"
                      : writing     ? "blocked in a write (no CPU, no I/O)"
                                    : "asleep or blocked (no CPU, no I/O, stack unchanged)";
  j.why = fmt::format("rank {} is outside any collective, {} at {}, while rank(s) {} wait in {}",
                      ranks_text(outside), doing, culprit->where.call_site, ranks_text(waiters),
                      j.waiting.front().second);
}

}  // namespace

Judgement judge(const std::vector<RankSample>& before, const std::vector<RankSample>& after,
                uint64_t cpu_busy_ticks, bool other_nodes) {
  Judgement j;
  std::map<int, const RankSample*> first;
  for (const auto& s : before) first[s.rank] = &s;
  std::vector<Still> seen;
  for (const auto& a : after) {
    auto it = first.find(a.rank);
    if (a.gone || it == first.end() || it->second->gone) continue;
    std::optional<Still> still;
    if (auto alive = sign_of_life(*it->second, a, cpu_busy_ticks, still)) {
      j.why = std::move(*alive);
      return j;
    }
    seen.push_back(std::move(*still));
  }
  if (seen.empty()) {
    j.why = "no live rank to judge";
    return j;
  }
  std::vector<int> outside;
  std::map<std::string, std::vector<int>> by_collective;
  for (const auto& s : seen) {
    if (s.where.collective.empty()) {
      outside.push_back(s.rank);
    } else {
      j.waiting.emplace_back(s.rank, s.where.collective);
      by_collective[s.where.collective].push_back(s.rank);
    }
  }
  // 3.
  if (j.waiting.empty()) {
    j.why = "no rank waits in a collective: every rank is in its own code (a longer phase)";
    return j;
  }
  // 4.
  if (outside.empty()) {
    judge_all_waiting(seen, by_collective, other_nodes, j);
    return j;
  }
  // 5.
  judge_culprits(seen, outside, j);
  return j;
}

}  // namespace ddprun::watchdog
