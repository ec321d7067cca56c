// base/system_error.h on real failing calls: errno, its kind and the one
// wording survive from the failed call to the catch, and a safe_file refusal
// is caught as the same type.
#include <doctest/doctest.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "base/safe_file.h"
#include "base/scoped_fd.h"
#include "base/system_error.h"
#include "tests/common/loopback_port.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::base;
using ddprun::testing::TempDir;

TEST_CASE("SystemError carries the call, the target, errno and its kind") {
  TempDir t;
  const std::string path = t.file("absent/file");
  int err = 0;
  try {
    if (::open(path.c_str(), O_RDONLY | O_CLOEXEC) < 0) throw_system_error("open", path, errno);
  } catch (const SystemError& e) {
    err = e.error();
    CHECK(e.kind() == ErrorKind::not_found);
    CHECK(e.call() == "open");
    CHECK(e.target() == path);
    CHECK(std::string(e.what()) == "open " + path + ": No such file or directory");
  }
  CHECK(err == ENOENT);
  CHECK(describe_error("fork", "", EAGAIN) == "fork: " + errno_text(EAGAIN));
}

TEST_CASE("a port in use is kind in_use, as a caller that retries another port branches on") {
  ddprun::testing::LoopbackPort a;
  ScopedFd b(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(b.get() >= 0);
  REQUIRE(::listen(a.fd(), 1) == 0);
  const sockaddr_in addr = ddprun::testing::LoopbackPort::address(a.port());
  REQUIRE(::bind(b.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0);
  const SystemError e("bind", "127.0.0.1:" + std::to_string(a.port()), errno);
  CHECK(e.kind() == ErrorKind::in_use);
  CHECK(e.error() == EADDRINUSE);
}

TEST_CASE("errno_text is strerror's text, from any thread") {
  std::string from_thread;
  std::thread([&] { from_thread = errno_text(ENOSPC); }).join();
  CHECK(from_thread == std::strerror(ENOSPC));
  CHECK(error_kind(ENOSPC) == ErrorKind::no_space);
  CHECK(error_kind(EXDEV) == ErrorKind::other);
  CHECK_FALSE(errno_text(99999).empty());  // an unknown errno still says something
}

TEST_CASE("a planted symlink's refusal is a SystemError of kind link_refused") {
  TempDir t;
  SafeDir d = SafeDir::open(t.file("logs"), true);
  REQUIRE(::symlink(t.file("elsewhere").c_str(), t.file("logs/out.log").c_str()) == 0);
  ErrorKind kind = ErrorKind::other;
  try {
    d.open_append("out.log");  // O_NOFOLLOW: ELOOP on the link
  } catch (const SystemError& e) {
    kind = e.kind();
  }
  CHECK(kind == ErrorKind::link_refused);
}
