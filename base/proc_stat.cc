#include "base/proc_stat.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "base/scoped_fd.h"

namespace ddprun::base {

std::optional<ProcStat> parse_proc_stat(std::string_view line) {
  auto open = line.find('(');
  auto close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    return std::nullopt;
  ProcStat st;
  st.pid = static_cast<pid_t>(std::atoi(std::string(line.substr(0, open)).c_str()));
  st.comm = std::string(line.substr(open + 1, close - open - 1));
  // After ") ": field 3 state, 4 ppid, 5 pgrp, 6 session, ... 22 starttime.
  std::string rest(line.substr(close + 1));
  char state = 0;
  int ppid = 0, pgrp = 0, session = 0;
  if (std::sscanf(rest.c_str(), " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4)
    return std::nullopt;
  st.state = state;
  st.ppid = ppid;
  st.pgrp = pgrp;
  st.session = session;
  // Fields 14 utime, 15 stime, 22 starttime, 24 rss: walked once, by number.
  const char* p = rest.c_str();
  for (int field = 3; *p && field <= 24; ++field) {
    while (*p == ' ') ++p;
    const unsigned long long v = std::strtoull(p, nullptr, 10);
    if (field == 14) st.utime = v;
    if (field == 15) st.stime = v;
    if (field == 22) st.start_time = v;
    if (field == 24) st.rss_pages = v;
    while (*p && *p != ' ') ++p;
  }
  return st;
}

std::optional<ProcStat> read_proc_stat(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  ScopedFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  char buf[1024];
  size_t len = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf + len, sizeof buf - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += static_cast<size_t>(n);
    if (len == sizeof buf) break;
  }
  if (len == 0) return std::nullopt;
  return parse_proc_stat(std::string_view(buf, len));
}

}  // namespace ddprun::base
