// The subcommands of `vcuda` that talk to the manager: gpus, servers, leases, sessions, cordon, uncordon,
// drain, release, suspend, resume, migrate, events, tokens create|list|revoke. Each asks the manager one
// question (mgmt/PROTOCOL.md) and prints a table, or the manager's JSON with --json. Each presents the
// caller's credential: --credential FILE, else $VCUDA_CREDENTIAL, else the file $VCUDA_CREDENTIAL_FILE; or,
// on a host that holds the manager's secret file, --secret-file FILE signs the request with the shared secret
// (how the first operator credential is made).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common/result.hpp"

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

    // The request's auth field (mgmt/PROTOCOL.md, "Authentication"); an error message when it cannot be had.
    result<std::string, std::string> auth(const std::string& method, const std::string& body) const;

    std::string manager_;
    std::string credential_file_, secret_file_;
    bool json_ = false;
    command gpus_, servers_, leases_, sessions_, cordon_, uncordon_, drain_, release_, suspend_, resume_,
        events_, migrate_;
    std::string migrate_to_;
    bool drain_wait_ = false;
    command tokens_create_, tokens_list_, tokens_revoke_;
    bool token_operator_ = false;
    std::string token_ttl_, token_output_;
};

}  // namespace vcuda::cli
