#include "mgmt/cli/run_command.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/transport.hpp"
#include "mgmt/wire/lease.hpp"
#include "mgmt/wire/units.hpp"

namespace vcuda::cli {

namespace {

constexpr const char* no_target_help =
    "vcuda run: no GPU to run on: neither --server nor --manager was given, and neither VCUDA_SERVER nor\n"
    "VCUDA_MANAGER is set.\n"
    "  To use one GPU host directly: start `vcuda-server --listen HOST:PORT` on it, then run\n"
    "      vcuda run --server HOST:PORT -- PROGRAM ARGS...\n"
    "  To let the manager choose a GPU: start `vcuda-mgmt --listen HOST:PORT --db PATH --secret-file PATH`,\n"
    "  start each vcuda-server with `--manager HOST:PORT`, then run\n"
    "      vcuda run --manager HOST:PORT --credential FILE -- PROGRAM ARGS...\n"
    "  (or export VCUDA_SERVER=HOST:PORT / VCUDA_MANAGER=HOST:PORT once).";

std::string nonempty(const char* v) { return v && *v ? std::string(v) : std::string(); }

}  // namespace

std::string default_lib_dir() {
    if (const char* env = std::getenv("VCUDA_LIB_DIR"); env && *env) return env;
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return "lib/vcuda";
    auto dir = (exe.parent_path() / ".." / "lib" / "vcuda").lexically_normal();
    return dir.string();
}

result<run_plan, run_error> plan_run(const run_options& opts,
                                     const std::function<const char*(const char*)>& getenv,
                                     const std::string& lib_dir, bool lib_dir_ok) {
    run_plan plan;
    std::vector<std::string> cmd = opts.command;
    if (!cmd.empty() && cmd.front() == "--") cmd.erase(cmd.begin());
    if (cmd.empty())
        return unexpected{run_error{2,
                                    "vcuda run: no program given.\n  usage: vcuda run [--server ADDR | "
                                    "--manager ADDR] -- PROGRAM ARGS..."}};
    if (!opts.server.empty() && !opts.manager.empty())
        return unexpected{
            run_error{2,
                      "vcuda run: give either --server (one GPU host, no manager) or --manager (the manager "
                      "chooses the GPUs), not both."}};

    std::string server = opts.server, manager = opts.manager;
    if (server.empty() && manager.empty()) {
        server = nonempty(getenv("VCUDA_SERVER"));
        manager = nonempty(getenv("VCUDA_MANAGER"));
        if (server.empty() && manager.empty()) return unexpected{run_error{2, no_target_help}};
    }
    for (auto [flag, value] : {std::pair{"server", &server}, std::pair{"manager", &manager}}) {
        if (value->empty()) continue;
        if (auto ep = endpoint::parse(*value); !ep)
            return unexpected{run_error{
                2, std::string("vcuda run: the ") + flag + " address '" + *value + "' is not valid: " +
                       ep.error() + "\n  write HOST:PORT (e.g. 10.0.0.5:7300) or unix:/path/to/socket"}};
    }
    if (!lib_dir_ok)
        return unexpected{
            run_error{2, "vcuda run: vcuda's driver library is missing: " + lib_dir +
                             "/libcuda.so.1 does not exist.\n  Build it (cmake --build build/dev) or "
                             "reinstall vcuda so that lib/vcuda/ sits beside bin/; VCUDA_LIB_DIR=DIR "
                             "points vcuda run at another folder."}};

    std::string ld = lib_dir;
    if (std::string old = nonempty(getenv("LD_LIBRARY_PATH")); !old.empty()) ld += ":" + old;
    plan.set_env.emplace_back("LD_LIBRARY_PATH", ld);
    // A flag wins over the environment; the other variable is removed so the client sees one clear choice.
    if (!opts.server.empty()) {
        plan.set_env.emplace_back("VCUDA_SERVER", server);
        plan.set_env.emplace_back("VCUDA_MANAGER", "");
    } else if (!opts.manager.empty()) {
        plan.set_env.emplace_back("VCUDA_MANAGER", manager);
        plan.set_env.emplace_back("VCUDA_SERVER", "");
    }
    if (opts.gpus) {
        if (*opts.gpus == 0) return unexpected{run_error{2, "vcuda run: --gpus must be at least 1"}};
        plan.set_env.emplace_back("VCUDA_GPUS", std::to_string(*opts.gpus));
    }
    if (!opts.memory.empty()) {
        auto bytes = mgmt::parse_size(opts.memory);
        if (!bytes)
            return unexpected{run_error{2, "vcuda run: --memory '" + opts.memory +
                                               "' is not a size; write e.g. 8G, 512M or a number of bytes"}};
        plan.set_env.emplace_back("VCUDA_MEMORY", std::to_string(*bytes));
    }
    if (opts.exclusive) plan.set_env.emplace_back("VCUDA_EXCLUSIVE", "1");
    if (!opts.token.empty()) {
        if (!opts.manager.empty())
            return unexpected{
                run_error{2,
                          "vcuda run: --token is for a server started with --secret-file; with --manager "
                          "the manager hands out the tokens"}};
        plan.set_env.emplace_back("VCUDA_TOKEN", opts.token);
    }
    if (!opts.credential_file.empty()) {
        if (!opts.server.empty() || manager.empty())
            return unexpected{
                run_error{2,
                          "vcuda run: --credential is for the manager (--manager); a server started with "
                          "--secret-file takes --token"}};
        if (auto c = mgmt::read_credential_file(opts.credential_file); !c)
            return unexpected{run_error{2, "vcuda run: --credential: " + c.error()}};
        std::error_code ec;
        auto path = std::filesystem::absolute(opts.credential_file, ec);
        // The program reads the file itself: the credential stays out of its environment and the process
        // list.
        plan.set_env.emplace_back("VCUDA_CREDENTIAL_FILE", ec ? opts.credential_file : path.string());
        plan.set_env.emplace_back("VCUDA_CREDENTIAL", "");
    }
    plan.argv = std::move(cmd);
    return plan;
}

int exec_plan(const run_plan& plan) {
    for (auto& [k, v] : plan.set_env) {
        if (v.empty())
            ::unsetenv(k.c_str());
        else
            ::setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> argv;
    for (auto& a : plan.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(stdout);
    ::execvp(argv[0], argv.data());
    int e = errno;
    std::fprintf(stderr, "vcuda run: cannot start '%s': %s\n", argv[0], std::strerror(e));
    if (e == ENOENT)
        std::fprintf(stderr, "  it is not in PATH; give its path (e.g. ./%s) or check the name\n", argv[0]);
    else if (e == EACCES)
        std::fprintf(stderr, "  it is not executable; check its permissions (chmod +x)\n");
    return 127;
}

}  // namespace vcuda::cli
