// The control socket refuses another user, at both of its layers: the
// private folder keeps a plain other user from reaching the socket, and a
// client of another uid that gets past the folder (CAP_DAC_OVERRIDE kept
// across setuid) is refused by the server's SO_PEERCRED check. The clients
// are forked children that setuid to nobody; needs root (else exit 77).
#include <doctest/doctest.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "introspect/client.h"
#include "introspect/registry.h"
#include "tests/introspect/one_rank_job.h"

namespace {

using ddprun::testing::DdprunProcess;
using ddprun::testing::TempDir;
constexpr uid_t kNobody = 65534;

// What the child saw, as its exit code.
enum Outcome { kNoConnect = 10, kRefused = 11, kAnswered = 12, kSetupFailed = 13 };

// In a forked child: become uid/gid nobody (keeping CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH effective when `keep_dac`), connect to `socket`, send a
// status request and read until EOF (up to 10 s). Never returns.
[[noreturn]] void client_as_nobody(const std::string& socket, bool keep_dac) {
  if (keep_dac && ::prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) ::_exit(kSetupFailed);
  if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
      ::setresuid(kNobody, kNobody, kNobody) != 0) {
    ::_exit(kSetupFailed);
  }
  if (keep_dac) {
    __user_cap_header_struct head{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    if (::syscall(SYS_capget, &head, data) != 0) ::_exit(kSetupFailed);
    data[0].effective = (1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH);
    if (::syscall(SYS_capset, &head, data) != 0) ::_exit(kSetupFailed);
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, socket.c_str(), sizeof a.sun_path - 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(kNoConnect);
  const char request[] = "{\"op\":\"status\"}\n";
  (void)!::send(fd, request, sizeof request - 1, MSG_NOSIGNAL);
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) ::_exit(kAnswered);  // kept open: not refused
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) ::_exit(kAnswered);
    ::_exit(kRefused);  // closed without a byte (or reset)
  }
}

int run_client(const std::string& socket, bool keep_dac) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) client_as_nobody(socket, keep_dac);
  int status = 0;
  REQUIRE(ddprun::testing::wait_child(pid, std::chrono::seconds(30), &status));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("status: the control socket refuses a client of another user") {
  if (::geteuid() != 0) {
    MESSAGE("SKIP: needs root to become another user (nobody)");
    std::exit(77);
  }
  ddprun::testing::OneRankJob one("uid");
  const std::string& socket = one.socket;
  // A plain other user cannot even reach the socket (its folder is 0700).
  CHECK(run_client(socket, false) == kNoConnect);
  // One that gets past the folder connects, and the server closes on it
  // without a reply.
  CHECK(run_client(socket, true) == kRefused);
  // The owner is still served.
  const auto ok = ddprun::introspect::ask_agent(socket, {{"op", "status"}}, std::chrono::seconds(10));
  CHECK(ok["workers"].size() == 1);
  one.finish();
}
