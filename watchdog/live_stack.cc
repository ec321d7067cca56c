#include "watchdog/live_stack.h"

#include <signal.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <cerrno>
#include <fstream>
#include <functional>
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

// What the worker appended to its stack file after being sent the stack
// signal plus `signal_offset`, once `complete` says it is whole.
LiveDump signal_and_read(pid_t pid, int signal_offset, std::chrono::milliseconds timeout,
                         const std::function<bool(const std::string&)>& complete) {
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
    sig = std::stoi(*sig_text) + signal_offset;
  } catch (const std::exception&) {
  }
  if (!base::catches_signal(pid, sig)) {
    out.note = fmt::format("no handler for signal {} (not Python, or ddprun's sitecustomize did "
                           "not register it)", sig);
    return out;
  }
  const std::string path = *dir + "/" + base::kFilePyStackPrefix + std::to_string(pid) + ".txt";
  const uint64_t before = file_size(path);
  if (::kill(pid, sig) != 0) {
    out.note = fmt::format("kill({}, {}): {}", pid, sig, base::errno_text(errno));
    return out;
  }
  const auto deadline = Clock::now() + timeout;
  uint64_t size = before;
  auto changed = Clock::now();
  while (Clock::now() < deadline) {
    const uint64_t now_size = file_size(path);
    if (now_size != size) {
      size = now_size;
      changed = Clock::now();
    } else if (size > before && Clock::now() - changed > std::chrono::milliseconds(50) &&
               complete(read_from(path, before))) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (size <= before) {
    out.note = fmt::format("no answer within {} ms (the interpreter may be stuck in a call "
                           "holding the signal)", timeout.count());
    return out;
  }
  out.text = read_from(path, before);
  out.ok = true;
  return out;
}

constexpr char kProbeMark[] = "ddprun-probe ";

}  // namespace

LiveDump dump_python_stack(pid_t pid, std::chrono::milliseconds timeout) {
  // faulthandler writes from the signal handler with a few write(2) calls:
  // done once the file stops growing.
  return signal_and_read(pid, 0, timeout, [](const std::string&) { return true; });
}

BytecodeProbe probe_bytecode(pid_t pid, std::chrono::milliseconds timeout) {
  auto a = signal_and_read(pid, 1, timeout, [](const std::string& text) {
    const auto at = text.find(kProbeMark);
    return at != std::string::npos && text.find('\n', at) != std::string::npos;
  });
  BytecodeProbe out;
  out.bytes = a.text.size();
  const auto at = a.text.find(kProbeMark);
  const auto end = at == std::string::npos ? at : a.text.find('\n', at);
  if (!a.ok || end == std::string::npos) {
    out.note = a.ok ? "the answer was not a probe's" : a.note;
    return out;
  }
  const std::string answer = a.text.substr(at + sizeof kProbeMark - 1, end - at - (sizeof kProbeMark - 1));
  const auto space = answer.find(' ');
  try {
    out.line = std::stoi(answer.substr(0, space));
  } catch (const std::exception&) {
    out.note = "a malformed probe answer: " + answer;
    return out;
  }
  const auto second = space == std::string::npos ? space : answer.find(' ', space + 1);
  if (second == std::string::npos) {
    out.note = "a malformed probe answer: " + answer;
    return out;
  }
  out.function = answer.substr(space + 1, second - space - 1);
  out.file = answer.substr(second + 1);
  out.answered = true;
  return out;
}

}  // namespace ddprun::watchdog
