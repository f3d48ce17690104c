// `vcuda run`: starts an unmodified program with vcuda's driver library in front of the real one.
// plan_run() decides, without side effects, what environment the program gets (so it is unit-tested);
// exec_plan() applies it and replaces this process with the program.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"

namespace vcuda::cli {

struct run_options {
    std::string server;            // --server ADDR: one vcuda-server, no manager
    std::string manager;           // --manager ADDR: ask vcuda-mgmt for a lease
    std::optional<unsigned> gpus;  // --gpus N        -> VCUDA_GPUS (lease request)
    std::string memory;            // --memory SIZE   -> VCUDA_MEMORY (per GPU, e.g. 8G; lease request)
    bool exclusive = false;        // --exclusive     -> VCUDA_EXCLUSIVE=1 (lease request)
    std::string token;             // --token TOKEN   -> VCUDA_TOKEN (a server started with --secret-file)
    std::string credential_file;   // --credential FILE -> VCUDA_CREDENTIAL_FILE (the manager's credential)
    std::vector<std::string> command;  // PROGRAM ARGS...
};

struct run_plan {
    std::vector<std::string> argv;                             // argv[0] is looked up in PATH
    std::vector<std::pair<std::string, std::string>> set_env;  // applied in order, overriding
};

struct run_error {
    int exit_code = 2;
    std::string message;  // says what to do next
};

// `getenv` reads the current environment; `lib_dir` is where libcuda.so.1 and libnvidia-ml.so.1 of vcuda live
// (<dir of the vcuda executable>/../lib/vcuda); `lib_dir_ok` says whether libcuda.so.1 was found there.
result<run_plan, run_error> plan_run(const run_options& opts,
                                     const std::function<const char*(const char*)>& getenv,
                                     const std::string& lib_dir, bool lib_dir_ok);

// <dir of /proc/self/exe>/../lib/vcuda, normalized; VCUDA_LIB_DIR overrides it.
std::string default_lib_dir();

// Applies the plan and execvp's; only returns on failure, with the exit code to use (127) after printing why.
int exec_plan(const run_plan& plan);

}  // namespace vcuda::cli
