#include "agent/exit_status.h"

#include <signal.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "base/subprocess.h"

namespace ddprun::agent {
namespace {

struct NamedSignal {
  int number;
  const char* name;
};

constexpr NamedSignal kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"},
    {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},     {SIGABRT, "SIGABRT"},
    {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},       {SIGKILL, "SIGKILL"},
    {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"},     {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"},
    {SIGCHLD, "SIGCHLD"}, {SIGCONT, "SIGCONT"},     {SIGSTOP, "SIGSTOP"},
    {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},     {SIGTTOU, "SIGTTOU"},
    {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"},     {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"},
    {SIGIO, "SIGIO"},     {SIGPWR, "SIGPWR"},       {SIGSYS, "SIGSYS"},
};

}  // namespace

ExitStatus ExitStatus::from_wait(int wait_status) {
  const auto t = base::termination(wait_status);
  if (!t) return exited(1);  // stopped/continued never reach us: we wait for exits only
  return t->signaled ? killed(t->signal) : exited(t->code);
}

std::string ExitStatus::describe() const {
  if (signaled) return "signal " + signal_name(signal);
  return "exit code " + std::to_string(code);
}

std::string signal_name(int sig) {
  for (const auto& s : kSignals)
    if (s.number == sig) return s.name;
  return "SIG" + std::to_string(sig);
}

int parse_signal(const std::string& name) {
  if (name.empty()) return 0;
  if (std::isdigit(static_cast<unsigned char>(name[0]))) {
    char* end = nullptr;
    long n = std::strtol(name.c_str(), &end, 10);
    return (*end == '\0' && n > 0 && n < NSIG) ? static_cast<int>(n) : 0;
  }
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  for (const auto& s : kSignals)
    if (upper == s.name) return s.number;
  return 0;
}

}  // namespace ddprun::agent
