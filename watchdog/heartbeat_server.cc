#include "watchdog/heartbeat_server.h"

#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "watchdog/error.h"
#include "watchdog/heartbeat_wire.h"

namespace ddprun::watchdog {

namespace asio = boost::asio;
using datagram = asio::local::datagram_protocol;

namespace {

constexpr auto kWarningInterval = std::chrono::seconds(5);
constexpr const char* kTmpPrefix = "/tmp/ddprun-hb-";

bool parse_int(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end;
}

bool valid_section(std::string_view s) {
  if (s.empty() || s.size() > heartbeat_wire::kMaxSectionBytes) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Which prefix the datagram starts with, and what its fields are.
struct KindSpec {
  const char* prefix;
  BeatKind kind;
};
constexpr KindSpec kKinds[] = {
    {heartbeat_wire::kPrefix, BeatKind::kExplicit},
    {heartbeat_wire::kPrefixAuto, BeatKind::kAuto},
    {heartbeat_wire::kPrefixForward, BeatKind::kForward},
    {heartbeat_wire::kPrefixSectionStart, BeatKind::kSectionStart},
    {heartbeat_wire::kPrefixSectionEnd, BeatKind::kSectionEnd},
};

}  // namespace

std::optional<Beat> parse_beat(std::string_view d) {
  if (d.size() > heartbeat_wire::kMaxDatagramBytes || d.empty() || d.back() != '\n') {
    return std::nullopt;
  }
  d.remove_suffix(1);
  const KindSpec* spec = nullptr;
  for (const KindSpec& k : kKinds) {
    const std::string_view prefix = k.prefix;
    if (d.substr(0, prefix.size()) == prefix) {
      spec = &k;
      d.remove_prefix(prefix.size());
      break;
    }
  }
  if (spec == nullptr) return std::nullopt;
  Beat b;
  b.kind = spec->kind;
  // Every kind but "fw" has a second field after the rank.
  std::string_view rank = d;
  std::string_view rest;
  if (b.kind != BeatKind::kForward) {
    const auto space = d.find(' ');
    if (space == std::string_view::npos) return std::nullopt;
    rank = d.substr(0, space);
    rest = d.substr(space + 1);
  }
  if (!parse_int(rank, b.global_rank) || b.global_rank < 0 ||
      b.global_rank >= heartbeat_wire::kMaxRank) {
    return std::nullopt;
  }
  switch (b.kind) {
    case BeatKind::kExplicit:
    case BeatKind::kAuto:
      if (!parse_int(rest, b.step) || b.step < heartbeat_wire::kNoStep) return std::nullopt;
      break;
    case BeatKind::kForward:
      break;
    case BeatKind::kSectionStart:
    case BeatKind::kSectionEnd:
      if (!valid_section(rest)) return std::nullopt;
      b.section = std::string(rest);
      break;
  }
  return b;
}

std::string choose_socket_path(const std::string& dir, const std::string& name) {
  const std::string direct = dir + "/" + name;
  if (direct.size() < sizeof(sockaddr_un::sun_path)) return direct;
  // Deep log directories overflow sun_path (108 bytes): use a private
  // mode-0700 directory under /tmp; the server removes it on close.
  std::string tmpl = std::string(kTmpPrefix) + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw sys_error("mkdtemp", tmpl, errno);
  return tmpl + "/" + name;
}

HeartbeatServer::HeartbeatServer(asio::io_context& io, std::string path, BeatHandler on_beat)
    : socket_(io), path_(std::move(path)), on_beat_(std::move(on_beat)) {
  if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
    throw WatchdogError("heartbeat socket path too long for AF_UNIX (" +
                        std::to_string(path_.size()) + " bytes): " + path_);
  }
  ::unlink(path_.c_str());
  boost::system::error_code ec;
  socket_.open(datagram(), ec);
  if (!ec) socket_.bind(datagram::endpoint(path_), ec);
  if (ec) throw WatchdogError("cannot bind heartbeat socket " + path_ + ": " + ec.message());
  // A worker step can beat in bursts; a larger buffer drops fewer beats.
  socket_.set_option(asio::socket_base::receive_buffer_size(1 << 20), ec);
  receive();
}

HeartbeatServer::~HeartbeatServer() {
  alive_.revoke();
  boost::system::error_code ec;
  socket_.close(ec);
  ::unlink(path_.c_str());
  if (path_.rfind(kTmpPrefix, 0) == 0) {
    ::rmdir(path_.substr(0, path_.rfind('/')).c_str());
  }
}

void HeartbeatServer::receive() {
  socket_.async_receive(asio::buffer(buf_), [this, alive = alive_.token()](
                                                 const boost::system::error_code& ec,
                                                 std::size_t n) {
    if (!alive || ec == asio::error::operation_aborted) return;  // `this` may be gone
    if (ec) {
      spdlog::warn("heartbeat socket {}: receive failed: {}", path_, ec.message());
    } else {
      on_datagram(n);
    }
    receive();
  });
}

void HeartbeatServer::on_datagram(std::size_t n) {
  auto beat = parse_beat(std::string_view(buf_, n));
  if (!beat) {
    ++malformed_;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_warning_ >= kWarningInterval) {
      std::string shown(buf_, std::min<std::size_t>(n, 40));
      for (char& c : shown) {
        if (c < 32 || c > 126) c = '?';
      }
      spdlog::warn("heartbeat socket {}: dropped malformed datagram \"{}\" ({} bytes; expected "
                   "\"hb|ab <rank> <step>\\n\", \"fw <rank>\\n\" or \"ss|se <rank> <section>\\n\"; "
                   "{} more suppressed)",
                   path_, shown, n, suppressed_warnings_);
      last_warning_ = now;
      suppressed_warnings_ = 0;
    } else {
      ++suppressed_warnings_;
    }
    return;
  }
  beat->received = std::chrono::steady_clock::now();
  on_beat_(*beat);
}

}  // namespace ddprun::watchdog
