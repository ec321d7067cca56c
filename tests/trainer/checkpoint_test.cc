#include <doctest/doctest.h>

#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "tests/common/folder_names.h"
#include "tests/common/slurp.h"
#include "tests/trainer/inotify_events.h"
#include "tests/trainer/temp_dir.h"
#include "trainer/checkpoint.h"
#include "trainer/error.h"

using namespace ddprun::trainer;
using ddprun::testing::names_in;
using ddprun::testing::slurp;
using ddprun::trainer::testing::TempDir;
using ddprun::trainer::testing::until_event;

namespace {

Checkpoint make(int64_t step) {
  Checkpoint c;
  c.step = step;
  c.samples_consumed = step * 64;
  c.world_size = 2;
  c.seed = 9;
  c.blobs.push_back(Blob{"param.0", "float", {2, 3}, std::vector<uint8_t>(24, uint8_t(step))});
  c.blobs.push_back(Blob{"rng.cpu", "unsigned char", {5}, {1, 2, 3, 4, uint8_t(step)}});
  return c;
}

void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(char(c ^ 0x5a));
}

}  // namespace

TEST_CASE("checkpoint: written atomically, loads back exactly, keeps the last N") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.file("ckpt/nested"), 2});
  for (int64_t step : {10, 20, 30}) dir.write(make(step));
  CHECK(dir.list_steps() == std::vector<int64_t>{20, 30});
  CHECK_FALSE(std::filesystem::exists(dir.payload_path(10)));
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.file("ckpt/nested"))) {
    CHECK(e.path().string().find(".tmp") == std::string::npos);
    ++files;
  }
  CHECK(files == 4);
  std::optional<Checkpoint> c = dir.load_newest();
  REQUIRE(c.has_value());
  CHECK(c->step == 30);
  CHECK(c->samples_consumed == 30 * 64);
  CHECK(c->world_size == 2);
  CHECK(c->find("param.0")->bytes == std::vector<uint8_t>(24, 30));
  CHECK(c->find("param.0")->shape == std::vector<int64_t>{2, 3});
  CHECK(c->find("rng.cpu")->bytes == std::vector<uint8_t>{1, 2, 3, 4, 30});
}

TEST_CASE("checkpoint: corrupt or truncated newest ones are skipped for an older one") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.path(), 5});
  for (int64_t step : {1, 2, 3, 4}) dir.write(make(step));
  // 4: flipped payload byte. 3: truncated payload. 2: truncated manifest.
  flip_byte(dir.payload_path(4), 7);
  std::filesystem::resize_file(dir.payload_path(3), 10);
  std::filesystem::resize_file(dir.manifest_path(2), 20);
  CHECK_THROWS_WITH_AS(dir.load_step(4),
                       (dir.payload_path(4) + ": SHA-256 does not match the manifest (corrupt)").c_str(),
                       TrainerError);
  CHECK_THROWS_WITH_AS(dir.load_step(3),
                       (dir.payload_path(3) +
                        ": payload is 10 bytes, manifest says 29 (truncated?)").c_str(),
                       TrainerError);
  CHECK_THROWS_WITH_AS(dir.load_step(2),
                       (dir.manifest_path(2) + ": manifest is not valid JSON (truncated?)").c_str(),
                       TrainerError);
  std::optional<Checkpoint> c = dir.load_newest();
  REQUIRE(c.has_value());
  CHECK(c->step == 1);
}

TEST_CASE("checkpoint: nothing that verifies means a fresh start") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.path(), 2});
  CHECK_FALSE(dir.load_newest().has_value());
  dir.write(make(5));
  std::filesystem::remove(dir.payload_path(5));
  CHECK_FALSE(dir.load_newest().has_value());
  // Unrelated files in the folder are ignored.
  std::ofstream(tmp.file("step-00000009.json.tmp.1")) << "{";
  std::ofstream(tmp.file("notes.json")) << "{}";
  CHECK(dir.list_steps() == std::vector<int64_t>{5});
}

TEST_CASE("checkpoint: bad options and unwritable folders are clear errors") {
  CHECK_THROWS_WITH_AS(CheckpointDir(CheckpointOptions{"x", 0}), "--keep must be at least 1",
                       TrainerError);
  TempDir tmp;
  std::ofstream(tmp.file("file")) << "x";
  CheckpointDir dir(CheckpointOptions{tmp.file("file/sub"), 1});
  CHECK_THROWS_AS(dir.write(make(1)), TrainerError);
}

namespace {

// A checkpoint whose manifest is there but whose payload no longer matches:
// what a bad disk, or a copy cut short, leaves behind.
void write_corrupt(const std::string& folder, const std::vector<int64_t>& steps) {
  CheckpointDir other(CheckpointOptions{folder, 100});
  for (int64_t step : steps) other.write(make(step));
  for (int64_t step : steps) flip_byte(other.payload_path(step), 3);
}

}  // namespace

TEST_CASE("checkpoint: corrupt newest ones never push a new good one out") {
  TempDir tmp;
  {
    CheckpointDir earlier(CheckpointOptions{tmp.path(), 2});
    earlier.write(make(100));
    earlier.write(make(200));
  }
  write_corrupt(tmp.path(), {900, 1000});
  // A new run (a new object: nothing cached) resumes from the newest that
  // verifies and writes on from there.
  CheckpointDir dir(CheckpointOptions{tmp.path(), 2});
  std::optional<Checkpoint> c = dir.load_newest();
  REQUIRE(c.has_value());
  CHECK(c->step == 200);
  dir.write(make(300));
  CHECK(dir.list_steps() == std::vector<int64_t>{200, 300});
  dir.write(make(400));
  CHECK(dir.list_steps() == std::vector<int64_t>{300, 400});
  CHECK(dir.load_newest()->step == 400);
}

TEST_CASE("checkpoint: all-corrupt newest and --keep 1: the new checkpoint stays") {
  for (int keep : {1, 2}) {
    CAPTURE(keep);
    TempDir tmp;
    write_corrupt(tmp.path(), {50, 60});
    CheckpointDir dir(CheckpointOptions{tmp.path(), keep});
    CHECK_FALSE(dir.load_newest().has_value());  // a fresh start
    dir.write(make(10));
    CHECK(dir.list_steps() == std::vector<int64_t>{10});
    CHECK(dir.load_newest()->step == 10);
    dir.write(make(20));
    CHECK(dir.list_steps() == (keep == 1 ? std::vector<int64_t>{20} : std::vector<int64_t>{10, 20}));
    CHECK(names_in(tmp.path()).size() == 2 * dir.list_steps().size());
  }
}

TEST_CASE("checkpoint: the loss is recorded and read back; absent means NaN") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.path(), 3});
  Checkpoint with = make(7);
  with.loss = 0.125;
  dir.write(with);
  CHECK(dir.load_step(7).loss == 0.125);
  dir.write(make(8));
  CHECK(std::isnan(dir.load_step(8).loss));
}

TEST_CASE("checkpoint: leftovers of an unfinished write are removed at start-up, nothing else") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.path(), 3});
  dir.write(make(1));
  dir.write(make(2));
  // What a SIGKILL at each point of write() leaves: a half-written payload,
  // a payload renamed into place without its manifest, a half manifest.
  std::ofstream(tmp.file("step-0000000003.bin.tmp.4242")) << "half";
  std::ofstream(dir.payload_path(4)) << "no manifest follows";
  std::ofstream(tmp.file("step-0000000005.json.tmp.77")) << "{\"format\"";
  std::ofstream(tmp.file("notes.bin")) << "not ours";
  std::ofstream(tmp.file("other.tmp.1")) << "not ours";
  std::vector<std::string> removed = dir.remove_leftovers();
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{tmp.file("step-0000000003.bin.tmp.4242"),
                                            dir.payload_path(4),
                                            tmp.file("step-0000000005.json.tmp.77")});
  CHECK(names_in(tmp.path()) ==
        std::vector<std::string>{"notes.bin", "other.tmp.1", "step-0000000001.bin",
                                 "step-0000000001.json", "step-0000000002.bin",
                                 "step-0000000002.json"});
  CHECK(dir.load_newest()->step == 2);
}

TEST_CASE("checkpoint: SIGKILL mid-write, then start-up clean-up leaves only whole checkpoints") {
  TempDir tmp;
  const std::string folder = tmp.file("ckpt");
  CheckpointDir dir(CheckpointOptions{folder, 2});
  std::filesystem::create_directories(folder);
  const int watch = ::inotify_init1(IN_CLOEXEC);
  REQUIRE(watch >= 0);
  REQUIRE(::inotify_add_watch(watch, folder.c_str(), IN_CREATE | IN_MOVED_TO) >= 0);
  // A writer with a large payload spends nearly all its time inside write():
  // the kill lands mid-write (after the first whole checkpoint exists).
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    CheckpointDir writer(CheckpointOptions{folder, 2});
    Checkpoint big = make(0);
    big.blobs[0].bytes.assign(32u << 20, 7);
    for (int64_t step = 1;; ++step) {
      big.step = step;
      writer.write(big);
    }
  }
  // inotify tells when step 1 is complete and the next write has begun.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool first_done = false;
  const bool mid_write = until_event(watch, deadline, [&](uint32_t mask, const std::string& name) {
    if ((mask & IN_MOVED_TO) && name == "step-0000000001.json") first_done = true;
    // A temp name appears (O_TMPFILE: once its data is written and it is
    // linked in; else at once): the kill lands inside a checkpoint write.
    return (mask & IN_CREATE) && first_done && name.find(".tmp") != std::string::npos;
  });
  ::close(watch);
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(mid_write);
  CHECK(WIFSIGNALED(status));
  // The next run's start-up.
  CheckpointDir next(CheckpointOptions{folder, 2});
  next.remove_leftovers();
  for (const std::string& name : names_in(folder)) {
    CAPTURE(name);
    CHECK(name.find(".tmp") == std::string::npos);
    const std::string manifest = name.substr(0, name.size() - 4) + ".json";
    if (name.size() > 4 && name.substr(name.size() - 4) == ".bin") {
      CHECK(std::filesystem::exists(folder + "/" + manifest));
    }
  }
  const std::vector<int64_t> steps = next.list_steps();
  REQUIRE_FALSE(steps.empty());
  for (int64_t step : steps) CHECK_NOTHROW(next.load_step(step));
}

namespace {

void flip_bit(const std::string& path, size_t bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(bit / 8));
  char c;
  f.get(c);
  f.seekp(std::streamoff(bit / 8));
  f.put(char(c ^ (1 << (bit % 8))));
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

bool same(const Checkpoint& a, const Checkpoint& b) {
  if (a.step != b.step || a.samples_consumed != b.samples_consumed ||
      a.world_size != b.world_size || a.seed != b.seed || a.blobs.size() != b.blobs.size())
    return false;
  for (size_t i = 0; i < a.blobs.size(); ++i) {
    if (a.blobs[i].name != b.blobs[i].name || a.blobs[i].dtype != b.blobs[i].dtype ||
        a.blobs[i].shape != b.blobs[i].shape || a.blobs[i].bytes != b.blobs[i].bytes)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("checkpoint: 200 bit flips in the newest manifest never resume wrong, never throw") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.path(), 5});
  dir.write(make(10));
  dir.write(make(20));
  const std::string newest = dir.manifest_path(20);
  const std::string intact = slurp(newest);
  std::mt19937_64 gen(20261201);  // fixed: a failure names its bit
  int fell_back = 0, harmless = 0;
  for (int i = 0; i < 200; ++i) {
    const size_t bit = size_t(gen() % (intact.size() * 8));
    CAPTURE(bit);
    write_all(newest, intact);
    flip_bit(newest, bit);
    CheckpointDir fresh(CheckpointOptions{tmp.path(), 5});  // nothing cached
    std::optional<Checkpoint> got;
    REQUIRE_NOTHROW(got = fresh.load_newest());
    REQUIRE(got.has_value());
    // Either the flip changed nothing the manifest says (a blank for a
    // blank) and step 20 is exactly right, or step 10, the older good one.
    if (got->step == 20) {
      CHECK(same(*got, make(20)));
      ++harmless;
    } else {
      CHECK(same(*got, make(10)));
      ++fell_back;
    }
  }
  MESSAGE("fell back ", fell_back, ", harmless flips ", harmless);
  CHECK(fell_back > 150);
}

TEST_CASE("checkpoint: a manifest without its own checksum is not trusted") {
  TempDir tmp;
  CheckpointDir dir(CheckpointOptions{tmp.path(), 5});
  dir.write(make(10));
  dir.write(make(20));
  std::string text = slurp(dir.manifest_path(20));
  const size_t at = text.find("\"manifest_sha256\"");
  REQUIRE(at != std::string::npos);
  text.erase(at, text.find('\n', at) + 1 - at);  // its line, as a format-1 writer had it
  write_all(dir.manifest_path(20), text);
  CheckpointDir fresh(CheckpointOptions{tmp.path(), 5});
  CHECK_THROWS_WITH_AS(fresh.load_step(20), doctest::Contains("no checksum of its own"),
                       TrainerError);
  CHECK(fresh.load_newest()->step == 10);
}

TEST_CASE("checkpoint: a folder locked by one run refuses a second, naming the holder") {
  TempDir tmp;
  CheckpointDir first(CheckpointOptions{tmp.path(), 2});
  first.lock("host-a pid 111");
  // Another process: flock is per open file, so a second object in this
  // process would be refused too, but a child proves the cross-run case.
  const pid_t child = fork();
  if (child == 0) {
    CheckpointDir second(CheckpointOptions{tmp.path(), 2});
    try {
      second.lock("host-b pid 222");
      _exit(1);
    } catch (const TrainerError& e) {
      _exit(std::string(e.what()).find("in use by host-a pid 111") != std::string::npos ? 0 : 2);
    }
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("checkpoint: temp names are unpredictable and a planted symlink is not written "
          "through") {
  TempDir tmp;
  write_all(tmp.file("canary"), "precious");
  CheckpointDir dir(CheckpointOptions{tmp.file("ckpt"), 2});
  dir.write(make(1));
  // What the old writer would have used next, planted by an attacker.
  for (const char* name : {"step-0000000002.json.tmp.", "step-0000000002.bin.tmp."}) {
    std::filesystem::create_symlink(tmp.file("canary"),
                                    tmp.file("ckpt/") + name + std::to_string(::getpid()));
  }
  std::filesystem::create_symlink(tmp.file("canary"), tmp.file("ckpt/step-0000000002.bin"));
  dir.write(make(2));
  CHECK(slurp(tmp.file("canary")) == "precious");
  CHECK(dir.load_step(2).step == 2);
  CHECK(std::filesystem::is_regular_file(
      std::filesystem::symlink_status(tmp.file("ckpt/step-0000000002.bin"))));
}
