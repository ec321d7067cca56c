#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "tests/trainer/temp_dir.h"
#include "trainer/checkpoint.h"
#include "trainer/error.h"

using namespace ddprun::trainer;
using ddprun::trainer::testing::TempDir;

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
