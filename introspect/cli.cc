#include "introspect/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "introspect/doctor.h"

extern char** environ;

namespace ddprun::introspect {

namespace {

constexpr int kUsageExit = 2;

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

int doctor_main(int argc, char** argv) {
  CLI::App app("ddprun doctor: pre-flight check of the causes of multi-GPU freezes and NCCL "
               "hangs (IOMMU/ACS, GPU topology, /dev/shm, limits, interfaces, ports, clocks)",
               "ddprun doctor");
  DoctorOptions o;
  o.env = environment();
  if (auto it = o.env.find("DDPRUN_DOCTOR_ROOT"); it != o.env.end()) o.root = it->second;
  bool json = false;
  app.add_option("--root", o.root,
                 "read /sys and /proc below this folder (default $DDPRUN_DOCTOR_ROOT or /)");
  app.add_flag("--json", json, "one JSON object instead of text");
  app.add_option("--port", o.port, "rendezvous port that must be free here (0: skip)")
      ->capture_default_str();
  app.add_option("--rdzv-endpoint", o.endpoint,
                 "host[:port] of the rendezvous: measure clock skew with it (SNTP)");
  app.add_option("--nvidia-smi", o.nvidia_smi, "nvidia-smi program ('' to skip)")
      ->capture_default_str();
  app.add_option("--ntp-port", o.ntp_port, "UDP port of the SNTP query")->capture_default_str();
  app.footer("Exit status: 0 nothing failed (warnings allowed), 1 a check failed, 2 wrong flags.");
  for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "ddprun doctor: %s (see ddprun doctor --help)\n", e.what());
    return kUsageExit;
  }
  const auto findings = run_doctor(o);
  if (json) {
    std::cout << to_json(findings).dump(2) << "\n";
  } else {
    std::cout << to_text(findings);
  }
  return exit_status(findings);
}

}  // namespace

bool is_subcommand(const std::string& a) {
  return a == "status" || a == "stacks" || a == "attach" || a == "doctor";
}

int run_subcommand(int argc, char** argv) {
  const std::string name = argv[0];
  if (name == "doctor") return doctor_main(argc, argv);
  std::fprintf(stderr, "ddprun %s: not implemented yet\n", name.c_str());
  return 1;
}

}  // namespace ddprun::introspect
