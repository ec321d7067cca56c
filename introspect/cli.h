// `ddprun status|stacks|attach|doctor ...`: the introspection subcommands.
// The launcher hands over when its first argument is one of these words (a
// program with such a name still runs as ./status or with --no-python).
#pragma once

#include <string>

namespace ddprun::introspect {

bool is_subcommand(const std::string& first_arg);

// argv[0] is the subcommand's name. Returns the process exit status:
// 0 success, 1 failure (a failed doctor check, no agent found, ...),
// 2 wrong flags.
int run_subcommand(int argc, char** argv);

}  // namespace ddprun::introspect
