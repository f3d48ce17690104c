// `vcuda`: the command line users and operators meet. `vcuda run -- ./app` runs a program through vcuda;
// the other subcommands ask the manager (vcuda-mgmt) about GPUs, servers, leases and sessions and change
// them.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "mgmt/cli/operator_commands.hpp"
#include "mgmt/cli/run_command.hpp"
#include "mgmt/cli/token_command.hpp"

namespace {

const char* run_description = "Run a CUDA program on a remote GPU: vcuda run [OPTIONS] -- PROGRAM [ARGS...]";
const char* run_footer =
    "Runs PROGRAM with vcuda's driver library, so its CUDA calls go to a remote GPU.\n"
    "Give the GPU host with --server (or VCUDA_SERVER), or let the manager choose with --manager\n"
    "(or VCUDA_MANAGER). With a manager, the program presents your credential (from an operator's\n"
    "`vcuda tokens create`): --credential FILE, VCUDA_CREDENTIAL or VCUDA_CREDENTIAL_FILE.\n"
    "Servers and managers started with --tls-cert speak TLS over TCP: export VCUDA_TLS_CA=FILE (their CA;\n"
    "every TCP connection then uses TLS, never plain), and VCUDA_TLS_CERT/VCUDA_TLS_KEY where they require\n"
    "client certificates (--tls-client-ca).\n"
    "The program's exit code is vcuda run's exit code.\n"
    "Usage:   vcuda run [OPTIONS] -- PROGRAM [ARGS...]\n"
    "Example: vcuda run --server gpu1:7300 -- ./my_app --iterations 10\n"
    "         vcuda run --manager mgmt:7400 --credential ~/.vcuda/alice.cred --gpus 2 -- ./train.py";

}  // namespace

// An exception that escapes main ends the program, as it should.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
    CLI::App app{"vcuda: run CUDA programs on remote GPUs, and manage the GPUs of a vcuda cluster.", "vcuda"};
    app.require_subcommand(1);
    app.footer(
        "Run `vcuda COMMAND --help` for a command's options.\n"
        "The manager address comes from --manager or VCUDA_MANAGER; your credential from --credential FILE,\n"
        "VCUDA_CREDENTIAL or VCUDA_CREDENTIAL_FILE (an operator makes one with `vcuda tokens create`).\n"
        "A manager that serves TLS (--tls-cert) needs VCUDA_TLS_CA=FILE (and VCUDA_TLS_CERT/VCUDA_TLS_KEY "
        "for\n"
        "mutual TLS).");

    // ---- run
    vcuda::cli::run_options run_opts;
    unsigned gpus = 0;
    auto* run = app.add_subcommand("run", run_description);
    run->add_option("--server,-s", run_opts.server,
                    "vcuda-server address HOST:PORT or unix:/path (default: $VCUDA_SERVER)");
    run->add_option("--manager,-m", run_opts.manager,
                    "vcuda-mgmt address HOST:PORT or unix:/path (default: $VCUDA_MANAGER)");
    auto* gpus_opt = run->add_option("--gpus", gpus, "with a manager: how many GPUs to lease (default 1)");
    run->add_option("--memory", run_opts.memory,
                    "with a manager: memory per GPU, e.g. 8G (default: the whole GPU)");
    run->add_flag("--exclusive", run_opts.exclusive,
                  "with a manager: lease whole GPUs that nobody else shares");
    run->add_option(
        "--token", run_opts.token,
        "the token a server started with --secret-file requires (made by `vcuda token create`; default: "
        "$VCUDA_TOKEN, which keeps it out of the process list)");
    run->add_option("--credential", run_opts.credential_file,
                    "with a manager: file holding your credential from `vcuda tokens create` (default: "
                    "$VCUDA_CREDENTIAL, else the file $VCUDA_CREDENTIAL_FILE)");
    run->footer(run_footer);

    vcuda::cli::operator_commands ops(app);

    // ---- token create
    auto* token =
        app.add_subcommand("token", "Tokens for a vcuda-server started with --secret-file (no manager)");
    token->require_subcommand(1);
    auto* token_create = token->add_subcommand("create",
                                               "Print a new token signed with the server's secret; clients "
                                               "present it with VCUDA_TOKEN or `vcuda run --token`");
    std::string token_secret_file, token_ttl = "30d", token_memory;
    token_create->add_option("--secret-file", token_secret_file, "the server's --secret-file")->required();
    token_create->add_option(
        "--ttl", token_ttl,
        "how long the token opens sessions, e.g. 12h, 30d (default 30d); sessions it opened go on after");
    token_create->add_option("--memory", token_memory,
                             "GPU memory per GPU a session opened with it may hold, e.g. 8G (default: the "
                             "server's --memory-quota)");

    // Everything from PROGRAM on belongs to the program, its options included, so CLI11 only sees what comes
    // before it: the arguments after `--`, or from the first word that is not one of run's options.
    std::vector<std::string> program;
    int parse_argc = argc;
    if (argc >= 2 && std::string_view(argv[1]) == "run") {
        for (int i = 2; i < argc; ++i) {
            std::string_view a = argv[i];
            if (a == "--") {
                parse_argc = i;
                program.assign(argv + i + 1, argv + argc);
                break;
            }
            if (a.starts_with("-")) {
                bool takes_value = a == "--server" || a == "-s" || a == "--manager" || a == "-m" ||
                                   a == "--gpus" || a == "--memory" || a == "--token" || a == "--credential";
                if (takes_value) ++i;
                continue;
            }
            parse_argc = i;
            program.assign(argv + i, argv + argc);
            break;
        }
    }

    try {
        app.parse(parse_argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    if (run->parsed()) {
        if (gpus_opt->count() > 0) run_opts.gpus = gpus;
        run_opts.command = program;
        std::string lib_dir = vcuda::cli::default_lib_dir();
        bool lib_ok = ::access((lib_dir + "/libcuda.so.1").c_str(), R_OK) == 0;
        auto plan = vcuda::cli::plan_run(
            run_opts, [](const char* k) { return std::getenv(k); }, lib_dir, lib_ok);
        if (!plan) {
            std::fprintf(stderr, "%s\n", plan.error().message.c_str());
            return plan.error().exit_code;
        }
        return vcuda::cli::exec_plan(*plan);
    }
    if (token_create->parsed()) return vcuda::cli::create_token(token_secret_file, token_ttl, token_memory);
    return ops.execute();
}
