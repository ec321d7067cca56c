// A small worker program for the agent's integration tests. Each mode is one
// behaviour a test needs from a real worker process:
//
//   env FILE            write the environment to FILE.<RANK>, exit 0
//   crash-first R CODE  print "start rank=.. restart=..", then on restart 0
//                       rank R exits CODE and the others block; later
//                       attempts exit 0
//   fail R CODE         print "start ..."; rank R exits CODE, others block
//   block               fork a grandchild that blocks, print "ready rank=..
//                       pid=.. child=..", block (default signal actions)
//   ignore-term         like block, but ignores SIGTERM
//   escape              start a grandchild that calls setsid() and a
//                       double-forked daemon (setsid, stdio on /dev/null,
//                       its parent gone), print "ready rank=.. pid=..
//                       setsid=.. daemon=..", block
//   wait-file PATH      write the environment to PATH.env.<RANK>, print
//                       "waiting rank=..", exit 0 once PATH exists (30 s
//                       at most, else exit 3)
//   limits              print "nofile=<soft limit>", exit 0
//   lines N             print N numbered lines, each in two write() calls
//   error-file MSG      write torch's @record JSON with MSG, exit 1
//   long-line N         print one line of N bytes ("0123456789" repeated)
//   bytes N             print N bytes of 100-byte lines
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

extern char** environ;

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

[[noreturn]] void block_forever() {
  for (;;) pause();
}

void say(const std::string& line) {
  std::string s = line + "\n";
  ssize_t n = write(STDOUT_FILENO, s.data(), s.size());
  (void)n;
}

// Marks this rank as started in the attempt's log directory and, for the
// rank about to crash, waits (at most 10 s) until every local rank has
// marked itself: its crash must not tear down a peer before that peer's
// start line is out. Polls: the workers share nothing else to wait on.
void started_barrier(int local_rank, bool wait) {
  const char* dir = std::getenv("DDPRUN_LOG_DIR");
  int world = env_int("LOCAL_WORLD_SIZE");
  if (!dir || world < 1) return;
  std::string base = std::string(dir) + "/started.";
  std::ofstream(base + std::to_string(local_rank)).put('1');
  if (!wait) return;
  for (int waited_ms = 0; waited_ms < 10000; ++waited_ms) {
    int seen = 0;
    for (int r = 0; r < world; ++r) seen += access((base + std::to_string(r)).c_str(), F_OK) == 0;
    if (seen == world) return;
    usleep(1000);
  }
}

pid_t start_grandchild() {
  pid_t pid = fork();
  if (pid == 0) block_forever();
  return pid;
}

// A grandchild in a session (and so a process group) of its own.
// Returns once the grandchild has called setsid(), so that "ready" is only
// printed when it has really left the worker's process group.
pid_t start_setsid_grandchild() {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    setsid();
    close(p[1]);
    block_forever();
  }
  close(p[1]);
  char c;
  while (read(p[0], &c, 1) < 0 && errno == EINTR) {
  }
  close(p[0]);
  return pid;
}

// The classic daemon: fork, setsid, fork again, the middle process exits,
// stdio goes to /dev/null. Its pid comes back through a pipe.
pid_t start_daemon() {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t middle = fork();
  if (middle == 0) {
    setsid();
    if (fork() == 0) {
      int null = open("/dev/null", O_RDWR);
      for (int fd = 0; fd <= 2; ++fd) dup2(null, fd);
      pid_t self = getpid();
      ssize_t n = write(p[1], &self, sizeof self);
      (void)n;
      close(p[1]);
      block_forever();
    }
    _exit(0);
  }
  close(p[1]);
  waitpid(middle, nullptr, 0);
  pid_t daemon = -1;
  if (read(p[0], &daemon, sizeof daemon) != sizeof daemon) daemon = -1;
  close(p[0]);
  return daemon;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  std::string mode = argv[1];
  int rank = env_int("RANK");
  int restart = env_int("TORCHELASTIC_RESTART_COUNT");
  std::string start = "start rank=" + std::to_string(rank) + " restart=" + std::to_string(restart) +
                      " pid=" + std::to_string(getpid());

  if (mode == "env" && argc == 3) {
    std::ofstream out(std::string(argv[2]) + "." + std::to_string(rank));
    for (char** e = environ; *e; ++e) out << *e << '\n';
    return out.good() ? 0 : 1;
  }
  if ((mode == "crash-first" || mode == "fail") && argc == 4) {
    say(start);
    bool crash = mode == "fail" || restart == 0;
    if (!crash) return 0;
    bool crasher = rank == std::atoi(argv[2]);
    started_barrier(env_int("LOCAL_RANK"), crasher);
    if (crasher) return std::atoi(argv[3]);
    block_forever();
  }
  if (mode == "cgroup-crash-first" && argc == 3) {
    // Its own cgroup v2 path on every attempt; rank 1 of attempt 0 exits 3
    // once both have started; later attempts exit 0 (argv[2] "exit") or
    // block (containment_test: restarted workers' cgroup).
    std::ifstream in("/proc/self/cgroup");
    std::string cgroup;
    for (std::string line; std::getline(in, line);)
      if (line.rfind("0::", 0) == 0) cgroup = line.substr(3);
    say(start + " cgroup=" + cgroup);
    if (restart != 0 && std::string(argv[2]) == "exit") return 0;
    if (restart != 0) block_forever();
    started_barrier(env_int("LOCAL_RANK"), rank == 1);
    if (rank == 1) return 3;
    block_forever();
  }
  if (mode == "block" || mode == "ignore-term") {
    if (mode == "ignore-term") signal(SIGTERM, SIG_IGN);
    pid_t child = start_grandchild();
    say("ready rank=" + std::to_string(rank) + " pid=" + std::to_string(getpid()) +
        " child=" + std::to_string(child));
    block_forever();
  }
  if (mode == "escape") {
    pid_t escaped = start_setsid_grandchild();
    pid_t daemon = start_daemon();
    say("ready rank=" + std::to_string(rank) + " pid=" + std::to_string(getpid()) +
        " setsid=" + std::to_string(escaped) + " daemon=" + std::to_string(daemon));
    block_forever();
  }
  if (mode == "wait-file" && argc == 3) {
    std::string path = argv[2];
    {
      std::ofstream out(path + ".env." + std::to_string(rank));
      for (char** e = environ; *e; ++e) out << *e << '\n';
    }
    say("waiting rank=" + std::to_string(rank));
    // Polls: the test and two separate jobs share nothing else to wait on.
    for (int waited_ms = 0; waited_ms < 30000; waited_ms += 10) {
      if (access(path.c_str(), F_OK) == 0) return 0;
      usleep(10000);
    }
    return 3;
  }
  if (mode == "limits") {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    say("nofile=" + std::to_string(rl.rlim_cur));
    return 0;
  }
  if (mode == "lines" && argc == 3) {
    int n = std::atoi(argv[2]);
    for (int i = 0; i < n; ++i) {
      // Varying lengths, each line split across two writes, so the agent
      // sees partial lines in most reads.
      std::string line = "rank=" + std::to_string(rank) + " line=" + std::to_string(i) + " " +
                         std::string(static_cast<size_t>(i % 97), 'x') + "\n";
      size_t half = line.size() / 2;
      if (write(STDOUT_FILENO, line.data(), half) < 0) return 1;
      if (write(STDOUT_FILENO, line.data() + half, line.size() - half) < 0) return 1;
    }
    return 0;
  }
  if ((mode == "long-line" || mode == "bytes") && argc == 3) {
    size_t n = std::strtoull(argv[2], nullptr, 10);
    std::string text(n, 'x');
    for (size_t i = 0; i < n; ++i) text[i] = mode == "bytes" && i % 100 == 99 ? '\n' : "0123456789"[i % 10];
    if (mode == "long-line") text += '\n';
    size_t done = 0;
    while (done < text.size()) {
      ssize_t w = write(STDOUT_FILENO, text.data() + done, text.size() - done);
      if (w < 0) return 1;
      done += static_cast<size_t>(w);
    }
    return 0;
  }
  if (mode == "error-file" && argc == 3) {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (!path) return 2;
    std::ofstream out(path);
    out << R"({"message": {"message": ")" << argv[2]
        << R"(", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 7\nRuntimeError: )"
        << argv[2] << R"(", "timestamp": "1700000000"}}})";
    return 1;
  }
  std::fprintf(stderr, "test_worker: bad arguments\n");
  return 64;
}
