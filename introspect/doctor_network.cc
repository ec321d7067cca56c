// doctor's network checks: interface variables, the rendezvous port, clocks.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/timex.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "introspect/doctor.h"
#include "base/scoped_fd.h"
#include "base/sysfs.h"
#include "base/system_error.h"

namespace ddprun::introspect {

using namespace base;  // the sysfs readers (base/sysfs.h)

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// NCCL_SOCKET_IFNAME: "^a,b" excludes, "=a,b" names exactly, "a,b" are
// prefixes. GLOO_SOCKET_IFNAME lists exact names.
std::vector<std::string> matching(const std::string& spec, bool nccl,
                                  const std::vector<std::string>& ifaces) {
  std::string list = spec;
  bool exclude = false, exact = !nccl;
  if (nccl && !list.empty() && list[0] == '^') exclude = true, list.erase(0, 1);
  if (nccl && !list.empty() && list[0] == '=') exact = true, list.erase(0, 1);
  const auto names = split_commas(list);
  std::vector<std::string> out;
  for (const auto& i : ifaces) {
    bool hit = false;
    for (const auto& n : names) hit |= exact ? i == n : i.rfind(n, 0) == 0;
    if (hit != exclude) out.push_back(i);
  }
  return out;
}

// "eth0 (up)": an interface and its operstate (lo says "unknown").
std::string with_state(const DoctorOptions& o, const std::string& iface) {
  return iface + " (" +
         read_text(o.root, "/sys/class/net/" + iface + "/operstate").value_or("state unknown") +
         ")";
}

std::vector<std::string> with_states(const DoctorOptions& o, const std::vector<std::string>& v) {
  std::vector<std::string> out;
  for (const auto& i : v) out.push_back(with_state(o, i));
  return out;
}

Finding ifname_finding(const DoctorOptions& o, const std::string& var, bool nccl) {
  Finding f{"ifname", Level::kOk, "", "", ""};
  const auto ifaces = list_dir(o.root, "/sys/class/net");
  auto it = o.env.find(var);
  if (it == o.env.end() || it->second.empty()) {
    f.level = Level::kInfo;
    f.finding = fmt::format("{} unset: {} picks an interface itself (interfaces: {})", var,
                            nccl ? "NCCL" : "Gloo", fmt::join(with_states(o, ifaces), ", "));
    return f;
  }
  const auto hits = matching(it->second, nccl, ifaces);
  if (hits.empty()) {
    f.level = Level::kFail;
    f.finding = fmt::format("{}={} matches no interface (have: {}): {} cannot connect", var,
                            it->second, fmt::join(with_states(o, ifaces), ", "), nccl ? "NCCL init" : "gloo");
    f.fix = fmt::format("set {} to one of: {}", var, fmt::join(ifaces, ", "));
    return f;
  }
  std::vector<std::string> down;
  for (const auto& h : hits) {
    if (read_text(o.root, "/sys/class/net/" + h + "/operstate").value_or("up") == "down")
      down.push_back(h);
  }
  f.finding = fmt::format("{}={} selects {}", var, it->second, fmt::join(with_states(o, hits), ", "));
  if (down.size() == hits.size()) {
    f.level = Level::kFail;
    f.finding += " (down)";
    f.fix = "bring the interface up or name another";
  }
  return f;
}

// The multi-node pitfall: the host name mapped to a loopback address in
// /etc/hosts (Debian's "127.0.1.1 <host>"). Gloo without
// GLOO_SOCKET_IFNAME binds and advertises the address the host name
// resolves to, so the other nodes are told to connect to 127.0.x.x. Read
// from files below the root (no resolver: its wait cannot be bounded).
Finding hostname_finding(const DoctorOptions& o) {
  Finding f{"hostname", Level::kOk, "", "", ""};
  const std::string host = read_text(o.root, "/proc/sys/kernel/hostname").value_or("");
  if (host.empty()) {
    f.level = Level::kInfo;
    f.finding = "host name unknown: not checked";
    return f;
  }
  std::istringstream hosts(read_bytes(o.root, "/etc/hosts", 1 << 20));
  std::string line;
  while (std::getline(hosts, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string addr, name;
    fields >> addr;
    while (fields >> name) {
      if (name != host && name != host.substr(0, host.find('.'))) continue;
      const bool loopback = addr.rfind("127.", 0) == 0 || addr == "::1";
      f.finding = fmt::format("host name {} maps to {} in /etc/hosts", host, addr);
      if (!loopback) return f;
      const auto gloo = o.env.find("GLOO_SOCKET_IFNAME");
      if (gloo != o.env.end() && !gloo->second.empty()) {
        f.level = Level::kInfo;
        f.finding += " (loopback; GLOO_SOCKET_IFNAME=" + gloo->second + " decides for Gloo)";
        return f;
      }
      f.level = Level::kWarn;
      f.finding += ": a loopback address, which Gloo advertises to the other nodes in a "
                   "multi-node job (they then connect to themselves and hang or time out)";
      f.fix = fmt::format("map {} to this node's network address in /etc/hosts, or set "
                          "GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to its interface, e.g. "
                          "GLOO_SOCKET_IFNAME=eth0; single-node jobs are not affected",
                          host);
      return f;
    }
  }
  f.finding = fmt::format("host name {} is not in /etc/hosts (DNS resolves it; not checked)", host);
  return f;
}

Finding port_finding(const DoctorOptions& o) {
  Finding f{"port", Level::kOk, "", "", ""};
  const base::ScopedFd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int fd = sock.get();
  if (fd < 0) {
    f.level = Level::kInfo;
    f.finding = std::string("cannot check ports: socket: ") + base::errno_text(errno);
    return f;
  }
  // The store binds with SO_REUSEADDR too, so TIME_WAIT leftovers are no problem.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(o.port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  const int err = errno;
  if (rc == 0) {
    f.finding = fmt::format("port {} is free", o.port);
  } else {
    f.level = Level::kFail;
    f.finding = fmt::format("port {} cannot be bound: {} (another job's store?)", o.port,
                            base::errno_text(err));
    f.fix = fmt::format("pick another --master-port, or find the holder: ss -ltnp 'sport = :{}'",
                        o.port);
  }
  return f;
}

Finding local_clock_finding() {
  Finding f{"clock", Level::kOk, "", "", ""};
  timex tx{};
  const int state = ::adjtimex(&tx);
  if (state == TIME_ERROR || (tx.status & STA_UNSYNC)) {
    f.level = Level::kWarn;
    f.finding = "the local clock is not synchronized (NTP): elastic rendezvous keep-alives "
                "compare times written by different hosts";
    f.fix = "run an NTP client (chrony, systemd-timesyncd) on every node";
  } else {
    f.finding = fmt::format("local clock synchronized (estimated error {:.1f} ms)",
                            tx.esterror / 1000.0);
  }
  return f;
}

// Seconds between 1900 (NTP) and 1970 (Unix).
constexpr double kNtpEpoch = 2208988800.0;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double ntp_time(const unsigned char* p) {
  const uint32_t s = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
  const uint32_t fr = (uint32_t(p[4]) << 24) | (uint32_t(p[5]) << 16) | (uint32_t(p[6]) << 8) | p[7];
  return s - kNtpEpoch + fr / 4294967296.0;
}

// One SNTP exchange (RFC 4330): offset of the server's clock from ours.
std::optional<double> sntp_offset(const sockaddr* addr, socklen_t len,
                                  std::chrono::milliseconds timeout, std::string& why) {
  const base::ScopedFd sock(::socket(addr->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  const int fd = sock.get();
  if (fd < 0) {
    why = base::describe_error("socket", "", errno);
    return std::nullopt;
  }
  unsigned char pkt[48] = {};
  pkt[0] = 0x23;  // LI 0, version 4, mode 3 (client)
  const double t1 = now_s();
  if (::sendto(fd, pkt, sizeof pkt, 0, addr, len) != sizeof pkt) {
    why = base::describe_error("sendto", "", errno);
    return std::nullopt;
  }
  pollfd p{fd, POLLIN, 0};
  int n;
  do n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  while (n < 0 && errno == EINTR);
  unsigned char reply[48];
  const ssize_t got = n > 0 ? ::recv(fd, reply, sizeof reply, 0) : -1;
  const double t4 = now_s();
  const int err = errno;
  if (n == 0) {
    why = fmt::format("no NTP answer within {} ms", timeout.count());
    return std::nullopt;
  }
  if (got != sizeof reply) {
    why = base::describe_error("no NTP answer", "", err);
    return std::nullopt;
  }
  const double t2 = ntp_time(reply + 32), t3 = ntp_time(reply + 40);
  return ((t2 - t1) + (t3 - t4)) / 2;
}

Finding skew_finding(const DoctorOptions& o) {
  Finding f{"clock", Level::kOk, "", "", ""};
  std::string host = o.endpoint;
  if (auto colon = host.rfind(':'); colon != std::string::npos && host.find(']') == std::string::npos)
    host = host.substr(0, colon);
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.ntp_port);
  // Numeric first: a name needs a resolver, whose wait we cannot bound here.
  hints.ai_flags = AI_NUMERICHOST;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    hints.ai_flags = 0;
    rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  }
  if (rc != 0) {
    f.level = Level::kFail;
    f.finding = fmt::format("rendezvous host {}: {}", host, gai_strerror(rc));
    f.fix = "check the --rdzv-endpoint / MASTER_ADDR host name";
    return f;
  }
  std::string why;
  const auto offset = sntp_offset(res->ai_addr, res->ai_addrlen, o.ntp_timeout, why);
  ::freeaddrinfo(res);
  if (!offset) {
    f.level = Level::kInfo;
    f.finding = fmt::format("clock skew with {} unknown: {}", host, why);
    return f;
  }
  const double skew = std::fabs(*offset);
  f.finding = fmt::format("clock of {} is {:+.3f} s from ours", host, *offset);
  if (skew > 1.0) {
    f.level = skew > 5.0 ? Level::kFail : Level::kWarn;
    f.finding += ": elastic rendezvous keep-alives (written with each host's clock) can "
                 "declare live nodes dead";
    f.fix = "synchronize clocks with NTP (chrony, systemd-timesyncd) on every node";
  }
  return f;
}

}  // namespace

std::vector<Finding> check_network(const DoctorOptions& o) {
  std::vector<Finding> out{ifname_finding(o, "NCCL_SOCKET_IFNAME", true),
                           ifname_finding(o, "GLOO_SOCKET_IFNAME", false)};
  out.push_back(hostname_finding(o));
  if (o.port > 0) {
    out.push_back(port_finding(o));
  } else {
    out.push_back({"port", Level::kInfo,
                   "no port checked: ddprun reserves a free MASTER_PORT itself; --port P checks "
                   "one this job would use (--master-port, --rdzv-endpoint's port on its host)",
                   "", ""});
  }
  out.push_back(local_clock_finding());
  if (!o.endpoint.empty()) out.push_back(skew_finding(o));
  return out;
}

}  // namespace ddprun::introspect
