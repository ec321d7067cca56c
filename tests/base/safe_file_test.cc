// base/safe_file.h on real folders: what is created, what is refused
// (symlinks, others' folders, writable folders, control characters) and
// atomic replacement. Cases that need another owner chown to nobody (65534)
// and so run as root only (skipped otherwise).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "base/safe_file.h"
#include "tests/common/skip.h"
#include "tests/common/slurp.h"
#include "tests/common/temp_dir.h"

using ddprun::base::FileError;
using ddprun::base::SafeDir;
using ddprun::testing::slurp;
using ddprun::testing::TempDir;

namespace {

constexpr uid_t kNobody = 65534;

void spit(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The FileError's message, or "" when `f` does not throw one.
template <typename F>
std::string refusal(F f) {
  try {
    f();
  } catch (const FileError& e) {
    return e.what();
  }
  return "";
}

bool is_root() { return ::geteuid() == 0; }

}  // namespace

TEST_CASE("SafeDir creates nested folders and exclusive files by descriptor") {
  TempDir t;
  SafeDir d = SafeDir::open(t.file("a/b/c"), true);
  CHECK(d.path() == t.file("a/b/c"));
  CHECK_FALSE(d.shared());
  ddprun::base::ScopedFd f = d.create_file("x.log");
  REQUIRE(f);
  REQUIRE(::write(f.get(), "hi", 2) == 2);
  CHECK(slurp(t.file("a/b/c/x.log")) == "hi");
  const std::string again = refusal([&] { d.create_file("x.log"); });
  CHECK(again.find(t.file("a/b/c/x.log")) != std::string::npos);
  CHECK(again.find("exists") != std::string::npos);
  SafeDir sub = d.subdir("attempt_0/3", true);
  CHECK(sub.path() == t.file("a/b/c/attempt_0/3"));
  struct stat st{};
  REQUIRE(::stat(sub.path().c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
}

TEST_CASE("SafeDir never writes through a planted symlink below the folder") {
  TempDir t;
  spit(t.file("canary"), "precious");
  SafeDir d = SafeDir::open(t.file("logs"), true);
  REQUIRE(::symlink(t.file("canary").c_str(), t.file("logs/stdout.log").c_str()) == 0);
  CHECK_FALSE(refusal([&] { d.create_file("stdout.log"); }).empty());
  CHECK_FALSE(refusal([&] { d.open_append("stdout.log"); }).empty());
  CHECK_FALSE(refusal([&] { d.read_file("stdout.log"); }).empty());
  // A symlinked folder below is refused too, whoever owns it.
  REQUIRE(::symlink(t.path().c_str(), t.file("logs/attempt_0").c_str()) == 0);
  const std::string why = refusal([&] { d.subdir("attempt_0/0", true); });
  CHECK(why.find("symlink") != std::string::npos);
  // Atomic replacement replaces the link itself, never its target.
  d.write_atomically("stdout.log", "new", true);
  CHECK(slurp(t.file("canary")) == "precious");
  CHECK(slurp(t.file("logs/stdout.log")) == "new");
  struct stat st{};
  REQUIRE(::lstat(t.file("logs/stdout.log").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
}

TEST_CASE("SafeDir refuses an existing file with a second hard link for appending") {
  TempDir t;
  spit(t.file("canary"), "precious");
  SafeDir d = SafeDir::open(t.file("logs"), true);
  REQUIRE(::link(t.file("canary").c_str(), t.file("logs/events.jsonl").c_str()) == 0);
  CHECK(refusal([&] { d.open_append("events.jsonl"); }).find("single link") != std::string::npos);
  CHECK(slurp(t.file("canary")) == "precious");
  // Our own file, one link: appended to.
  spit(t.file("logs/ddprun.log"), "a");
  ddprun::base::ScopedFd f = d.open_append("ddprun.log");
  REQUIRE(::write(f.get(), "b", 1) == 1);
  CHECK(slurp(t.file("logs/ddprun.log")) == "ab");
}

TEST_CASE("SafeDir refuses a folder others can write unless sticky, and in a sticky one only "
          "creates") {
  TempDir t;
  REQUIRE(::mkdir(t.file("open").c_str(), 0700) == 0);
  REQUIRE(::chmod(t.file("open").c_str(), 0777) == 0);
  const std::string why = refusal([&] { SafeDir::open(t.file("open/logs"), true); });
  CHECK(why.find("refusing " + t.file("open")) != std::string::npos);
  CHECK(why.find("mode 0777") != std::string::npos);
  CHECK(why.find('\n') == std::string::npos);

  REQUIRE(::chmod(t.file("open").c_str(), 01777) == 0);
  SafeDir shared = SafeDir::open(t.file("open"));
  CHECK(shared.shared());
  spit(t.file("open/old.log"), "someone's");
  CHECK_FALSE(refusal([&] { shared.open_append("old.log"); }).empty());
  CHECK(shared.open_append("new.log"));
}

TEST_CASE("SafeDir refuses a folder another user owns") {
  if (!is_root()) SKIP_TEST("needs root to chown a folder to nobody");
  TempDir t;
  REQUIRE(::mkdir(t.file("hers").c_str(), 0755) == 0);
  REQUIRE(::chown(t.file("hers").c_str(), kNobody, kNobody) == 0);
  const std::string why = refusal([&] { SafeDir::open(t.file("hers/logs"), true); });
  CHECK(why.find("owned by uid 65534") != std::string::npos);
  struct stat st{};
  CHECK(::stat(t.file("hers/logs").c_str(), &st) != 0);  // nothing created in it
}

TEST_CASE("SafeDir follows a symlink of ours or root's in a sticky folder, not another user's") {
  if (!is_root()) SKIP_TEST("needs root to chown a symlink to nobody");
  TempDir t;
  REQUIRE(::mkdir(t.file("tmp").c_str(), 0700) == 0);
  REQUIRE(::chmod(t.file("tmp").c_str(), 01777) == 0);
  REQUIRE(::mkdir(t.file("real").c_str(), 0755) == 0);
  REQUIRE(::symlink(t.file("real").c_str(), t.file("tmp/mine").c_str()) == 0);
  REQUIRE(::symlink(t.file("real").c_str(), t.file("tmp/planted").c_str()) == 0);
  REQUIRE(::lchown(t.file("tmp/planted").c_str(), kNobody, kNobody) == 0);
  SafeDir mine = SafeDir::open(t.file("tmp/mine"));
  mine.create_file("ok");
  CHECK(::access(t.file("real/ok").c_str(), F_OK) == 0);
  const std::string why = refusal([&] { SafeDir::open(t.file("tmp/planted")); });
  CHECK(why.find("symlink owned by uid 65534") != std::string::npos);
}

TEST_CASE("SafeDir refuses a path holding a control character in one line") {
  TempDir t;
  const std::string why = refusal([&] { SafeDir::open(t.file("logs\nINFO forged"), true); });
  CHECK(why.find("control character") != std::string::npos);
  CHECK(why.find('\n') == std::string::npos);
  CHECK(why.find("logs\\nINFO forged") != std::string::npos);
  CHECK(ddprun::base::find_control_character("a\tb") == 1);
  CHECK(ddprun::base::find_control_character("plain") == -1);
}

TEST_CASE("write_atomically replaces a file whole and leaves no temp file") {
  TempDir t;
  SafeDir d = SafeDir::open(t.path());
  d.write_atomically("report.json", "one", false);
  d.write_atomically("report.json", std::string(100000, 'x'), true);
  CHECK(d.read_file("report.json") == std::string(100000, 'x'));
  CHECK(d.entries() == std::vector<std::string>{"report.json"});
  ddprun::base::write_file_atomically(t.file("other.txt"), "two", true);
  CHECK(slurp(t.file("other.txt")) == "two");
  CHECK(refusal([&] { d.read_file("report.json", 10); }).find("larger") != std::string::npos);
}

TEST_CASE("make_unique_subdir names are new and unpredictable") {
  TempDir t;
  SafeDir d = SafeDir::open(t.path());
  std::set<std::string> names;
  for (int i = 0; i < 20; ++i) {
    std::string name;
    d.make_unique_subdir("run_", 0700, &name);
    CHECK(name.rfind("run_", 0) == 0);
    CHECK(name.size() == 4 + 12);
    names.insert(name);
  }
  CHECK(names.size() == 20);
  struct stat st{};
  REQUIRE(::stat(t.file(*names.begin()).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("open_private_dir moves a folder another user planted aside and makes its own") {
  if (!is_root()) SKIP_TEST("needs root to chown a folder to nobody");
  TempDir t;
  REQUIRE(::mkdir(t.file("tmp").c_str(), 0700) == 0);
  REQUIRE(::chmod(t.file("tmp").c_str(), 01777) == 0);
  REQUIRE(::mkdir(t.file("tmp/ddprun-0").c_str(), 0777) == 0);
  REQUIRE(::chown(t.file("tmp/ddprun-0").c_str(), kNobody, kNobody) == 0);
  spit(t.file("tmp/ddprun-0/planted.json"), "{}");
  std::string note;
  SafeDir mine = ddprun::base::open_private_dir(SafeDir::open(t.file("tmp")), "ddprun-0", &note);
  CHECK(note.find("owned by uid 65534") != std::string::npos);
  CHECK(note.find("moved aside to " + t.file("tmp/ddprun-0.planted-")) != std::string::npos);
  struct stat st{};
  REQUIRE(::lstat(t.file("tmp/ddprun-0").c_str(), &st) == 0);
  CHECK(st.st_uid == ::geteuid());
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(mine.entries().empty());
  // Ours, but opened up: narrowed back to 0700, no note.
  REQUIRE(::chmod(t.file("tmp/ddprun-0").c_str(), 0755) == 0);
  note.clear();
  ddprun::base::open_private_dir(SafeDir::open(t.file("tmp")), "ddprun-0", &note);
  CHECK(note.empty());
  REQUIRE(::lstat(t.file("tmp/ddprun-0").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("open_private_dir replaces a planted symlink without following it") {
  if (!is_root()) SKIP_TEST("needs root to chown a symlink to nobody");
  TempDir t;
  REQUIRE(::mkdir(t.file("tmp").c_str(), 0700) == 0);
  REQUIRE(::chmod(t.file("tmp").c_str(), 01777) == 0);
  REQUIRE(::mkdir(t.file("victim").c_str(), 0755) == 0);
  REQUIRE(::symlink(t.file("victim").c_str(), t.file("tmp/ddprun-0").c_str()) == 0);
  REQUIRE(::lchown(t.file("tmp/ddprun-0").c_str(), kNobody, kNobody) == 0);
  std::string note;
  SafeDir mine = ddprun::base::open_private_dir(SafeDir::open(t.file("tmp")), "ddprun-0", &note);
  CHECK(note.find("a symlink owned by uid 65534") != std::string::npos);
  mine.create_file("x");
  CHECK(::access(t.file("victim/x").c_str(), F_OK) != 0);
  struct stat st{};
  REQUIRE(::stat(t.file("victim").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0755);
}
