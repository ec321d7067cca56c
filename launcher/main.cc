// ddprun: parses the command line into agent::Options and runs the agent;
// everything else lives in the ddprun_agent and ddprun_launcher libraries.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "agent/agent.h"
#include "launcher/cli.h"

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_logger_st("ddprun");
  logger->set_pattern("ddprun: %v");
  spdlog::set_default_logger(logger);

  ddprun::launcher::ParseResult parsed;
  try {
    parsed = ddprun::launcher::parse_command_line(argc, argv);
  } catch (const ddprun::launcher::UsageError& e) {
    std::fprintf(stderr, "ddprun: %s (see ddprun --help)\n", e.what());
    return ddprun::launcher::kUsageExit;
  }
  if (parsed.help) {
    std::fputs(parsed.help_text.c_str(), stdout);
    return 0;
  }
  if (parsed.options.max_nodes > 1) {
    std::fprintf(stderr, "ddprun: --nnodes=%d:%d: multi-node jobs are not supported yet "
                 "(see ddprun --help)\n", parsed.options.min_nodes, parsed.options.max_nodes);
    return ddprun::launcher::kUsageExit;
  }
  ddprun::agent::Agent agent(std::move(parsed.options));
  return agent.run();
}
