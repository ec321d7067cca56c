// Real `train` processes against damaged and full checkpoint folders: corrupt
// newest checkpoints, --keep 1, a tmpfs sized for --keep checkpoints, and a
// run resumed at its last step. Ranks are started directly with torchrun's
// environment (a restart is a second run with TORCHELASTIC_RESTART_COUNT=1,
// as the agent would start it); every run has a deadline.
//
// The tmpfs case mounts in a private mount namespace (CAP_SYS_ADMIN); ctest
// runs it alone (-tc) and it exits 77, reported skipped, where it cannot.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sched.h>
#include <sys/inotify.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>

#include "tests/common/folder_names.h"
#include "tests/common/skip.h"
#include "tests/trainer/inotify_events.h"
#include "tests/trainer/process.h"
#include "tests/trainer/temp_dir.h"
#include "trainer/checkpoint.h"

using namespace ddprun::trainer;
using namespace ddprun::trainer::testing;
using ddprun::testing::names_in;
using namespace std::chrono_literals;

namespace {

const std::string kTrain = TRAIN_BIN;

struct Final {
  long long steps = -1;
  double samples_per_s = -1;
  std::string loss, acc;  // as printed: compared exactly
};

Final final_of(const std::string& out) {
  std::smatch m;
  static const std::regex re(
      R"(rank 0 steps (\d+) samples_per_s ([0-9.e+]+) final_loss (\S+) test_acc (\S+))");
  Final f;
  if (std::regex_search(out, m, re)) f = {std::stoll(m[1]), std::stod(m[2]), m[3], m[4]};
  return f;
}

// Checkpoints with higher steps whose payloads no longer match their manifests.
void write_corrupt(const std::string& folder, int count) {
  CheckpointDir other(CheckpointOptions{folder, 100});
  for (int i = 0; i < count; ++i) {
    Checkpoint c;
    c.step = 900 + i;
    c.blobs.push_back(Blob{"param.0", "float32", {4}, std::vector<uint8_t>(16, 1)});
    other.write(c);
  }
  for (int i = 0; i < count; ++i) {
    std::ofstream(other.payload_path(900 + i), std::ios::binary | std::ios::in) << "rot";
  }
}

std::vector<std::string> single(std::vector<std::string> argv, const std::string& dir) {
  argv.insert(argv.begin(), kTrain);
  for (std::string a : {"--backend", "gloo", "--log-every", "0", "--checkpoint-dir"}) {
    argv.push_back(a);
  }
  argv.push_back(dir);
  return argv;
}

}  // namespace

TEST_CASE("corrupt newest checkpoints: a crash resumes from the last good one, not step 0") {
  // keep 2 with two corrupt newer files, keep 1 with one: before the fix each
  // new checkpoint was pruned as soon as it was written.
  for (int keep : {2, 1}) {
    CAPTURE(keep);
    TempDir tmp;
    const std::string dir = tmp.file("ckpt");
    write_corrupt(dir, keep);
    const std::vector<std::string> argv =
        single({"--steps", "60", "--checkpoint-every", "20", "--fail-at-step", "50", "--keep",
                std::to_string(keep)}, dir);
    RankRun first = run_ranks(argv, 1, tmp.file("first"), 180s);
    INFO("first attempt:\n", first.outputs[0]);
    REQUIRE(first.codes[0] == 17);
    CHECK(first.outputs[0].find("does not verify, removing it") != std::string::npos);
    CheckpointDir check(CheckpointOptions{dir, keep});
    CHECK(check.list_steps() == (keep == 1 ? std::vector<int64_t>{40} : std::vector<int64_t>{20, 40}));
    RankRun second = run_ranks(argv, 1, tmp.file("second"), 180s,
                               {{"TORCHELASTIC_RESTART_COUNT", "1"}});
    INFO("restart:\n", second.outputs[0]);
    REQUIRE(second.codes[0] == 0);
    CHECK(second.outputs[0].find("resuming from " + check.manifest_path(40)) != std::string::npos);
    CHECK(final_of(second.outputs[0]).steps == 60);
  }
}

TEST_CASE("resumed at or past the last step: the checkpoint's step and loss, honestly") {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  RankRun done = run_ranks(single({"--steps", "30", "--checkpoint-every", "10"}, dir), 1,
                           tmp.file("done"), 180s);
  INFO("first run:\n", done.outputs[0]);
  REQUIRE(done.codes[0] == 0);
  const Final ran = final_of(done.outputs[0]);
  REQUIRE(ran.steps == 30);
  CHECK(ran.samples_per_s > 0);
  for (const char* steps : {"30", "20"}) {
    CAPTURE(steps);
    RankRun again = run_ranks(single({"--steps", steps, "--checkpoint-every", "10"}, dir), 1,
                              tmp.file(std::string("again") + steps), 180s);
    INFO("resumed run:\n", again.outputs[0]);
    REQUIRE(again.codes[0] == 0);
    CHECK(again.outputs[0].find("nothing left to train") != std::string::npos);
    const Final f = final_of(again.outputs[0]);
    CHECK(f.steps == 30);              // where the checkpoint is, not --steps
    CHECK(f.loss == ran.loss);         // the loss it was written with, not 0.0000
    CHECK(f.acc == ran.acc);           // the same parameters
    CHECK(f.samples_per_s == 0);       // nothing was timed (was 1e10)
  }
}

namespace {

// A tmpfs mounted in this process's own mount namespace: it disappears with
// the process, whatever happens to the test.
struct Tmpfs {
  Tmpfs(const std::string& path, size_t bytes) : path_(path) {
    std::filesystem::create_directories(path);
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                ("size=" + std::to_string(bytes)).c_str()) != 0) {
      std::printf("SKIP: cannot mount a tmpfs (%s): needs CAP_SYS_ADMIN\n", std::strerror(errno));
      std::fflush(stdout);
      std::_Exit(77);
    }
  }
  ~Tmpfs() { ::umount2(path_.c_str(), MNT_DETACH); }
  std::string path_;
};

size_t bytes_of(const std::string& folder) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(folder)) n += e.file_size();
  return n;
}

}  // namespace

TEST_CASE("a tmpfs sized for --keep checkpoints: pruning makes room, training never fails") {
  TempDir tmp;
  // One checkpoint's size, measured from a real one.
  RankRun probe = run_ranks(single({"--steps", "1", "--checkpoint-every", "1"}, tmp.file("probe")),
                            1, tmp.file("probe"), 180s);
  REQUIRE(probe.codes[0] == 0);
  const size_t one = bytes_of(tmp.file("probe"));
  REQUIRE(one > 1000000);
  for (int keep : {2, 1}) {
    CAPTURE(keep);
    // Room for `keep` checkpoints and half of one more.
    const std::string dir = tmp.file("full" + std::to_string(keep));
    Tmpfs fs(dir, size_t(keep) * one + one / 2);
    RankRun run = run_ranks(single({"--steps", "40", "--checkpoint-every", "5", "--keep",
                                    std::to_string(keep)}, dir),
                            1, tmp.file("run" + std::to_string(keep)), 180s);
    INFO("train output:\n", run.outputs[0]);
    REQUIRE(run.codes[0] == 0);
    CHECK(final_of(run.outputs[0]).steps == 40);
    CHECK(run.outputs[0].find("pruning older checkpoints and retrying once") != std::string::npos);
    CheckpointDir check(CheckpointOptions{dir, keep});
    for (const std::string& name : names_in(dir)) {
      CAPTURE(name);
      CHECK(name.find(".tmp.") == std::string::npos);
    }
    if (keep == 2) {
      // Every write succeeded after pruning: the last two remain.
      CHECK(check.list_steps() == std::vector<int64_t>{35, 40});
      CHECK(run.outputs[0].find("not written") == std::string::npos);
    } else {
      // No room for a second checkpoint beside the only good one: that one
      // (step 5) is kept, the later ones are reported not written.
      CHECK(check.list_steps() == std::vector<int64_t>{5});
      CHECK(run.outputs[0].find("checkpoint of step 40 not written") != std::string::npos);
    }
    CHECK_NOTHROW(check.load_step(check.list_steps().back()));
  }
}

// doctest's main, failing a run whose filters match no test case (skip.h).
int main(int argc, char** argv) { return ddprun::testing::main_with_skips(argc, argv); }

TEST_CASE("a tmpfs with room for fewer than --keep checkpoints: reported, new ones written") {
  TempDir tmp;
  RankRun probe = run_ranks(single({"--steps", "1", "--checkpoint-every", "1"}, tmp.file("probe")),
                            1, tmp.file("probe"), 180s);
  REQUIRE(probe.codes[0] == 0);
  const size_t one = bytes_of(tmp.file("probe"));
  // Room for two and a half checkpoints, --keep 4.
  const std::string dir = tmp.file("small");
  Tmpfs fs(dir, 2 * one + one / 2);
  RankRun run = run_ranks(single({"--steps", "40", "--checkpoint-every", "5", "--keep", "4"}, dir),
                          1, tmp.file("run"), 180s);
  INFO("train output:\n", run.outputs[0]);
  REQUIRE(run.codes[0] == 0);
  CHECK(run.outputs[0].find("room for fewer than --keep=4 checkpoints") != std::string::npos);
  CHECK(run.outputs[0].find("not written") == std::string::npos);
  CheckpointDir check(CheckpointOptions{dir, 4});
  const std::vector<int64_t> steps = check.list_steps();
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.back() == 40);  // the newest was written, not refused for the old ones
}

namespace {

// Waits (inotify, deadline) until `name` in `folder` is written to.
bool wait_written(const std::string& folder, const std::string& name,
                  std::chrono::steady_clock::time_point deadline) {
  const int watch = ::inotify_init1(IN_CLOEXEC);
  if (watch < 0 || ::inotify_add_watch(watch, folder.c_str(), IN_MODIFY | IN_CLOSE_WRITE) < 0)
    return false;
  const bool seen = until_event(watch, deadline, [&](uint32_t, const std::string& n) { return n == name; });
  ::close(watch);
  return seen;
}

}  // namespace

TEST_CASE("a second run on a checkpoint folder in use is refused, naming the holder") {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  std::filesystem::create_directories(dir);
  std::map<std::string, std::string> env = {
      {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_WORLD_SIZE", "1"},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(free_port())},
      {"OMP_NUM_THREADS", "1"}};
  // Long enough to hold the folder while the second one starts; killed after.
  // No periodic checkpoint: under load the second run's start took 6 s, in
  // which this one reached step 1000 and wrote one (the check below failed).
  Process first(single({"--steps", "1000000", "--checkpoint-every", "0"}, dir), env,
                tmp.file("first.log"));
  REQUIRE(wait_written(dir, "lock", std::chrono::steady_clock::now() + 180s));
  RankRun second = run_ranks(single({"--steps", "20", "--checkpoint-every", "10", "--seed", "7"},
                                    dir),
                             1, tmp.file("second"), 180s);
  INFO("second run:\n", second.outputs[0]);
  CHECK(second.codes[0] != 0);
  CHECK(second.outputs[0].find("checkpoint folder " + dir + " is in use by ") !=
        std::string::npos);
  CHECK(second.outputs[0].find(" pid ") != std::string::npos);
  CheckpointDir check(CheckpointOptions{dir, 3});
  CHECK(check.list_steps().empty());  // the refused run wrote nothing
  first.signal(SIGKILL);
  first.wait_for(std::chrono::steady_clock::now() + 60s);
}

TEST_CASE("bit flips in the newest manifest: train resumes from the older good one, exit 0") {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  RankRun made = run_ranks(single({"--steps", "20", "--checkpoint-every", "10", "--keep", "5"},
                                  dir),
                           1, tmp.file("made"), 180s);
  INFO("first run:\n", made.outputs[0]);
  REQUIRE(made.codes[0] == 0);
  CheckpointDir check(CheckpointOptions{dir, 5});
  REQUIRE(check.list_steps() == std::vector<int64_t>{10, 20});
  std::ifstream in(check.manifest_path(20), std::ios::binary);
  const std::string intact((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A few real runs (each starts LibTorch); 200 flips run in-process in
  // trainer_core_tests against the same reader.
  std::mt19937_64 gen(12345);
  for (int i = 0; i < 4; ++i) {
    const size_t bit = size_t(gen() % (intact.size() * 8));
    CAPTURE(bit);
    std::string flipped = intact;
    flipped[bit / 8] = char(flipped[bit / 8] ^ (1 << (bit % 8)));
    std::ofstream(check.manifest_path(20), std::ios::binary | std::ios::trunc) << flipped;
    RankRun again = run_ranks(single({"--steps", "20", "--checkpoint-every", "100", "--keep",
                                      "5"}, dir),
                              1, tmp.file("again" + std::to_string(i)), 180s);
    INFO("resumed run:\n", again.outputs[0]);
    CHECK(again.codes[0] == 0);  // no crash loop
    CHECK(again.outputs[0].find("resuming from " + check.manifest_path(10)) != std::string::npos);
    CHECK(final_of(again.outputs[0]).steps == 20);
    // The run pruned the corrupt one; put it back for the next flip.
    std::ofstream(check.manifest_path(20), std::ios::binary | std::ios::trunc) << intact;
  }
}

// Issue 19: with under 5-8 MiB free in /dev/shm, --backend auto picked the
// shared-memory communicator and every attempt died of SIGBUS (exit 135).
// The segment of 2 ranks needs 17 MiB (2 x 2 x 4 MiB slots and a header):
// a 4 MiB /dev/shm (a tmpfs mounted
// over it in this process's own mount namespace, which the ranks inherit).
TEST_CASE("a 4 MiB /dev/shm: --backend auto falls back to gloo in one line, shm refuses") {
  TempDir tmp;
  Tmpfs shm("/dev/shm", 4 << 20);
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  RankRun fallback = run_ranks({kTrain, "--backend", "auto", "--steps", "20", "--log-every", "0",
                                "--checkpoint-dir", tmp.file("auto")},
                               2, tmp.file("auto"), 180s);
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, " output:\n", fallback.outputs[r]);
    CHECK(fallback.codes[r] == 0);
    CHECK(count(fallback.outputs[r], "/dev/shm has ") == 1);
    CHECK(count(fallback.outputs[r], "MiB free, the segment needs 17 MiB") == 1);
    CHECK(count(fallback.outputs[r], "--backend auto uses gloo") == 1);
    CHECK(fallback.outputs[r].find("rank " + std::to_string(r) + " steps 20 ") != std::string::npos);
  }
  RankRun forced = run_ranks({kTrain, "--backend", "shm", "--steps", "20", "--log-every", "0",
                              "--checkpoint-dir", tmp.file("shm")},
                             2, tmp.file("shm"), 180s);
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, " output:\n", forced.outputs[r]);
    CHECK(forced.codes[r] == 1);  // an error, not SIGBUS (135)
    CHECK(count(forced.outputs[r], "--backend shm: shm communicator: /dev/shm has ") == 1);
  }
}
