#include "launcher/slurm_env.h"

#include <cstdlib>

#include "base/contract.h"

namespace ddprun::launcher {
namespace {

// Hosts beyond this in one list are refused: no cluster has them, and a
// typo such as n[1-99999999] must not exhaust memory.
constexpr size_t kMaxHosts = 1 << 20;

SlurmError bad(const std::string& list, const std::string& why) {
  return SlurmError("Slurm host list '" + list + "': " + why);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// "01-04,07" -> 01 02 03 04 07 (padded to the width of each range's low end
// when it has a leading zero, as Slurm writes them).
std::vector<std::string> expand_ranges(const std::string& list, const std::string& ranges) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    std::string item = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9)
      throw bad(list, "'" + item + "' is not N or N-M");
    long a = std::strtol(lo.c_str(), nullptr, 10), b = std::strtol(hi.c_str(), nullptr, 10);
    if (b < a) throw bad(list, "range '" + item + "' runs backwards");
    if (static_cast<size_t>(b - a) >= kMaxHosts) throw bad(list, "range '" + item + "' is too large");
    size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
    for (long n = a; n <= b; ++n) {
      std::string s = std::to_string(n);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(s);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// One name with any number of bracket groups: "rack[1-2]-gpu[01-02]".
void expand_name(const std::string& list, const std::string& name, std::vector<std::string>& out) {
  std::vector<std::string> partial{""};
  size_t i = 0;
  while (i < name.size()) {
    size_t open = name.find('[', i);
    std::string literal = name.substr(i, open == std::string::npos ? std::string::npos : open - i);
    if (literal.find(']') != std::string::npos) throw bad(list, "unmatched ']' in '" + name + "'");
    for (auto& p : partial) p += literal;
    if (open == std::string::npos) break;
    size_t close = name.find(']', open);
    if (close == std::string::npos) throw bad(list, "unclosed '[' in '" + name + "'");
    auto numbers = expand_ranges(list, name.substr(open + 1, close - open - 1));
    if (partial.size() * numbers.size() > kMaxHosts) throw bad(list, "too many hosts");
    std::vector<std::string> next;
    for (const auto& p : partial)
      for (const auto& n : numbers) next.push_back(p + n);
    partial = std::move(next);
    i = close + 1;
  }
  if (out.size() + partial.size() > kMaxHosts) throw bad(list, "too many hosts");
  out.insert(out.end(), partial.begin(), partial.end());
}

int positive(const EnvLookup& env, const char* name, int min) {
  const char* v = env(name);
  char* end = nullptr;
  long n = v ? std::strtol(v, &end, 10) : -1;
  if (!v || !*v || *end != '\0' || n < min || n > 1000000)
    throw SlurmError(std::string("Slurm's ") + name + "=" + (v ? v : "(unset)") +
                     ": expected an integer >= " + std::to_string(min));
  return static_cast<int>(n);
}

const char* first_set(const EnvLookup& env, std::initializer_list<const char*> names,
                      const char** which) {
  for (const char* n : names) {
    const char* v = env(n);
    if (v && *v) {
      *which = n;
      return v;
    }
  }
  *which = *names.begin();
  return nullptr;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw bad(list, "unmatched ']'");
    if (c != ',' || depth > 0) continue;
    std::string name = list.substr(start, i - start);
    if (name.empty()) throw bad(list, "empty host name");
    expand_name(list, name, out);
    start = i + 1;
  }
  if (depth != 0) throw bad(list, "unclosed '['");
  return out;
}

std::optional<SlurmStep> slurm_step(const EnvLookup& env) {
  const char* off = env(base::kEnvSlurm);
  if (off && std::string(off) == "0") return std::nullopt;
  const char* job = env("SLURM_JOB_ID");
  const char* step = env("SLURM_STEP_ID");
  if (!job || !*job || !step || !*step) return std::nullopt;  // not inside srun

  SlurmStep s;
  const char* which = nullptr;
  const char* nodes = first_set(env, {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}, &which);
  s.nnodes = positive([&](const char*) { return nodes; }, which, 1);
  const char* tasks = env("SLURM_STEP_NUM_TASKS");
  if (tasks && *tasks) {
    int t = positive(env, "SLURM_STEP_NUM_TASKS", 1);
    if (t != s.nnodes)
      throw SlurmError("this srun step runs " + std::to_string(t) + " tasks on " +
                       std::to_string(s.nnodes) +
                       " nodes; ddprun starts the workers itself: use one task per node "
                       "(srun --ntasks-per-node=1), or set DDPRUN_SLURM=0");
  }
  s.node_rank = positive(env, "SLURM_NODEID", 0);
  const char* list = first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &which);
  if (!list) throw SlurmError("Slurm's SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset");
  auto hosts = expand_hostlist(list);
  s.first_host = hosts.front();
  int job_id = positive(env, "SLURM_JOB_ID", 0);
  s.port = 29400 + job_id % 1000;
  s.run_id = "slurm-" + std::string(job) + "." + step;
  return s;
}

}  // namespace ddprun::launcher
