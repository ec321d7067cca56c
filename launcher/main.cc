// ddprun: parses the command line into agent::Options and runs the agent;
// everything else lives in the ddprun_agent and ddprun_launcher libraries.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "agent/agent.h"
#include "agent/elastic_rendezvous.h"
#include "agent/log_sink.h"
#include "base/phase_trace.h"
#include "introspect/agent_hook.h"
#include "introspect/cli.h"
#include "introspect/stacks.h"
#include "launcher/cli.h"
#include "observe/exposition.h"
#include "observe/metrics_server.h"
#include "observe/report_cli.h"
#include "watchdog/agent_hook.h"

int main(int argc, char** argv) {
  const int64_t started_ns = ddprun::base::monotonic_ns();  // the trace's "main"
  // One sink for every thread that logs (the loop, the store host, the
  // keep-alive, the rendezvous joins); while the agent runs it goes through
  // the console's writer, so a stalled stderr never blocks them (log_sink.h).
  auto log_sink = std::make_shared<ddprun::agent::LogSink>();
  auto logger = std::make_shared<spdlog::logger>("ddprun", log_sink);
  logger->set_pattern("ddprun: %v");
  spdlog::set_default_logger(logger);

  // `ddprun status|stacks|attach|doctor ...` (introspect/cli.h); a program
  // of that name runs as ./status.
  if (argc > 1 && ddprun::introspect::is_subcommand(argv[1])) {
    return ddprun::introspect::run_subcommand(argc - 1, argv + 1);
  }
  // `ddprun report RUN_DIR` (observe/report_cli.h); a program named report runs as ./report.
  if (argc > 1 && std::string(argv[1]) == "report") {
    return ddprun::observe::report_main(argc - 1, argv + 1);
  }
  ddprun::launcher::ParseResult parsed;
  try {
    parsed = ddprun::launcher::parse_command_line(argc, argv);
  } catch (const ddprun::launcher::UsageError& e) {
    std::fprintf(stderr, "ddprun: %s (see ddprun --help)\n", e.what());
    return ddprun::launcher::kUsageExit;
  }
  for (const auto& note : parsed.notes) spdlog::info("{}", note);
  if (parsed.help) {
    std::fputs(parsed.help_text.c_str(), stdout);
    return 0;
  }
  // The hang watchdog and its restart policy (watchdog/agent_hook.h).
  auto& options = parsed.options;
  ddprun::base::mark_phase(options.phase_trace, "main", {}, started_ns);
  options.pythonpath_prepend.push_back(ddprun::watchdog::heartbeat_python_dir());
  // ddprun's sitecustomize: `ddprun stacks` reads Python stacks (introspect/stacks.h).
  options.pythonpath_prepend.push_back(ddprun::introspect::python_dir());
  const auto monitor_options = ddprun::introspect::monitor_options_from(options);
  auto policy = std::make_unique<ddprun::watchdog::JobRestartPolicy>(
      ddprun::watchdog::restart_options_from(options));
  auto* job_policy = policy.get();
  const auto hook_options = ddprun::watchdog::hook_options_from(options);
  ddprun::observe::MetricsServerOptions metrics_options;
  metrics_options.address = options.metrics_addr;
  metrics_options.port = static_cast<uint16_t>(std::max(0, options.metrics_port));
  const bool serve_metrics = options.metrics_port >= 0;
  // Multi-node: the elastic rendezvous over our store (agent/elastic_rendezvous.h).
  std::unique_ptr<ddprun::agent::RendezvousHandler> rendezvous;
  ddprun::agent::ElasticRendezvous* elastic = nullptr;
  if (options.max_nodes > 1) {
    try {
      auto handler = std::make_unique<ddprun::agent::ElasticRendezvous>(options);
      elastic = handler.get();
      rendezvous = std::move(handler);
    } catch (const std::exception& e) {
      spdlog::error("rendezvous failed: {}", e.what());
      return 1;
    }
  }
  ddprun::agent::Agent agent(std::move(options), std::move(rendezvous), std::move(policy));
  agent.set_log_sink(log_sink);
  if (elastic) {
    elastic->attach(agent.io());
    agent.add_hooks(elastic);
  }
  ddprun::watchdog::WatchdogHook watchdog(agent.io(), hook_options);
  job_policy->attach(&watchdog);
  agent.add_hooks(&watchdog);
  // `ddprun status` / `ddprun stacks` and the straggler report (introspect/agent_hook.h).
  ddprun::introspect::IntrospectHook introspect(
      agent.io(), monitor_options, [&watchdog] { return watchdog.watchdog(); },
      [&watchdog] { return watchdog.events(); });
  agent.add_hooks(&introspect);
  // --metrics-port: the status snapshot as Prometheus text, served on the
  // agent's loop (observe/metrics_server.h). Asked for, so a port in use
  // ends the launch before any worker starts rather than leaving the
  // dashboards blank.
  std::unique_ptr<ddprun::observe::MetricsServer> metrics;
  if (serve_metrics) {
    try {
      metrics = std::make_unique<ddprun::observe::MetricsServer>(
          agent.io(), metrics_options, [&introspect] {
            return ddprun::observe::render_exposition(introspect.status(),
                                                      ddprun::observe::sample_this_process());
          });
    } catch (const std::exception& e) {
      spdlog::error("--metrics-port: {}", e.what());
      return 1;
    }
    spdlog::info("metrics at {}", metrics->url());
  }
  return agent.run();
}
