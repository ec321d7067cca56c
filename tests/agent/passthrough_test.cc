// Raw terminal passthrough through a real pseudo-terminal: while a worker's
// readline reads, ddprun's terminal is raw and the keys reach it as typed,
// so pdb's arrow-key history and Tab completion and input()'s line editing
// work as under torchrun; two waiting ranks are named and Ctrl-] n moves the
// input; the terminal's modes are the original ones again after Ctrl-C,
// SIGTERM, Ctrl-Z then SIGCONT, and a worker's SIGKILL. The workers are
// console_worker.py run by plain `python3` from PATH (no torch; its readline
// module is used). Each run mostly waits for Python to start: a few seconds.
#include <doctest/doctest.h>
#include <signal.h>
#include <termios.h>

#include <chrono>
#include <regex>
#include <thread>

#include "base/proc_stat.h"
#include "tests/agent/ddprun_process.h"
#include "tests/agent/pty_session.h"
#include "tests/common/skip.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;
using std::chrono::milliseconds;

namespace {

const std::string kWorker = std::string(WORKERS_DIR) + "/console_worker.py";
constexpr milliseconds kWait{30000};
const std::string kUp = "\x1b[A", kLeft = "\x1b[D", kBackspace = "\x7f";

bool has(const std::string& screen, const std::string& text) {
  return screen.find(text) != std::string::npos;
}

// `then` shows after `first` (the prompt after a command's answer).
bool has_after(const std::string& screen, const std::string& first, const std::string& then) {
  size_t at = screen.find(first);
  return at != std::string::npos && screen.find(then, at + first.size()) != std::string::npos;
}

// `prompt` shows after the last `answer`. Keys for a rank's next command
// wait for its prompt after its answer, not for the answer alone: until the
// agent has seen that prompt (it sees it before the screen does) the rank is
// busy and typed keys go to another rank (a loaded run lost a "c" so).
bool prompt_after_last(const std::string& screen, const std::string& answer,
                       const std::string& prompt) {
  size_t at = screen.rfind(answer);
  return at != std::string::npos && screen.find(prompt, at + answer.size()) != std::string::npos;
}

// Field by field, so a failure names the flag word or control character.
void check_same_modes(const termios& now, const termios& before) {
  CHECK(now.c_iflag == before.c_iflag);
  CHECK(now.c_oflag == before.c_oflag);
  CHECK(now.c_cflag == before.c_cflag);
  CHECK(now.c_lflag == before.c_lflag);
  for (size_t i = 0; i < NCCS; ++i) {
    CAPTURE(i);
    CHECK(now.c_cc[i] == before.c_cc[i]);
  }
}

bool raw(const PtySession& t) {
  termios m = t.modes();
  return !(m.c_lflag & (ICANON | ECHO)) && (m.c_lflag & ISIG);
}

// Polls (a terminal's modes and a process's state have no event to wait
// on) until `ok` holds or the deadline passes.
bool becomes(const std::function<bool()>& ok, milliseconds deadline) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (!ok()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

char state_of(pid_t pid) {
  auto st = ddprun::base::read_proc_stat(pid);
  return st ? st->state : '?';
}

}  // namespace

TEST_CASE("pdb on rank 1: the Up arrow recalls the last command from readline's history") {
  TempDir dir;
  PtySession t({"--nproc-per-node=2", kWorker, "pdb-rank1", dir.path()});
  CAPTURE(t.screen());
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default1]:(Pdb) "); }, kWait));
  CHECK(raw(t));  // readline reads: the terminal passes keys through
  t.type("p 6*7\r");
  // (A prompt drawn again below other output counts twice: >=.)
  REQUIRE(t.wait_for([](const std::string& s) { return has_after(s, "[default1]:42\r\n", "[default1]:(Pdb) "); },
                     kWait));
  t.type(kUp);
  REQUIRE(t.wait_for([](const std::string& s) { return count_of(s, "p 6*7") >= 2; }, kWait));
  t.type("\r");
  // The recalled line ran: 42 again.
  REQUIRE(t.wait_for([](const std::string& s) {
    return count_of(s, "[default1]:42\r\n") >= 2 &&
           prompt_after_last(s, "[default1]:42\r\n", "[default1]:(Pdb) ");
  }, kWait));
  CHECK_FALSE(has(t.screen(), "^[[A"));  // the arrow was readline's, not echoed as text
  t.type("c\r");
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default1]:after read"); }, kWait));
  CHECK(t.finish(kWait) == 0);
  check_same_modes(t.modes(), t.initial_modes());
}

TEST_CASE("pdb on rank 1: Tab completes a local variable's name and the completion shows") {
  PtySession t({"--nproc-per-node=2", kWorker, "pdb-local"});
  CAPTURE(t.screen());
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default1]:(Pdb) "); }, kWait));
  t.type("p zebra_cou\t");
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "(Pdb) p zebra_count"); }, kWait));
  t.type("\r");
  REQUIRE(t.wait_for([](const std::string& s) {
    return prompt_after_last(s, "[default1]:4242\r\n", "[default1]:(Pdb) ");
  }, kWait));
  t.type("c\r");
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default1]:after read"); }, kWait));
  CHECK(t.finish(kWait) == 0);
}

TEST_CASE("input() after import readline: Left arrows and Backspace edit the line sent") {
  PtySession t({kWorker, "edit"});
  CAPTURE(t.screen());
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default0]:edit? "); }, kWait));
  // "helXlo", two Left, Backspace: the X goes.
  t.type("helXlo" + kLeft + kLeft + kBackspace + "\r");
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default0]:got [hello]"); }, kWait));
  CHECK(t.finish(kWait) == 0);
}

TEST_CASE("two ranks in pdb: one line names the rank with the input, Ctrl-] n moves it") {
  for (bool stdin_rank_1 : {false, true}) {
    CAPTURE(stdin_rank_1);
    std::vector<std::string> args{"--nproc-per-node=2", kWorker, "pdb-both"};
    if (stdin_rank_1) args.insert(args.begin(), "--stdin-rank=1");
    PtySession t(args);
    CAPTURE(t.screen());
    const int first = stdin_rank_1 ? 1 : 0, second = 1 - first;
    auto r = [](int rank) { return std::to_string(rank); };
    // --stdin-rank picks the default among the waiting ranks.
    const std::string told = "ranks 0, 1 wait for input; typed input goes to rank " + r(first) +
                             " (Ctrl-] then a rank's digit, or Ctrl-] n for the next, switches)";
    REQUIRE(t.wait_for([&](const std::string& s) { return has(s, told); }, kWait));
    // A rank's answer, then its own prompt again: the agent saw that prompt
    // before it reached the screen, so from then on that rank waits and has
    // the input. Not just any "(Pdb) " after the answer: while a rank runs a
    // command the input is with the other, which ddprun redraws below the
    // answer; keys typed then reach the agent while the rank is still busy
    // and go to the only waiting one (a CI run under ASan; a loaded one).
    const auto answered = [&](int rank) {
      return [&, rank](const std::string& s) {
        return has_after(s, "[default" + r(rank) + "]:'rank" + r(rank) + "'",
                         "[default" + r(rank) + "]:(Pdb) ");
      };
    };
    t.type("p who\r");
    REQUIRE(t.wait_for(answered(first), kWait));
    t.type("\x1dn");  // Ctrl-] n: the next waiting rank
    REQUIRE(t.wait_for([&](const std::string& s) {
      return has(s, "ranks 0, 1 wait for input; typed input goes to rank " + r(second));
    }, kWait));
    t.type("p who\r");
    REQUIRE(t.wait_for(answered(second), kWait));
    t.type("c\r");
    REQUIRE(t.wait_for([&](const std::string& s) { return has(s, "after read " + r(second)); },
                       kWait));
    // Only the first waits now: the input is back with it.
    t.type("c\r");
    REQUIRE(t.wait_for([&](const std::string& s) { return has(s, "after read " + r(first)); },
                       kWait));
    CHECK(t.finish(kWait) == 0);
  }
}

TEST_CASE("the terminal's modes come back after Ctrl-C and SIGTERM in raw mode") {
  for (bool ctrl_c : {true, false}) {
    CAPTURE(ctrl_c);
    PtySession t({"--term-timeout=2", kWorker, "pdb"});
    CAPTURE(t.screen());
    REQUIRE(t.wait_for([](const std::string& s) { return has(s, "(Pdb) "); }, kWait));
    REQUIRE(raw(t));
    if (ctrl_c)
      t.type("\x03");  // ISIG is kept: SIGINT to ddprun
    else
      kill(t.pid(), SIGTERM);
    CHECK(t.finish(kWait) == (ctrl_c ? 130 : 143));
    check_same_modes(t.modes(), t.initial_modes());
  }
}

TEST_CASE("Ctrl-Z in raw mode: the modes come back before ddprun stops, raw again after SIGCONT") {
  PtySession t({kWorker, "pdb"});
  CAPTURE(t.screen());
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "(Pdb) "); }, kWait));
  REQUIRE(raw(t));
  t.type("\x1a");  // Ctrl-Z
  REQUIRE(becomes([&] { return state_of(t.pid()) == 'T'; }, kWait));
  check_same_modes(t.modes(), t.initial_modes());
  kill(t.pid(), SIGCONT);  // what fg does
  REQUIRE(becomes([&] { return raw(t); }, kWait));
  t.type("c\r");
  REQUIRE(t.wait_for([](const std::string& s) { return has(s, "[default0]:after breakpoint"); },
                     kWait));
  CHECK(t.finish(kWait) == 0);
  check_same_modes(t.modes(), t.initial_modes());
}

TEST_CASE("SIGKILL of the worker whose readline reads: the terminal's modes come back") {
  PtySession t({"--nproc-per-node=2", kWorker, "pdb-local"});
  CAPTURE(t.screen());
  std::regex ready("\\[default1\\]:ready pid=([0-9]+)");
  std::smatch m;
  REQUIRE(t.wait_for([&](const std::string& s) {
    return std::regex_search(s, m, ready) && has(s, "[default1]:(Pdb) ");
  }, kWait));
  REQUIRE(raw(t));
  kill(static_cast<pid_t>(std::stol(m[1].str())), SIGKILL);
  CHECK(t.finish(kWait) == 137);
  check_same_modes(t.modes(), t.initial_modes());
}
