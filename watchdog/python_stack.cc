#include "watchdog/python_stack.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>

namespace ddprun::watchdog {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

struct Thread {
  bool current = false;      // faulthandler's "Current thread": the one the signal ran on
  bool named_main = false;   // py-spy's "MainThread"
  std::vector<PythonFrame> frames;  // innermost first
};

// '  File "/x/y.py", line 42 in step'
bool parse_faulthandler_frame(const std::string& line, PythonFrame& f) {
  const auto q1 = line.find("File \"");
  if (q1 == std::string::npos) return false;
  const auto q2 = line.find("\", line ", q1 + 6);
  if (q2 == std::string::npos) return false;
  f.file = line.substr(q1 + 6, q2 - q1 - 6);
  const char* p = line.c_str() + q2 + 8;
  char* end = nullptr;
  f.line = static_cast<int>(std::strtol(p, &end, 10));
  const std::string rest = end ? std::string(end) : "";
  const auto in = rest.find(" in ");
  f.function = in == std::string::npos ? "" : rest.substr(in + 4);
  return true;
}

// '    step (train.py:42)'
bool parse_pyspy_frame(const std::string& line, PythonFrame& f) {
  if (line.rfind("    ", 0) != 0 || line.empty() || line.back() != ')') return false;
  const auto open = line.rfind(" (");
  const auto colon = line.rfind(':');
  if (open == std::string::npos || colon == std::string::npos || colon < open) return false;
  f.function = line.substr(4, open - 4);
  f.file = line.substr(open + 2, colon - open - 2);
  f.line = std::atoi(line.c_str() + colon + 1);
  return true;
}

std::vector<Thread> threads_of(const std::string& dump) {
  std::vector<Thread> out;
  std::size_t at = 0;
  while (at < dump.size()) {
    std::size_t eol = dump.find('\n', at);
    if (eol == std::string::npos) eol = dump.size();
    const std::string line = dump.substr(at, eol - at);
    at = eol + 1;
    if (line.rfind("Thread ", 0) == 0 || line.rfind("Current thread ", 0) == 0 ||
        line.rfind("Stack (most recent call first)", 0) == 0) {
      Thread t;
      t.current = line.rfind("Current thread ", 0) == 0;
      t.named_main = line.find("\"MainThread\"") != std::string::npos;
      out.push_back(t);
      continue;
    }
    PythonFrame f;
    if (!out.empty() && (parse_faulthandler_frame(line, f) || parse_pyspy_frame(line, f)))
      out.back().frames.push_back(f);
  }
  return out;
}

const std::set<std::string>& c10d_collectives() {
  static const std::set<std::string> names{
      "all_reduce",       "all_reduce_coalesced", "barrier",           "monitored_barrier",
      "broadcast",        "broadcast_object_list", "all_gather",       "all_gather_into_tensor",
      "all_gather_object", "_all_gather_base",    "all_gather_coalesced", "gather",
      "gather_object",    "scatter",              "scatter_object_list", "reduce",
      "reduce_scatter",   "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
      "all_to_all_single", "send",                "recv",              "batch_isend_irecv"};
  return names;
}

bool library_file(const std::string& file) {
  // py-spy prints a library's path from its package ("torch/nn/...").
  return file.rfind("torch/", 0) == 0 || file.find("/site-packages/") != std::string::npos ||
         file.find("/dist-packages/") != std::string::npos ||
         file.find("/lib/python3") != std::string::npos || file.rfind("<frozen ", 0) == 0;
}

}  // namespace

PythonWhere parse_python_stack(const std::string& dump) {
  PythonWhere w;
  const auto threads = threads_of(dump);
  const Thread* main = nullptr;
  auto top_level = [](const Thread& t) {
    return !t.frames.empty() && t.frames.back().function == "<module>";
  };
  for (const auto& t : threads)
    if (t.named_main && !t.frames.empty()) main = &t;
  for (const auto& t : threads)
    if (!main && top_level(t)) main = &t;
  for (const auto& t : threads)
    if (!main && t.current && !t.frames.empty()) main = &t;
  for (const auto& t : threads)
    if (!main && !t.frames.empty()) main = &t;
  if (!main) return w;
  w.found = true;
  w.frames = main->frames;
  for (const auto& f : w.frames) {
    if (ends_with(f.file, "distributed_c10d.py") && c10d_collectives().count(f.function)) {
      w.collective = f.function;
      break;
    }
    if (ends_with(f.file, "torch/nn/parallel/distributed.py") &&
        f.function.find("sync") != std::string::npos && f.function.find("buffer") != std::string::npos) {
      w.collective = "broadcast (DDP's buffers)";
      break;
    }
    if ((ends_with(f.file, "torch/autograd/__init__.py") && f.function == "backward") ||
        (ends_with(f.file, "torch/autograd/graph.py") && f.function == "_engine_run_backward") ||
        (ends_with(f.file, "torch/_tensor.py") && f.function == "backward")) {
      w.collective = "backward (DDP's gradient all-reduce)";
      w.in_backward = true;
      break;
    }
  }
  for (const auto& f : w.frames) {
    if ((ends_with(f.file, "torch/utils/data/dataloader.py") &&
         (f.function == "_next_data" || f.function == "_get_data" || f.function == "_try_get_data")) ||
        (ends_with(f.file, "subprocess.py") &&
         (f.function == "wait" || f.function == "communicate" || f.function == "_wait"))) {
      w.waits_on_children = true;
      break;
    }
  }
  for (const auto& f : w.frames) {
    if (ends_with(f.file, "/socket.py") || ends_with(f.file, "/ssl.py") ||
        ends_with(f.file, "/selectors.py") || ends_with(f.file, "http/client.py")) {
      w.waits_on_network = true;
      break;
    }
  }
  const PythonFrame* site = &w.frames.front();
  for (const auto& f : w.frames) {
    if (!library_file(f.file)) {
      site = &f;
      break;
    }
  }
  const auto slash = site->file.rfind('/');
  w.call_site = fmt::format("{}:{} in {}", slash == std::string::npos ? site->file : site->file.substr(slash + 1),
                            site->line, site->function);
  return w;
}

std::string frames_text(const PythonWhere& where, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < where.frames.size() && i < max; ++i) {
    const auto& f = where.frames[i];
    out += fmt::format("    File \"{}\", line {} in {}\n", f.file, f.line, f.function);
  }
  if (where.frames.size() > max) out += fmt::format("    ... {} outer frame(s)\n", where.frames.size() - max);
  return out;
}

}  // namespace ddprun::watchdog
