// The operator subcommands of `vcuda`: gpus, servers, leases, sessions, cordon, uncordon, drain, release.
// Each asks the manager one question (mgmt/PROTOCOL.md) and prints a table, or the manager's JSON with
// --json.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace vcuda::cli {

class operator_commands {
  public:
    // Adds the subcommands to `app`.
    explicit operator_commands(CLI::App& app);
    // Runs the subcommand that was parsed; returns the process exit code.
    int execute();

  private:
    struct command {
        CLI::App* app = nullptr;
        std::string target;
    };
    command add(CLI::App& app, const std::string& name, const std::string& help,
                const char* target_help = nullptr);

    std::string manager_;
    bool json_ = false;
    command gpus_, servers_, leases_, sessions_, cordon_, uncordon_, drain_, release_;
};

}  // namespace vcuda::cli
