#include "watchdog/live_stack.h"

#include <signal.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <thread>

#include "base/contract.h"
#include "base/procfs.h"
#include "base/system_error.h"

namespace ddprun::watchdog {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t file_size(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string read_from(const std::string& path, uint64_t offset) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

LiveDump dump_python_stack(pid_t pid, std::chrono::milliseconds timeout) {
  LiveDump out;
  const auto sig_text = base::proc_environ_value(pid, base::kEnvPyStackSignal);
  const auto dir = base::proc_environ_value(pid, base::kEnvPyStackDir);
  if (!sig_text || !dir) {
    out.instrumented = false;
    out.note = "not started with ddprun's stack signal";
    return out;
  }
  int sig = 0;
  try {
    sig = std::stoi(*sig_text);
  } catch (const std::exception&) {
  }
  if (!base::catches_signal(pid, sig)) {
    out.note = fmt::format("no handler for signal {} (not Python, or faulthandler was not "
                           "registered)", sig);
    return out;
  }
  const std::string path = *dir + "/" + base::kFilePyStackPrefix + std::to_string(pid) + ".txt";
  const uint64_t before = file_size(path);
  if (::kill(pid, sig) != 0) {
    out.note = fmt::format("kill({}, {}): {}", pid, sig, base::errno_text(errno));
    return out;
  }
  // faulthandler writes from the signal handler with a few write(2) calls:
  // done once the file stops growing.
  const auto deadline = Clock::now() + timeout;
  uint64_t size = before;
  auto changed = Clock::now();
  while (Clock::now() < deadline) {
    const uint64_t now_size = file_size(path);
    if (now_size != size) {
      size = now_size;
      changed = Clock::now();
    } else if (size > before && Clock::now() - changed > std::chrono::milliseconds(50)) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (size <= before) {
    out.note = fmt::format("no traceback within {} ms (the interpreter may be stuck in a call "
                           "holding the signal)", timeout.count());
    return out;
  }
  out.text = read_from(path, before);
  out.ok = true;
  return out;
}

}  // namespace ddprun::watchdog
