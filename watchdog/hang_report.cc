#include "watchdog/hang_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <map>

#include "base/contract.h"
#include "base/safe_file.h"
#include "base/utc_time.h"
#include "base/version.h"
#include "watchdog/error.h"
#include "watchdog/python_stack.h"

namespace ddprun::watchdog {

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string iso8601(std::chrono::system_clock::time_point t) { return base::utc_iso8601(t, 3); }

std::string rank_list(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }

}  // namespace

HangReport make_hang_report(const Watchdog& dog, const HangEvent& event, int attempt) {
  HangReport r;
  r.attempt = attempt;
  r.event = event;
  r.options = dog.options();
  r.workers = dog.workers();
  r.stalled = dog.stalled_ranks(event);
  r.suspects = dog.suspects(event);
  r.culprit = dog.culprit(event);
  // The culprit leads the suspects, so the two never disagree.
  r.suspects.erase(std::remove(r.suspects.begin(), r.suspects.end(), r.culprit), r.suspects.end());
  r.suspects.insert(r.suspects.begin(), r.culprit);
  if (dog.learner()) r.timeouts = dog.learner()->all();
  return r;
}

bool stack_in_collective(const std::string& stack_text) {
  std::string t = stack_text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* word : {"allreduce", "all_reduce", "barrier", "broadcast", "allgather",
                           "all_gather", "reduce_scatter", "reducescatter", "alltoall",
                           "all_to_all", "ncclgroupend", "processgroupgloo::", "processgroupnccl::",
                           // ddprun's own `train`: its communicators' waits
                           // (ShmCommunicator::complete_through) and DDP's wait
                           // for the gradient buckets name no collective.
                           "communicator::", "distributeddataparallel::finish_backward"}) {
    if (t.find(word) != std::string::npos) return true;
  }
  return false;
}

std::string main_thread_stack(const std::string& text, pid_t pid) {
  // eu-stack: "TID <tid>:" opens each thread; gdb's "thread apply all bt":
  // "Thread <n> (Thread 0x... (LWP <tid>) ...):". The main thread's id is
  // the process's.
  const std::string eu = "TID " + std::to_string(pid) + ":";
  const std::string lwp = "(LWP " + std::to_string(pid) + ")";
  std::string out;
  bool in_main = false, structured = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("TID ", 0) == 0 || line.rfind("Thread ", 0) == 0) {
      structured = true;
      in_main = line == eu || line.find(lwp) != std::string::npos;
    }
    if (in_main) out += line + "\n";
  }
  return structured && pid > 0 && !out.empty() ? out : text;
}

void HangReport::find_culprit(bool may_blame) {
  stack_culprit = -1;
  in_collective.clear();
  std::vector<int> outside;
  std::map<int, std::pair<std::string, std::string>> python_collective;  // rank: (call, site)
  // A rank may have two stacks. Its Python one, when there is one, decides:
  // the native one also shows the communicator's idle threads (every Gloo
  // rank has ProcessGroupGloo::runLoop waiting), whatever the main thread
  // does. Otherwise any native thread inside a collective counts (then, if
  // that puts every rank inside, the main thread's).
  auto is_python = [](StackMethod m) {
    return m == StackMethod::kPythonFaulthandler || m == StackMethod::kPySpy ||
           m == StackMethod::kPyStack;
  };
  // `main_only`: a native stack counts by its main thread alone.
  auto verdicts = [&](bool main_only) {
    std::map<int, std::pair<bool, bool>> ranks;  // rank: (has a Python stack, inside)
    for (const auto& s : stacks) {
      if (s.text.empty()) continue;  // not captured (yet): says nothing
      auto& [python, inside] = ranks[s.global_rank];
      if (is_python(s.method) && !python) inside = false;  // the Python stack replaces the native verdict
      if (is_python(s.method)) {
        // The main thread's frames decide (a helper thread's names say nothing).
        const PythonWhere where = parse_python_stack(s.text);
        inside = inside || (where.found ? !where.collective.empty() : stack_in_collective(s.text));
        if (where.found && !where.collective.empty()) python_collective[s.global_rank] = {where.collective, where.call_site};
      } else if (!python) {
        const std::string& text = main_only ? main_thread_stack(s.text, s.pid) : s.text;
        inside = inside || stack_in_collective(text);
      }
      python = python || is_python(s.method);
    }
    in_collective.clear();
    outside.clear();
    for (const auto& [rank, verdict] : ranks)
      (verdict.second ? in_collective : outside).push_back(rank);
  };
  verdicts(false);
  // Every rank inside by some thread: a native program's communicator keeps
  // idle threads on every rank (ProcessGroupGloo::runLoop), so its main
  // threads tell instead (`train` on Gloo: the one that stopped is in
  // pause(), the others in DDP's wait for the gradients).
  if (outside.empty() && !in_collective.empty()) verdicts(true);
  collectives.clear();
  mismatch.clear();
  for (const auto& [rank, call] : python_collective) collectives.emplace_back(rank, call.first);
  if (outside.empty() && python_collective.size() == in_collective.size() && python_collective.size() > 1) {
    std::map<std::string, std::vector<int>> by_call;
    for (const auto& [rank, call] : python_collective) by_call[call.first].push_back(rank);
    if (by_call.size() > 1) {
      std::vector<std::string> calls;
      for (const auto& [rank, call] : python_collective)
        calls.push_back(fmt::format("rank {} in {} at {}", rank, call.first, call.second));
      mismatch = fmt::format("{}", fmt::join(calls, "; "));
      culprit_state = CulpritState::kMismatch;
    }
  }
  if (in_collective.empty() || outside.empty()) return;
  // Of the ranks outside a collective, the one behind in steps, then the one
  // whose last beat is oldest, stopped first.
  auto status = [&](int rank) -> const WorkerStatus* {
    for (const auto& w : workers)
      if (w.global_rank == rank) return &w;
    return nullptr;
  };
  auto earlier = [&](int a, int b) {
    const WorkerStatus* wa = status(a);
    const WorkerStatus* wb = status(b);
    if (!wa || !wb) return wa != nullptr;
    if (wa->step != wb->step) return wa->step < wb->step;
    const bool ba = wa->beats > 0, bb = wb->beats > 0;
    if (ba != bb) return !ba;  // never beat: stopped before the other
    return ba && wa->last_beat < wb->last_beat;
  };
  stack_culprit = *std::min_element(outside.begin(), outside.end(), earlier);
  if (may_blame && stack_culprit != culprit) {
    culprit = stack_culprit;
    culprit_by_stacks = true;
    suspects.erase(std::remove(suspects.begin(), suspects.end(), culprit), suspects.end());
    suspects.insert(suspects.begin(), culprit);
  } else if (may_blame) {
    culprit_by_stacks = true;
  }
}

std::string HangReport::culprit_frames(std::size_t max) const {
  for (const auto& s : stacks) {
    if (s.global_rank != culprit || s.text.empty()) continue;
    if (s.method != StackMethod::kPythonFaulthandler && s.method != StackMethod::kPySpy &&
        s.method != StackMethod::kPyStack)
      continue;
    const PythonWhere where = parse_python_stack(s.text);
    if (where.found) return frames_text(where, max);
  }
  return "";
}

std::vector<std::string> HangReport::advice() const {
  auto secs = [](Millis m) { return fmt::format("{:g}", m.count() / 1000.0); };
  std::vector<std::string> out;
  // What was seen says where to look; a longer timeout would only hide it.
  std::string site;
  for (const auto& s : stacks) {
    if (s.global_rank != culprit || s.text.empty()) continue;
    const PythonWhere where = parse_python_stack(s.text);
    if (where.found) site = where.call_site;
  }
  const std::string at = site.empty() ? "" : " (" + site + ")";
  switch (culprit_state) {
    case CulpritState::kSpinning:
      out.push_back(fmt::format("nothing: rank {} spins in its own code{} while its peers wait in a "
                                "collective; look for a loop that never ends there", culprit, at));
      break;
    case CulpritState::kAsleep:
      out.push_back(fmt::format("nothing: rank {} sleeps or blocks outside any collective{} while "
                                "its peers wait for it; look at what it waits for there", culprit, at));
      break;
    case CulpritState::kBlockedWriting:
      out.push_back(fmt::format("nothing: rank {} is blocked writing{} (a full disk, a stalled "
                                "network filesystem, a pipe nobody reads)", culprit, at));
      break;
    case CulpritState::kDeadlock:
      out.push_back("nothing: every rank waits in a collective and none moved (a deadlock: a "
                    "collective one rank skipped, or a send without its receive)");
      break;
    case CulpritState::kMismatch:
      out.push_back(fmt::format("nothing: the ranks called different collectives ({}); make every "
                                "rank call the same collectives in the same order", mismatch));
      break;
    case CulpritState::kNone:
      break;
  }
  if (!out.empty()) {
    out.push_back("--max-restarts (each hang restart counts against it)");
    return out;
  }
  switch (event.kind) {
    case HangKind::kSection:
      out.push_back(fmt::format("--hang-timeout-floor=S (raise it above the longest legitimate "
                                "\"{}\" section, now {} s), or --hang-timeout=S for one fixed "
                                "timeout",
                                event.section, secs(event.timeout)));
      break;
    case HangKind::kHeartbeat:
      if (event.peer_node >= 0) {
        // Named by another node's stall (peer_stall.h): its timeout passed.
        out.push_back(fmt::format("node {}'s --hang-timeout-floor or --heartbeat-timeout (its ranks "
                                  "waited for this one past it; raise it there if this rank can "
                                  "legitimately fall that far behind)",
                                  event.peer_node));
      } else if (!event.learned_from.empty()) {
        out.push_back(fmt::format("--hang-timeout-floor=S (raise it above the longest legitimate "
                                  "pause between steps; the learned timeout was {} s), or "
                                  "--hang-timeout=S for one fixed timeout",
                                  secs(event.timeout)));
      } else if (event.detail.find("first heartbeat") != std::string::npos) {
        out.push_back(fmt::format("--heartbeat-grace={} (raise it if start-up or compilation "
                                  "takes longer; every worker must beat once --heartbeat-timeout "
                                  "is set)",
                                  secs(options.effective_grace())));
      } else {
        out.push_back(fmt::format("--heartbeat-timeout={} (raise it if a step, evaluation or "
                                  "checkpoint legitimately takes longer between beats)",
                                  secs(options.heartbeat_timeout)));
      }
      break;
    case HangKind::kSilence:
      out.push_back(fmt::format("--silence-timeout={} (raise it, or 0 to turn it off, if the "
                                "program is quiet for long stretches)",
                                secs(options.silence_timeout)));
      break;
    case HangKind::kStopped:
    case HangKind::kUninterruptible:
      out.push_back(fmt::format("--stuck-timeout={} (raise it if the worker is stopped or in "
                                "uninterruptible I/O on purpose; 0 turns it off)",
                                secs(options.effective_stuck_timeout())));
      break;
    case HangKind::kFileTimer:
      out.push_back("timer.expires(after=...) in the worker (torch's FileTimer deadline passed)");
      break;
  }
  out.push_back("--max-restarts (each hang restart counts against it)");
  return out;
}

nlohmann::json HangReport::to_json() const {
  using nlohmann::json;
  const auto detected_wall = std::chrono::system_clock::now() -
                             std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                 Clock::now() - event.detected);
  json j;
  j["ddprun_version"] = base::version();
  j["attempt"] = attempt;
  j["kind"] = to_string(event.kind);
  j["rank"] = event.global_rank;
  j["local_rank"] = event.local_rank;
  j["pid"] = event.pid;
  j["detail"] = event.detail;
  j["timeout_s"] = event.timeout.count() / 1000.0;
  j["detected_at"] = iso8601(detected_wall);
  j["detected_after_due_ms"] = ms_between(event.due, event.detected);
  // Steady-clock seconds (CLOCK_MONOTONIC), comparable across processes.
  j["due_monotonic_s"] = std::chrono::duration<double>(event.due.time_since_epoch()).count();
  j["detected_monotonic_s"] =
      std::chrono::duration<double>(event.detected.time_since_epoch()).count();
  j["stalled_ranks"] = stalled;
  j["suspect_ranks"] = suspects;
  j["culprit_rank"] = culprit;
  j["culprit_by_stacks"] = culprit_by_stacks;
  j["stack_culprit_rank"] = stack_culprit;
  j["action"] = action;
  j["section"] = event.section;
  j["learned_from"] = event.learned_from;
  j["timeouts"] = json::array();
  for (const auto& t : timeouts) {
    j["timeouts"].push_back({{"kind", t.kind},
                             {"timeout_s", t.timeout.count() / 1000.0},
                             {"learned", t.learned},
                             {"samples", t.samples},
                             {"p99_s", t.p99.count() / 1000.0},
                             {"max_s", t.max.count() / 1000.0},
                             {"text", t.describe()}});
  }
  j["in_collective_ranks"] = in_collective;
  j["collectives"] = json::object();
  for (const auto& [rank, call] : collectives) j["collectives"][std::to_string(rank)] = call;
  j["mismatch"] = mismatch;
  j["culprit_state"] = to_string(culprit_state);
  j["evidence"] = evidence;
  j["workers"] = json::array();
  for (const auto& w : workers) {
    json jw;
    jw["rank"] = w.global_rank;
    jw["local_rank"] = w.local_rank;
    jw["pid"] = w.pid;
    jw["beats"] = w.beats;
    jw["step"] = w.step;
    jw["max_step"] = w.max_step;
    jw["last_beat_at"] = w.beats ? json(iso8601(w.last_beat_wall)) : json(nullptr);
    jw["since_last_beat_s"] =
        w.beats ? json(ms_between(w.last_beat, event.detected) / 1000.0) : json(nullptr);
    jw["since_last_output_s"] = ms_between(w.last_output, event.detected) / 1000.0;
    jw["proc_state"] = std::string(1, w.proc_state);
    jw["exited"] = w.exited;
    jw["section"] = w.sections.empty() ? json(nullptr) : json(w.sections.back().first);
    jw["watched"] = !w.unwatched;
    j["workers"].push_back(jw);
  }
  j["stacks"] = json::array();
  for (const auto& s : stacks) {
    j["stacks"].push_back({{"rank", s.global_rank}, {"pid", s.pid}, {"method", to_string(s.method)},
                           {"path", s.path}, {"note", s.note}, {"text", s.text}});
  }
  j["worker_logs"] = json::object();
  for (const auto& [rank, path] : worker_logs) j["worker_logs"][std::to_string(rank)] = path;
  j["flags_to_change"] = advice();
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j;
}

std::string HangReport::to_text() const {
  std::string t = fmt::format("Hang in attempt {}: culprit rank {}. Deadline passed on rank {} "
                              "(local {}, pid {}): {}: {}\n",
                              attempt, culprit, event.global_rank, event.local_rank, event.pid,
                              to_string(event.kind), event.detail);
  t += fmt::format("Detected {:.1f} ms after the deadline. Stalled ranks: {}. Suspects: {}.\n",
                   ms_between(event.due, event.detected), rank_list(stalled), rank_list(suspects));
  if (stack_culprit >= 0) {
    t += fmt::format("Stopped first: rank {} (outside any collective; ranks {} wait inside one).\n",
                     stack_culprit, rank_list(in_collective));
  }
  if (!mismatch.empty()) t += "The ranks called different collectives: " + mismatch + ".\n";
  if (!evidence.empty()) t += "Evidence: " + evidence + ".\n";
  if (!timeouts.empty()) {
    t += "Timeouts (learned across the node's ranks and this job's attempts):\n";
    for (const auto& lt : timeouts) t += "  " + lt.describe() + "\n";
  }
  t += "\n";
  t += "rank  pid      beats  step   last beat      last output  state\n";
  for (const auto& w : workers) {
    t += fmt::format("{:<5} {:<8} {:<6} {:<6} {:<14} {:<12} {}{}\n", w.global_rank, w.pid, w.beats,
                     w.step,
                     w.beats ? fmt::format("{:.2f} s ago", ms_between(w.last_beat, event.detected) / 1000)
                             : std::string("never"),
                     fmt::format("{:.2f} s ago", ms_between(w.last_output, event.detected) / 1000),
                     w.proc_state, w.exited ? " (exited)" : "");
  }
  for (const auto& s : stacks) {
    t += fmt::format("\n--- stacks of rank {} (pid {}) via {}: {}{} ---\n", s.global_rank, s.pid,
                     to_string(s.method), s.path, s.note.empty() ? "" : " [" + s.note + "]");
    t += s.text.substr(0, 16 * 1024);
    if (!t.empty() && t.back() != '\n') t += '\n';
  }
  t += "\nFlags to change:\n";
  for (const auto& a : advice()) t += "  " + a + "\n";
  return t + fmt::format("\nReported by ddprun {}.\n", base::version());
}

std::string HangReport::summary(const std::string& report_dir) const {
  // The culprit first: the first rank past its deadline is often a victim
  // waiting in a collective for the rank that really stopped.
  const int blamed = culprit >= 0 ? culprit : event.global_rank;
  std::string s;
  if (culprit_by_stacks && blamed != event.global_rank) {
    s = fmt::format("Hang detected in attempt {}: rank {} stopped first (its stack is outside any "
                    "collective; rank(s) {} wait inside one). First deadline passed on rank {} "
                    "(pid {}) {}: {}.",
                    attempt, blamed, rank_list(in_collective), event.global_rank, event.pid,
                    to_string(event.kind), event.detail);
  } else if (blamed != event.global_rank) {
    s = fmt::format("Hang detected in attempt {}: rank {} stopped first (its last progress is the "
                    "oldest, or it is behind its peers). First deadline passed on rank {} (pid {}) "
                    "{}: {}.",
                    attempt, blamed, event.global_rank, event.pid, to_string(event.kind),
                    event.detail);
  } else {
    s = fmt::format("Hang detected in attempt {}: rank {} (pid {}) {}: {}.", attempt,
                    event.global_rank, event.pid, to_string(event.kind), event.detail);
    if (culprit_by_stacks) {
      s += fmt::format(" Its stack is outside any collective; rank(s) {} wait inside one.",
                       rank_list(in_collective));
    }
  }
  if (suspects.size() > 1) {
    s += fmt::format(" Suspect rank(s), culprit first: {}.", rank_list(suspects));
  } else if (stalled.size() > 1) {
    s += fmt::format(" Ranks {} stalled too: compare their stacks.", rank_list(stalled));
  }
  if (!stacks.empty()) {
    s += " Stacks:";
    for (const auto& st : stacks) {
      s += fmt::format(" rank {} ({}) {}", st.global_rank, to_string(st.method), st.path);
    }
    s += ".";
  }
  if (!mismatch.empty()) s += " The ranks called different collectives: " + mismatch + ".";
  if (!report_dir.empty()) s += fmt::format(" Report: {}/hang_report.txt.", report_dir);
  const auto a = advice();
  if (!a.empty() && a.front().rfind("nothing: ", 0) == 0) {
    s += " Not a timeout to raise: " + a.front().substr(9) + ".";
  } else if (!a.empty()) {
    s += " If this is not a hang, change " + a.front() + ".";
  }
  const std::string frames = culprit_frames();
  if (!frames.empty()) s += fmt::format("\nRank {}'s main thread, innermost first:\n{}", blamed, frames);
  return s;
}

void HangReport::write(const std::string& dir) const {
  // Whole or not at all, under the folder's descriptor (base/safe_file.h):
  // a planted symlink is replaced, never written through.
  try {
    write(base::SafeDir::open(dir));
  } catch (const base::FileError& e) {
    throw WatchdogError(e.what());
  }
}

void HangReport::write_later(base::QueuedWriter& writer, const std::string& dir) const {
  std::string json = to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::string text = to_text();
  const size_t bytes = json.size() + text.size();
  (void)writer.run(dir + "/" + base::kFileHangReportJson, bytes,
                   [dir, json = std::move(json), text = std::move(text)] {
                     const base::SafeDir folder = base::SafeDir::open(dir);
                     folder.write_atomically(base::kFileHangReportJson, json, false);
                     folder.write_atomically(base::kFileHangReportText, text, false);
                   });
}

void HangReport::write(const base::SafeDir& folder) const {
  try {
    folder.write_atomically(
        base::kFileHangReportJson,
        to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", false);
    folder.write_atomically(base::kFileHangReportText, to_text(), false);
  } catch (const base::FileError& e) {
    throw WatchdogError(e.what());
  }
}

}  // namespace ddprun::watchdog
