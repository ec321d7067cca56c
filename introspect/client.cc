#include "introspect/client.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>

#include "base/scoped_fd.h"
#include "base/system_error.h"
#include "introspect/control_wire.h"

namespace ddprun::introspect {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& socket, const std::string& what) {
  throw std::runtime_error("agent at " + socket + ": " + what);
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<long>(0, left.count()));
}

std::string bytes_text(double b) {
  if (b >= 1 << 30) return fmt::format("{:.1f}G", b / (1 << 30));
  if (b >= 1 << 20) return fmt::format("{:.0f}M", b / (1 << 20));
  return fmt::format("{:.0f}K", b / 1024);
}

}  // namespace

nlohmann::json ask_agent(const std::string& socket, const nlohmann::json& request,
                         std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  base::ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) fail(socket, base::describe_error("socket", "", errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.size() >= sizeof addr.sun_path) fail(socket, "path too long");
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    fail(socket, base::describe_error("connect", "", errno));
  }
  const std::string line = request.dump() + "\n";
  std::size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      fail(socket, base::describe_error("send", "", errno));
    }
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, ms_left(deadline)) == 0) fail(socket, "timed out sending the request");
  }
  std::string reply;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      reply.append(buf, static_cast<std::size_t>(n));
      if (reply.size() > control_wire::kMaxReplyBytes) fail(socket, "reply too large");
      if (reply.back() == '\n') break;
      continue;
    }
    if (n == 0) break;
    if (errno != EAGAIN && errno != EINTR) fail(socket, base::describe_error("recv", "", errno));
    const int left = ms_left(deadline);
    pollfd p{fd.get(), POLLIN, 0};
    if (left == 0 || ::poll(&p, 1, left) == 0) {
      fail(socket, fmt::format("no reply within {} ms", timeout.count()));
    }
  }
  try {
    return nlohmann::json::parse(reply);
  } catch (const std::exception& e) {
    fail(socket, std::string("malformed reply: ") + e.what());
  }
}

std::vector<nlohmann::json> job_agents(const std::vector<nlohmann::json>& replies) {
  std::vector<nlohmann::json> out;
  std::set<std::pair<std::string, int64_t>> seen;
  auto add = [&](nlohmann::json a, const char* via) {
    const auto id = std::make_pair(a.value("host", ""), a.value("agent_pid", int64_t{0}));
    if (!seen.insert(id).second) return;
    a["via"] = via;
    out.push_back(std::move(a));
  };
  for (const auto& r : replies) {
    nlohmann::json own = r;
    own.erase("peers");
    add(std::move(own), "socket");
  }
  for (const auto& r : replies)
    for (const auto& p : r.value("peers", nlohmann::json::array())) add(p, "store");
  return out;
}

std::string status_table(const std::vector<nlohmann::json>& replies) {
  struct Row {
    int rank;
    std::vector<std::string> cells;
  };
  std::vector<Row> rows;
  for (const auto& r : replies) {
    for (const auto& w : r.value("workers", nlohmann::json::array())) {
      auto num = [&](const char* key, const char* fmt_spec) -> std::string {
        return w.contains(key) && w[key].is_number()
                   ? fmt::format(fmt::runtime(fmt_spec), w[key].get<double>())
                   : "-";
      };
      std::string state = w.value("state", "?");
      if (w.value("straggler", false)) state += " STRAGGLER";
      rows.push_back(
          {w.value("rank", -1),
           {std::to_string(w.value("rank", -1)), r.value("host", "?"),
            std::to_string(w.value("pid", 0)), state,
            w.contains("step") && w["step"].is_number() ? std::to_string(w["step"].get<int64_t>())
                                                         : "-",
            w.contains("beat_age_s") && w["beat_age_s"].is_number()
                ? fmt::format("{:.1f}s", w["beat_age_s"].get<double>())
                : "-",
            num("steps_per_s", "{:.2f}"), num("cpu_percent", "{:.0f}"),
            bytes_text(w.value("rss_bytes", 0.0)), std::to_string(r.value("restarts", 0)),
            std::to_string(r.value("attempt", 0))}});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.rank < b.rank; });
  // Column titles; not-a-contract-name
  const std::vector<std::string> head = {"RANK", "HOST",  "PID", "STATE",    "STEP",   "BEAT_AGE",
                                         "STEPS/S", "CPU%", "RSS", "RESTARTS", "ATTEMPT"};
  std::vector<std::size_t> width(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.cells.size(); ++i) width[i] = std::max(width[i], r.cells[i].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      s += fmt::format("{:<{}}", cells[i], width[i]);
      if (i + 1 < cells.size()) s += "  ";
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out;
  for (const auto& r : replies) {
    std::string where = fmt::format("agent pid {}", r.value("agent_pid", 0));
    if (r.contains("node")) where += fmt::format(", node {}", r["node"].get<int>());
    if (r.value("via", "") == "store") {
      where += r.contains("age_s") && r["age_s"].is_number()
                   ? fmt::format(", via the store, {:.1f} s old", r["age_s"].get<double>())
                   : ", via the store";
    }
    out += fmt::format("run {} on {} ({}): attempt {}, {} restart{}\n",
                       r.value("run_id", "?"), r.value("host", "?"), where,
                       r.value("attempt", 0), r.value("restarts", 0),
                       r.value("restarts", 0) == 1 ? "" : "s");
    // Freeze detection's timeouts and what each was learned from.
    if (r.contains("hang_timeouts") && r["hang_timeouts"].is_array()) {
      for (const auto& t : r["hang_timeouts"])
        if (t.is_object()) out += "  hang timeout " + t.value("text", std::string("?")) + "\n";
    } else if (r.contains("hang_timeout") && r["hang_timeout"].is_string()) {
      out += "  hang timeout: " + r["hang_timeout"].get<std::string>() + "\n";
    }
  }
  out += line(head);
  for (const auto& r : rows) out += line(r.cells);
  return out;
}

}  // namespace ddprun::introspect
