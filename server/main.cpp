// vcuda-server: serves one host's GPUs to vcuda clients (VMs, containers, GPU-less nodes).
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/crash_report.hpp"
#include "common/log.hpp"
#include "common/metrics_http.hpp"
#include "common/random.hpp"
#include "common/tls.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/server_agent.hpp"
#include "server/device_output.hpp"
#include "server/metrics.hpp"
#include "server/server.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>

#include <sys/resource.h>

namespace {

std::mutex stop_mu;
std::condition_variable stop_cv;
bool stop_requested = false;

void on_signal(int) {
    // Only async-signal-safe work here: the main thread polls the flag.
    stop_requested = true;
}

// "512MiB", "16GiB", "1G", "1048576" -> bytes; false on anything else.
bool parse_size(const std::string& text, uint64_t& out) {
    size_t pos = 0;
    double v;
    try {
        v = std::stod(text, &pos);
    } catch (...) {
        return false;
    }
    std::string unit = text.substr(pos);
    uint64_t mult = 1;
    if (unit.empty() || unit == "B")
        mult = 1;
    else if (unit == "K" || unit == "KiB" || unit == "k")
        mult = 1ull << 10;
    else if (unit == "M" || unit == "MiB")
        mult = 1ull << 20;
    else if (unit == "G" || unit == "GiB")
        mult = 1ull << 30;
    else if (unit == "T" || unit == "TiB")
        mult = 1ull << 40;
    else
        return false;
    if (v < 0) return false;
    out = static_cast<uint64_t>(v * static_cast<double>(mult));
    return true;
}

// Each connection holds a descriptor (two with shared-memory rings while they are set up): the soft limit is
// raised to the hard one, and a hard limit below what --max-connections needs is reported.
void raise_descriptor_limit(uint32_t max_connections) {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rlim_t(max_connections) + 64)
        VCUDA_LOG_WARN(
            "the descriptor limit ({}) is below what --max-connections {} needs (about {}): clients past it "
            "wait until descriptors free up. Raise it (`ulimit -n`, LimitNOFILE=) or lower --max-connections",
            rl.rlim_cur, max_connections, max_connections + 64);
}

// Runs posted jobs one after another on a thread of its own (suspends may take seconds).
class task_queue {
  public:
    task_queue()
        : thread_([this](const std::stop_token& st) {
              for (;;) {
                  std::function<void()> job;
                  {
                      std::unique_lock lock(mu_);
                      if (!cv_.wait(lock, st, [&] { return !jobs_.empty(); })) return;
                      job = std::move(jobs_.front());
                      jobs_.pop_front();
                  }
                  job();
              }
          }) {}
    void post(std::function<void()> job) {
        std::lock_guard lock(mu_);
        jobs_.push_back(std::move(job));
        cv_.notify_one();
    }

  private:
    std::mutex mu_;
    std::condition_variable_any cv_;
    std::deque<std::function<void()>> jobs_;
    std::jthread thread_;  // last: stopped and joined first
};

// Where a session moves when the manager asks: the target's address of the client's kind (a Unix socket for a
// client on one), else its first TCP one, since the client follows the session there. Nothing, with `why`,
// when the manager gave no usable address.
std::optional<vcuda::server::session::move_target> move_target_for(const std::vector<std::string>& endpoints,
                                                                   const std::string& token,
                                                                   bool local_client, std::string& why) {
    const auto kind = local_client ? vcuda::endpoint::kind::unix_socket : vcuda::endpoint::kind::tcp;
    why = "the manager gave no address of the target server";
    for (int pass = 0; pass < 2; ++pass)
        for (auto& text : endpoints) {
            auto ep = vcuda::endpoint::parse(text);
            if (!ep) {
                why = "the target's address " + text + ": " + ep.error();
                continue;
            }
            if (ep->type == (pass == 0 ? kind : vcuda::endpoint::kind::tcp))
                return vcuda::server::session::move_target{*ep, text, token};
        }
    return std::nullopt;
}

}  // namespace

// An exception that escapes main ends the program, as it should.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
    vcuda::install_crash_report("vcuda-server");
    CLI::App app{
        "vcuda-server: serves this host's GPUs to vcuda clients.\n"
        "Clients (libcuda.so.1 from vcuda, usually started with `vcuda run`) connect over TCP or a Unix "
        "socket;\n"
        "each client process gets a session with its own CUDA context, handle table and memory quota."};
    std::vector<std::string> listen;
    std::string driver_path = "libcuda.so.1";
    std::string quota_text;
    std::string level = "info";
    app.add_option("-l,--listen", listen,
                   "Address to serve, repeatable: HOST:PORT for TCP (e.g. 0.0.0.0:7300) or unix:/PATH for a "
                   "Unix socket. "
                   "Default: 127.0.0.1:7300");
    app.add_option("--driver", driver_path,
                   "The CUDA driver library to execute calls with (default: libcuda.so.1 from the system)");
    app.add_option("--memory-quota", quota_text,
                   "GPU memory each session may hold per GPU, e.g. 8GiB (default: the whole GPU). "
                   "Allocations past it "
                   "(cuMemAlloc*, VMM, pools, the malloc heap, module and library loads) fail with "
                   "CUDA_ERROR_OUT_OF_MEMORY; cuMemGetInfo and the device's total memory report it.");
    std::string host_quota_text;
    app.add_option(
        "--host-memory-quota", host_quota_text,
        "Pinned host memory each session on this host (Unix socket) may share with the server, e.g. 16GiB "
        "(default: half of this machine's memory). Past it, cuMemHostAlloc and "
        "cuMemHostRegister fail with CUDA_ERROR_OUT_OF_MEMORY.");
    bool no_shm_rings = false;
    app.add_flag("--no-shm-rings", no_shm_rings,
                 "Keep frames of local (Unix socket) clients on the socket instead of shared-memory rings");
    long spin_us = -1;
    app.add_option("--spin-us", spin_us,
                   "Microseconds a lane thread spins for the next frame (on shared-memory rings or its "
                   "socket) before it sleeps "
                   "(default 50 with 4 or more CPUs, else 0; env VCUDA_SPIN_US)");
    long bulk_streams = -1;
    app.add_option(
           "--bulk-streams", bulk_streams,
           "The most bulk connections a client session may open for striped copies over TCP (default 8); "
           "0: none (large copies then travel on their lane)")
        ->check(CLI::Range(0, 1024));
    app.add_option("--log-level", level,
                   "trace, debug, info, warn, error or off (default info; env VCUDA_LOG_LEVEL)");
    std::string manager, secret_file;
    std::vector<std::string> advertise;
    app.add_option(
        "--manager", manager,
        "Attach to the vcuda-mgmt at ADDR: register this server's GPUs, send heartbeats, and accept only "
        "sessions that present a valid lease token (needs --secret-file). A manager that serves TLS is "
        "reached in TLS when VCUDA_TLS_CA=FILE is set (its CA; VCUDA_TLS_CERT/VCUDA_TLS_KEY for mutual TLS)");
    app.add_option(
        "--secret-file", secret_file,
        "File holding the secret (mode 600; make one with `head -c 32 /dev/urandom | base64 > FILE`). With "
        "--manager: the manager's, for its lease tokens. Without: every new session needs a token signed "
        "with it, made by `vcuda token create --secret-file FILE` and given to clients (VCUDA_TOKEN or "
        "`vcuda run --token`)");
    bool insecure = false;
    app.add_flag(
        "--insecure", insecure,
        "Serve TCP addresses other than loopback without --secret-file: anyone who reaches the port can use "
        "the GPUs (refused at start without this flag); also lets --metrics-listen serve such an address");
    vcuda::tls_files tls_files;
    app.add_option(
           "--tls-cert", tls_files.cert,
           "PEM certificate (with its chain) this server presents over TCP: every TCP address then speaks "
           "TLS only (lanes, bulk connections), and clients need VCUDA_TLS_CA. Unix sockets stay plain "
           "(they never leave the host). Needs --tls-key; see README, Security, for making certificates")
        ->check(CLI::ExistingFile);
    app.add_option("--tls-key", tls_files.key, "PEM private key of --tls-cert (keep it mode 600)")
        ->check(CLI::ExistingFile);
    app.add_option("--tls-client-ca", tls_files.ca,
                   "Mutual TLS: admit only TCP clients that present a certificate signed by this CA (PEM; "
                   "clients give theirs with VCUDA_TLS_CERT and VCUDA_TLS_KEY). Needs --tls-cert")
        ->check(CLI::ExistingFile);
    std::string allow_uid_text;
    app.add_option(
        "--allow-uid", allow_uid_text,
        "Unix sockets: admit only peers with these user ids, e.g. 1000,1001 (checked with SO_PEERCRED; "
        "default: anyone the socket's mode, 0660, lets in)");
    long max_sessions = -1, max_connections = -1;
    app.add_option(
           "--max-sessions", max_sessions,
           "The most sessions (client processes) served at once (default 256); past it a new session is "
           "refused with a message")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option(
           "--max-connections", max_connections,
           "The most connections (a session has one per client thread, plus bulk connections) at once "
           "(default 1024); past it a connection is refused with a message")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--advertise", advertise,
                   "Address clients should use to reach this server, as told to the manager, repeatable "
                   "(default: the --listen addresses, with 0.0.0.0 replaced by this host's name)");
    std::string isolation = "thread";
    app.add_option("--isolation", isolation,
                   "thread (default): every session runs in this process, one thread per connection; the "
                   "fastest start, but a driver crash or a context poisoned by a device-side assert "
                   "(CUDA_ERROR_ASSERT, which then fails every later context creation in the process) takes "
                   "the GPU from every tenant until the server restarts. process: every session runs in a "
                   "worker process of its own (this binary, started for it); such a failure ends that "
                   "tenant's session only. Recommended for untrusted tenants. Its sessions are suspended and "
                   "resumed as others are, but do not move to another server yet, and such a server takes no "
                   "moved session; TLS is not supported with it yet")
        ->check(CLI::IsMember({"thread", "process"}));
    std::string metrics_listen;
    app.add_option(
        "--metrics-listen", metrics_listen,
        "Serve Prometheus metrics at http://ADDR:PORT/metrics (sessions, memory per session and GPU, calls, "
        "suspends and resumes; README, Metrics). Off by default. Plain HTTP without authentication, and the "
        "page names leases and clients: an address other than loopback needs --insecure");
    int suspend_every_ms = 0;
    app.add_option("--test-suspend-every", suspend_every_ms,
                   "For tests: every MS milliseconds, suspend every session that can be (its GPU state saved "
                   "and given back; its next call rebuilds it), so that programs run through suspend and "
                   "resume again and again")
        ->group("Testing")
        ->check(CLI::Range(1, 3600 * 1000));
    bool suspend_graphs = true;
    app.add_flag(
        "--suspend-graphs,!--no-suspend-graphs", suspend_graphs,
        "A suspend keeps the session's CUDA graphs and executable graphs, made again node by node, and "
        "a move carries them (the default); --no-suspend-graphs: a session holding any is not "
        "suspended or moved, and instantiations keep no copy of their graph (README, Suspend and "
        "resume)");
    std::string window_text = "auto";
    app.add_option(
           "--address-window", window_text,
           "N (0-" + std::to_string(vcuda::server::address_window::count - 1) +
               "): the part of a device address range every server reserves where this server maps its "
               "sessions' memory, so that sessions moved between servers with different windows keep "
               "their addresses (server/device_memory.hpp). auto (default): one chosen from the first "
               "--listen address, or, when a manager finds it taken, a free one it gives; none: the driver "
               "chooses every address (such sessions may fail to "
               "move)")
        ->capture_default_str();
    std::string move_memory = "share";
    app.add_option(
           "--move-memory", move_memory,
           "How a session's device memory goes to the server it moves to. share (default): to a "
           "server on this host (a Unix socket address) on the same GPU, the physical memory itself is "
           "handed over, so the pause does not grow with the memory; otherwise it is pre-copied. "
           "precopy: always pre-copied, i.e. copied while the application runs, then, paused, only the "
           "pieces (64 MiB) whose contents changed. copy: always copied while paused (stop-and-copy: to "
           "measure or test that path)")
        ->check(CLI::IsMember({"share", "precopy", "copy"}))
        ->capture_default_str();
    std::string move_copy_limit_text = "16GiB";
    app.add_option("--move-copy-limit", move_copy_limit_text,
                   "The most memory a move may copy while the session is paused: the program's own VMM "
                   "allocations (which are not pre-copied) unless they are handed over on the same GPU, and "
                   "device memory with --move-memory copy. A move that would copy more is refused with the "
                   "reason and the session stays (a long pause would outlast what its client waits for)")
        ->capture_default_str();
    std::vector<std::string> move_to_text;
    int move_after_ms = 500;
    app.add_option(
           "--test-move-to", move_to_text,
           "For tests: move every session, once, to the vcuda-server at ADDR (--test-move-after MS "
           "after it opened); its client follows it there. Repeatable: a session goes to the first "
           "address of its client's kind (a Unix socket for clients on one, else TCP), else the first")
        ->group("Testing");
    app.add_option("--test-move-after", move_after_ms, "For tests: see --test-move-to")
        ->group("Testing")
        ->capture_default_str()
        ->check(CLI::Range(0, 3600 * 1000));
    std::string move_when;
    app.add_option("--test-move-when", move_when,
                   "For tests: with --test-move-to, a session moves only once FILE exists (a test program "
                   "creates it when its memory is ready), and --test-move-after has passed")
        ->group("Testing");
    int precopy_hold_ms = 0;
    app.add_option("--test-precopy-hold", precopy_hold_ms,
                   "For tests: a pre-copied move waits MS between its pre-copy and its pause, so that a test "
                   "program can change memory in between")
        ->group("Testing")
        ->check(CLI::Range(0, 60 * 1000));
    std::string precopy_hold_until;
    app.add_option("--test-precopy-hold-until", precopy_hold_until,
                   "For tests: a pre-copied move, its pre-copy done, pauses only once FILE exists (60 s at "
                   "most), so that a test program can change memory in between whatever the machine's speed")
        ->group("Testing");
    std::string gpu_identity;
    app.add_option(
        "--gpu-identity", gpu_identity,
        "TAG: give this server's GPUs UUIDs of their own towards the manager (registration, heartbeats, the "
        "lease tokens it accepts), derived from the GPU's UUID, TAG and its index, so that several servers "
        "on "
        "one physical GPU (tests, the software driver) are distinct GPUs to the manager and sessions can "
        "move "
        "between them. NVML and programs still see the physical UUID");
    int test_utilization = -1;
    app.add_option("--test-report-utilization", test_utilization,
                   "For tests: report PCT as every GPU's utilization in heartbeats to the manager instead of "
                   "NVML's (simulated load for the manager's --rebalance)")
        ->group("Testing")
        ->check(CLI::Range(0, 100));
    int worker_fd = -1;
    app.add_option("--worker-fd", worker_fd,
                   "Internal (--isolation process): run as the worker of one session handed over on this "
                   "descriptor")
        ->group("");
    CLI11_PARSE(app, argc, argv);

    spdlog::level::level_enum lvl;
    if (!vcuda::log::parse_level(level, lvl)) {
        std::cerr << "vcuda-server: --log-level: unknown level '" << level
                  << "' (use trace, debug, info, warn, error, off)\n";
        return 2;
    }
    vcuda::log::init(worker_fd >= 0 ? "vcuda-worker" : "vcuda-server", level);
    vcuda::server::server_options opts;
    if (!quota_text.empty() && (!parse_size(quota_text, opts.memory_quota) || opts.memory_quota == 0)) {
        std::cerr << "vcuda-server: --memory-quota: '" << quota_text
                  << "' is not a size (examples: 512MiB, 8GiB)\n";
        return 2;
    }
    if (!parse_size(move_copy_limit_text, opts.move_copy_limit)) {
        std::cerr << "vcuda-server: --move-copy-limit: '" << move_copy_limit_text
                  << "' is not a size (examples: 512MiB, 16GiB)\n";
        return 2;
    }
    if (!host_quota_text.empty()) {
        if (!parse_size(host_quota_text, opts.host_memory_quota) || opts.host_memory_quota == 0) {
            std::cerr << "vcuda-server: --host-memory-quota: '" << host_quota_text
                      << "' is not a size (examples: 512MiB, 8GiB)\n";
            return 2;
        }
    } else {
        opts.host_memory_quota = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)) / 2;
    }
    opts.shm_rings = !no_shm_rings;
    if (spin_us >= 0) opts.spin = std::chrono::microseconds(spin_us);
    if (bulk_streams >= 0) opts.bulk_streams = static_cast<uint32_t>(bulk_streams);
    if (listen.empty()) listen.push_back("127.0.0.1:7300");
    if (!manager.empty() && secret_file.empty()) {
        std::cerr << "vcuda-server: --manager needs --secret-file (the secret the manager signs lease tokens "
                     "with)\n";
        return 2;
    }
    if (!secret_file.empty()) {
        auto secret = vcuda::mgmt::read_secret_file(secret_file);
        if (!secret) {
            std::cerr << "vcuda-server: --secret-file: " << secret.error() << "\n";
            return 2;
        }
        opts.secret = *secret;
        opts.managed = !manager.empty();
    }
    std::shared_ptr<const vcuda::tls_context> tls;
    if (!tls_files.cert.empty() || !tls_files.key.empty() || !tls_files.ca.empty()) {
        if (tls_files.cert.empty() || tls_files.key.empty()) {
            std::cerr << "vcuda-server: TLS needs both --tls-cert FILE and --tls-key FILE"
                      << (tls_files.ca.empty() ? "" : " (--tls-client-ca only adds client certificates)")
                      << "\n";
            return 2;
        }
        auto ctx = vcuda::tls_context::server(tls_files);
        if (!ctx) {
            std::cerr << "vcuda-server: TLS: " << ctx.error() << "\n";
            return 2;
        }
        tls = *ctx;
        if (isolation == "process") {
            // A worker gets the client's socket, and the TLS state of a connection cannot follow it there.
            std::cerr
                << "vcuda-server: --isolation process does not support TLS yet (a session's connections "
                   "are handed to its worker process, and their TLS state cannot go with them): use "
                   "--isolation thread, or a Unix socket\n";
            return 2;
        }
    }
    if (window_text != "none") {
        uint32_t index = 0;
        if (window_text == "auto") {
            index = static_cast<uint32_t>(std::hash<std::string>{}(listen.front()) %
                                          vcuda::server::address_window::count);
        } else {
            auto [end, ec] =
                std::from_chars(window_text.data(), window_text.data() + window_text.size(), index);
            if (ec != std::errc() || end != window_text.data() + window_text.size() ||
                index >= vcuda::server::address_window::count) {
                std::cerr << "vcuda-server: --address-window: '" << window_text << "' is not auto, none or 0-"
                          << vcuda::server::address_window::count - 1 << "\n";
                return 2;
            }
        }
        opts.window = std::make_shared<vcuda::server::address_window>(index);
        opts.host_addresses = std::make_shared<vcuda::server::host_window>(index);
        if (window_text == "auto" && worker_fd < 0)
            VCUDA_LOG_INFO(
                "address window {} (auto: from the first --listen address; under a manager, another "
                "if it is taken)",
                index);
    }
    opts.test_precopy_hold = std::chrono::milliseconds(precopy_hold_ms);
    opts.test_precopy_hold_until = precopy_hold_until;
    opts.suspend_graphs = suspend_graphs;
    opts.move_memory = move_memory == "copy"      ? vcuda::server::server_options::move_memory_mode::copy
                       : move_memory == "precopy" ? vcuda::server::server_options::move_memory_mode::precopy
                                                  : vcuda::server::server_options::move_memory_mode::share;
    // IPC between this server's sessions: one registry, and an id in every handle so that a handle of another
    // server is recognised as such (a worker gets the id with its session and asks this process).
    opts.ipc_exports = std::make_shared<vcuda::server::ipc_registry>();
    opts.ipc = vcuda::server::make_local_broker(vcuda::os_random_u64(), opts.ipc_exports);
    if (max_sessions > 0) opts.max_sessions = static_cast<uint32_t>(max_sessions);
    if (max_connections > 0) opts.max_connections = static_cast<uint32_t>(max_connections);
    if (!allow_uid_text.empty()) {
        for (size_t pos = 0; pos <= allow_uid_text.size();) {
            size_t comma = std::min(allow_uid_text.find(',', pos), allow_uid_text.size());
            std::string item = allow_uid_text.substr(pos, comma - pos);
            uint32_t uid = 0;
            auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), uid);
            if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
                std::cerr << "vcuda-server: --allow-uid: '" << item
                          << "' is not a user id (write numbers: --allow-uid 1000,1001)\n";
                return 2;
            }
            opts.allowed_uids.push_back(uid);
            pos = comma + 1;
        }
    }
    std::optional<vcuda::endpoint> metrics_at;
    if (!metrics_listen.empty()) {
        auto mep = vcuda::metrics::parse_listen_address(metrics_listen, insecure);
        if (!mep) {
            std::cerr << "vcuda-server: --metrics-listen " << metrics_listen << ": " << mep.error() << "\n";
            return 2;
        }
        metrics_at = *mep;
    }
    if (worker_fd >= 0) {  // --isolation process: one session's worker (server/isolation.cpp)
        vcuda::server::device_output::install();
        vcuda::server::driver drv;
        std::string why;
        if (!drv.load(driver_path, why)) {
            VCUDA_LOG_ERROR("worker pid {}: {}", getpid(), why);
            return vcuda::server::server::refuse_worker(worker_fd, why);
        }
        opts.test_suspend_every = std::chrono::milliseconds(suspend_every_ms);
        return vcuda::server::server::run_worker(drv, opts, worker_fd);
    }
    if (isolation == "process") {
        // What a worker needs to serve a session as this process would (authentication, limits and leases
        // stay here); the session itself (id, key, grant) goes over its socket.
        opts.isolate = true;
        opts.worker_args = {
            "--driver", driver_path, "--log-level", level, "--host-memory-quota",
            std::to_string(opts.host_memory_quota), "--spin-us", std::to_string(opts.spin.count()),
            "--bulk-streams", std::to_string(opts.bulk_streams),
            // Workers move their sessions (server/isolation.cpp): as this server would.
            "--move-memory", move_memory, "--move-copy-limit", std::to_string(opts.move_copy_limit),
            "--test-precopy-hold", std::to_string(precopy_hold_ms)};
        if (!precopy_hold_until.empty()) {
            opts.worker_args.push_back("--test-precopy-hold-until");
            opts.worker_args.push_back(precopy_hold_until);
        }
        if (opts.memory_quota) {
            opts.worker_args.push_back("--memory-quota");
            opts.worker_args.push_back(std::to_string(opts.memory_quota));
        }
        if (!opts.shm_rings) opts.worker_args.push_back("--no-shm-rings");
        if (!suspend_graphs) opts.worker_args.push_back("--no-suspend-graphs");
        if (suspend_every_ms > 0) {  // the worker suspends its session itself
            opts.worker_args.push_back("--test-suspend-every");
            opts.worker_args.push_back(std::to_string(suspend_every_ms));
        }
    }
    raise_descriptor_limit(opts.max_connections);

    vcuda::server::device_output::install();  // before the driver: kernels' printf goes to each lane's client
    vcuda::server::driver drv;
    std::string why;
    if (!drv.load(driver_path, why)) {
        VCUDA_LOG_ERROR("{}", why);
        return 1;
    }
    if (drv.gpus().empty()) {
        VCUDA_LOG_ERROR("the driver {} reports no GPU: nothing to serve", drv.path());
        return 1;
    }
    if (opts.isolate) VCUDA_LOG_INFO("--isolation process: each session runs in a worker process of its own");
    if (!gpu_identity.empty()) {
        for (size_t i = 0; i < drv.gpus().size(); ++i) {
            opts.gpu_identities.push_back(
                vcuda::server::gpu_identity_string(drv.gpus()[i].uuid, gpu_identity, i));
            VCUDA_LOG_INFO("--gpu-identity {}: GPU {} ({}) is {} to the manager", gpu_identity, i,
                           vcuda::server::gpu_uuid_string(drv.gpus()[i].uuid), opts.gpu_identities.back());
        }
    }
    if (test_utilization >= 0)
        VCUDA_LOG_WARN(
            "--test-report-utilization {}: heartbeats report that utilization for every GPU (tests)",
            test_utilization);
    vcuda::server::server srv(drv, opts);
    // Bound now (a bad address fails the start), served last: clients are taken only once every thread of
    // the server has started, and the "serving" line says so.
    struct bound_listener {
        vcuda::listener l;
        const char* what;
    };
    std::vector<bound_listener> bound;
    for (auto& a : listen) {
        auto ep = vcuda::endpoint::parse(a);
        if (!ep) {
            VCUDA_LOG_ERROR("--listen {}: {}", a, ep.error());
            return 2;
        }
        // Who can connect: anyone who reaches a TCP port. Without a secret only this host may (loopback),
        // unless the operator says otherwise; a Unix socket is guarded by its mode (0660) and --allow-uid.
        // Mutual TLS authenticates too: only holders of a certificate signed by --tls-client-ca get through.
        const bool mutual_tls = tls && tls->requires_client_certificate();
        if (ep->type == vcuda::endpoint::kind::tcp && opts.secret.empty() && !mutual_tls &&
            !vcuda::is_loopback(ep->host)) {
            if (!insecure) {
                VCUDA_LOG_ERROR(
                    "--listen {}: refusing to serve a network address without authentication: anyone who "
                    "reaches it could use the GPUs. Give --secret-file FILE (clients then need a token from "
                    "`vcuda token create --secret-file FILE`) or --tls-client-ca FILE (mutual TLS), or "
                    "listen "
                    "on 127.0.0.1 or a Unix socket, or add --insecure on a network you trust",
                    a);
                return 2;
            }
            VCUDA_LOG_WARN(
                "--listen {} with --insecure: no authentication; anyone who reaches this address can use the "
                "GPUs{}",
                a, tls ? "" : ", and nothing is encrypted (--tls-cert)");
        }
        auto l = vcuda::listener::listen(*ep);
        if (!l) {
            VCUDA_LOG_ERROR("cannot listen on {}: {}", a, l.error().message);
            return 1;
        }
        const bool tcp = ep->type == vcuda::endpoint::kind::tcp;
        if (tcp && tls) l->set_tls(tls);
        bound.push_back({std::move(*l), !tcp         ? " (Unix socket: local, not encrypted)"
                                        : !tls       ? " (TCP without TLS: not encrypted)"
                                        : mutual_tls ? " (TLS; client certificates required)"
                                                     : " (TLS)"});
    }
    std::unique_ptr<vcuda::metrics::http_listener> metrics_server;  // declared after `srv`: stops before it
    if (metrics_at) {
        auto m = vcuda::metrics::http_listener::start(
            *metrics_at, [&srv, &drv] { return vcuda::server::collect_metrics(srv, drv); });
        if (!m) {
            VCUDA_LOG_ERROR("--metrics-listen {}: {}", metrics_listen, m.error());
            return 1;
        }
        metrics_server = std::move(*m);
        VCUDA_LOG_INFO("metrics at http://{}/metrics", metrics_server->local().to_string());
    }
    task_queue mobility;  // suspends, resumes and moves the manager asks for, off the heartbeat thread
    // Moves the manager asked for that were tried, kept until the manager has their outcome: a session that
    // moved ends here soon after (its client follows it), so its own report would not carry the outcome.
    struct move_book {
        std::mutex mu;
        std::vector<std::pair<vcuda::mgmt::session_report, std::chrono::steady_clock::time_point>> entries;
        void add(vcuda::mgmt::session_report r) {
            std::lock_guard lock(mu);
            entries.emplace_back(std::move(r), std::chrono::steady_clock::now());
        }
    } moves;
    // --isolation process: the manager's suspend and resume requests each worker's session has been asked
    // for (a session here keeps its own), by session id.
    struct worker_seq_book {
        struct seen_seqs {
            uint64_t suspend = 0, resume = 0, move = 0;
        };
        std::mutex mu;
        std::map<uint64_t, seen_seqs> by_session;
        // mu held. What session `id` has seen of lease `l`'s requests. At the first look, requests asked for
        // before it opened are not for it: only the last one, when asked for since, is acted on.
        seen_seqs& look(uint64_t id, int64_t opened_at_ms, const vcuda::mgmt::active_lease& l) {
            auto [it, first] = by_session.try_emplace(id);
            if (first) {
                auto before = [&](uint64_t seq, int64_t asked_at) {
                    return seq - std::min<uint64_t>(seq, asked_at >= opened_at_ms ? 1u : 0u);
                };
                it->second = {before(l.suspend_seq, l.suspend_asked_at),
                              before(l.resume_seq, l.resume_asked_at), before(l.move_seq, l.move_asked_at)};
            }
            return it->second;
        }
        std::optional<seen_seqs> seen(uint64_t id) {
            std::lock_guard lock(mu);
            auto it = by_session.find(id);
            if (it == by_session.end()) return std::nullopt;
            return it->second;
        }
    } worker_seqs;
    std::unique_ptr<vcuda::mgmt::server_agent> agent;
    if (!manager.empty()) {
        auto mep = vcuda::endpoint::parse(manager);
        if (!mep) {
            VCUDA_LOG_ERROR("--manager {}: {}", manager, mep.error());
            return 2;
        }
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        vcuda::mgmt::server_agent_config cfg;
        cfg.manager = *mep;
        cfg.registration.host = host;
        if (advertise.empty())
            for (auto& a : listen) {
                if (a.rfind("unix:", 0) == 0) continue;
                std::string x = a;
                if (x.rfind("0.0.0.0:", 0) == 0) x = std::string(host) + x.substr(7);
                advertise.push_back(x);
            }
        cfg.registration.endpoints = advertise;
        // The manager registers one server per window (two in one hand out the same device addresses).
        static_assert(vcuda::server::address_window::count == vcuda::mgmt::address_window_count);
        // A window this server chose itself gives way to one the manager names, while nothing uses it.
        if (opts.window) cfg.registration.address_window = static_cast<int32_t>(opts.window->index());
        if (opts.window && window_text == "auto") {
            cfg.registration.address_window_auto = true;
            cfg.take_window = [&opts](int32_t w) {
                const uint32_t before = opts.window->index();
                if (w < 0 ||
                    (opts.host_addresses && !opts.host_addresses->reassign(static_cast<uint32_t>(w))))
                    return false;
                if (opts.window->reassign(static_cast<uint32_t>(w))) return true;
                if (opts.host_addresses) opts.host_addresses->reassign(before);
                return false;
            };
        }
        // Registrations and heartbeats are signed with the shared secret: the manager refuses others.
        cfg.sign = [secret = opts.secret](std::string_view method, std::string_view body) {
            return vcuda::mgmt::sign_request(secret, method, body);
        };
        char version[32];
        std::snprintf(version, sizeof version, "%d.%d", drv.version() / 1000, drv.version() % 1000 / 10);
        for (size_t i = 0; i < drv.gpus().size(); ++i) {
            auto& g = drv.gpus()[i];
            cfg.registration.gpus.push_back(
                {static_cast<uint32_t>(i), srv.gpu_id(i), g.name, g.total_memory,
                 static_cast<uint32_t>(g.attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]), version});
        }
        cfg.load = [&srv, &drv, &opts, &moves, &worker_seqs, test_utilization] {
            vcuda::mgmt::heartbeat hb;
            std::vector<uint64_t> used(drv.gpus().size(), 0);
            std::vector<uint32_t> count(drv.gpus().size(), 0);
            std::lock_guard book(moves.mu);
            std::vector<bool> reported(moves.entries.size(), false);
            // A move the manager asked for and that was tried: its outcome (never one under way).
            auto take_move_outcome = [&](vcuda::mgmt::session_report& r) {
                for (size_t k = 0; k < moves.entries.size(); ++k) {
                    auto& e = moves.entries[k].first;
                    if (e.session_id != r.session_id || e.gpu_uuid != r.gpu_uuid) continue;
                    reported[k] = true;
                    r.move_seq = e.move_seq;
                    r.note = e.note;
                    r.moved_to = e.moved_to;
                }
            };
            srv.sessions().for_each([&](vcuda::server::session& s) {
                std::lock_guard lock(s.mu);
                for (size_t i = 0; i < s.device_count(); ++i) {
                    if (!s.allowed(i)) continue;
                    const size_t gpu = s.gpu_of(i);
                    vcuda::mgmt::session_report r{std::to_string(s.id()), s.lease_id(), srv.gpu_id(gpu),
                                                  s.peer(), s.memory(i).resident()};
                    if (s.moved()) {
                        r.moved_to = s.moved_to();  // it lives elsewhere now; the manager lists it there
                    } else {
                        used[gpu] += r.memory_used;
                        ++count[gpu];
                    }
                    r.suspended = s.suspended();
                    r.idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - s.last_call())
                                    .count();
                    r.suspend_seq = s.suspend_seq_seen.load();
                    r.resume_seq = s.resume_seq_seen.load();
                    r.note = s.note();
                    take_move_outcome(r);
                    hb.sessions.push_back(std::move(r));
                }
            });
            // --isolation process: sessions live in worker processes; each is counted in its GPU's load with
            // the memory its grant allows (its quota, else the GPU's), not what it holds at the moment; its
            // state is what its worker said last.
            for (auto& w : srv.worker_sessions())
                for (size_t i = 0; i < drv.gpus().size(); ++i) {
                    if (!w.grant.gpus.empty() &&
                        std::find(w.grant.gpus.begin(), w.grant.gpus.end(), i) == w.grant.gpus.end())
                        continue;
                    uint64_t q = w.grant.memory_quota ? w.grant.memory_quota : opts.memory_quota;
                    q = q ? std::min<uint64_t>(q, drv.gpus()[i].total_memory) : drv.gpus()[i].total_memory;
                    vcuda::mgmt::session_report r{std::to_string(w.id), w.grant.lease_id, srv.gpu_id(i),
                                                  w.peer, q};
                    r.suspended = w.status.suspended;
                    r.idle_ms = w.status.known ? w.status.idle_ms : 0;
                    r.note = w.status.note;
                    r.moved_to = w.status.moved_to;
                    if (auto seen = worker_seqs.seen(w.id)) {
                        r.suspend_seq = seen->suspend;
                        r.resume_seq = seen->resume;
                    }
                    take_move_outcome(r);
                    if (r.moved_to.empty()) {  // one that moved lives elsewhere now
                        used[i] += q;
                        ++count[i];
                    }
                    hb.sessions.push_back(std::move(r));
                }
            for (size_t k = 0; k < moves.entries.size(); ++k)  // sessions that moved and ended here since
                if (!reported[k]) hb.sessions.push_back(moves.entries[k].first);
            for (size_t i = 0; i < drv.gpus().size(); ++i) {
                auto& uuid = drv.gpus()[i].uuid;
                uint32_t utilization = test_utilization >= 0
                                           ? static_cast<uint32_t>(test_utilization)
                                           : vcuda::server::gpu_utilization(uuid).value_or(0);
                hb.gpus.push_back({srv.gpu_id(i), utilization, used[i], count[i]});
            }
            return hb;
        };
        // A session whose lease the manager no longer has (released by an operator, or expired) is ended.
        cfg.on_leases = [&srv, &drv, &mobility, &moves,
                         &worker_seqs](const std::vector<vcuda::mgmt::active_lease>& alive) {
            std::vector<std::pair<std::string, std::chrono::system_clock::time_point>> live;
            live.reserve(alive.size());
            for (auto& l : alive)
                live.emplace_back(l.lease_id, std::chrono::system_clock::time_point(
                                                  std::chrono::milliseconds(l.expires_at)));
            srv.note_live_leases(live);  // their tokens open no session once they are gone
            // The moves asked of this server's GPUs (lease, GPU), to find those no live session takes up.
            std::set<std::pair<std::string, std::string>> move_asked;
            for (auto& l : alive)
                if (!l.move_to_uuid.empty()) move_asked.emplace(l.lease_id, l.uuid);
            for (auto& sp : srv.sessions().snapshot()) {
                auto& s = *sp;
                if (s.lease_id().empty()) continue;
                std::string uuid;  // the session's GPU (a lease token opens one session per GPU)
                for (size_t i = 0; i < s.device_count() && uuid.empty(); ++i)
                    if (s.allowed(i)) uuid = srv.gpu_id(s.gpu_of(i));
                // A session that moved lives on at another server: its connections here end as its client
                // follows it (the manager no longer lists its lease here once it knows).
                if (s.moved()) {
                    move_asked.erase({s.lease_id(), uuid});
                    continue;
                }
                auto l = std::find_if(alive.begin(), alive.end(),
                                      [&](auto& a) { return a.lease_id == s.lease_id() && a.uuid == uuid; });
                if (l == alive.end())
                    l = std::find_if(alive.begin(), alive.end(),
                                     [&](auto& a) { return a.lease_id == s.lease_id(); });
                if (l == alive.end()) {
                    s.end("its lease " + s.lease_id() + " was released or expired");
                    continue;
                }
                // The manager's suspend and resume requests, each acted on once (mgmt/wire/types.hpp). At the
                // first reply a session sees, requests from before it was opened are not for it; the last
                // one, when asked for since, is.
                if (!s.seqs_known.exchange(true)) {
                    auto since = [&](int64_t asked_at) { return asked_at >= s.opened_at_ms() ? 1u : 0u; };
                    s.suspend_seq_seen =
                        l->suspend_seq - std::min<uint64_t>(l->suspend_seq, since(l->suspend_asked_at));
                    s.resume_seq_seen =
                        l->resume_seq - std::min<uint64_t>(l->resume_seq, since(l->resume_asked_at));
                    s.move_seq_seen = l->move_seq - std::min<uint64_t>(l->move_seq, since(l->move_asked_at));
                }
                // Relocated to (or being relocated to) the move's target GPU of this server: the relocation
                // reports the outcome; not "no session on this GPU", which raced it (manager_moves (f)).
                if (!l->move_to_uuid.empty() && l->uuid != uuid && l->move_to_uuid == uuid)
                    move_asked.erase({l->lease_id, l->uuid});
                if (!l->move_to_uuid.empty() && l->uuid == uuid) {
                    move_asked.erase({l->lease_id, l->uuid});  // this session takes it up (or took it up)
                    if (l->move_seq > s.move_seq_seen.load()) {
                        s.move_seq_seen = l->move_seq;
                        std::string why;
                        auto to = move_target_for(l->move_to_endpoints, l->move_token, s.local_client, why);
                        vcuda::mgmt::session_report r{std::to_string(s.id()), s.lease_id(), uuid, s.peer()};
                        r.move_seq = l->move_seq;
                        // Another GPU of this server: the session stays here, its device goes there.
                        if (auto own = srv.gpu_index(l->move_to_uuid); own && to) {
                            auto from = srv.gpu_index(uuid);
                            auto device = from ? s.device_on(*from) : std::nullopt;
                            const size_t index =
                                device.value_or(s.device_count());  // none: refused, why said
                            VCUDA_LOG_INFO("session {}: the manager asks for a move to GPU {} of this server",
                                           s.id(), l->move_to_uuid);
                            mobility.post([&srv, sp, index, gpu = *own, address = to->address,
                                           r = std::move(r), &moves]() mutable {
                                std::string why;
                                if (srv.relocate(sp, index, gpu, why) == CUDA_SUCCESS) {
                                    r.note = sp->note();
                                    r.moved_to = address;
                                } else {
                                    r.note = "not moved: " + why;
                                }
                                moves.add(std::move(r));
                            });
                        } else if (!to) {
                            r.note = "not moved: " + why;
                            VCUDA_LOG_WARN("session {}: the manager asked for a move to {}; {}", s.id(),
                                           l->move_to_uuid, r.note);
                            moves.add(std::move(r));
                        } else {
                            VCUDA_LOG_INFO("session {}: the manager asks for a move to GPU {} at {}", s.id(),
                                           l->move_to_uuid, to->address);
                            mobility.post([sp, to = *to, r = std::move(r), &moves]() mutable {
                                std::string why;
                                if (sp->move_to(to, std::chrono::seconds(5), why) == CUDA_SUCCESS) {
                                    r.note = sp->note();
                                    r.moved_to = to.address;
                                } else {
                                    r.note = "not moved: " + why;
                                }
                                moves.add(std::move(r));
                            });
                        }
                    }
                }
                if (l->suspend_seq > s.suspend_seq_seen.load()) {
                    s.suspend_seq_seen = l->suspend_seq;
                    mobility.post([sp] {
                        std::string why;
                        if (sp->suspend(std::chrono::seconds(5), why) != CUDA_SUCCESS)
                            VCUDA_LOG_WARN("session {}: the manager asked for a suspend; not done: {}",
                                           sp->id(), why);
                    });
                }
                if (l->resume_seq > s.resume_seq_seen.load()) {
                    s.resume_seq_seen = l->resume_seq;
                    mobility.post([sp] {
                        std::string why;
                        if (sp->resume(why) != CUDA_SUCCESS)
                            VCUDA_LOG_WARN("session {}: the manager asked for a resume; not done: {}",
                                           sp->id(), why);
                    });
                }
            }
            // --isolation process: a worker's session moves as one here does; its worker does the move.
            for (auto& w : srv.worker_sessions()) {
                if (w.grant.lease_id.empty()) continue;
                std::string uuid;
                for (size_t i = 0; i < drv.gpus().size() && uuid.empty(); ++i)
                    if (w.grant.gpus.empty() ||
                        std::find(w.grant.gpus.begin(), w.grant.gpus.end(), i) != w.grant.gpus.end())
                        uuid = srv.gpu_id(i);
                if (!w.status.moved_to.empty()) {  // it took up its move already
                    move_asked.erase({w.grant.lease_id, uuid});
                    continue;
                }
                for (auto& a : alive)  // relocated to its move's target GPU here: as for sessions above
                    if (a.lease_id == w.grant.lease_id && a.uuid != uuid && a.move_to_uuid == uuid)
                        move_asked.erase({a.lease_id, a.uuid});
                auto l = std::find_if(alive.begin(), alive.end(), [&](auto& a) {
                    return a.lease_id == w.grant.lease_id && a.uuid == uuid && !a.move_to_uuid.empty();
                });
                if (l == alive.end()) continue;
                move_asked.erase({l->lease_id, l->uuid});
                std::lock_guard lock(worker_seqs.mu);
                auto& seen = worker_seqs.look(w.id, w.opened_at_ms, *l);
                if (l->move_seq <= seen.move) continue;
                seen.move = l->move_seq;
                std::string why;
                auto to = move_target_for(l->move_to_endpoints, l->move_token, w.local_client, why);
                vcuda::mgmt::session_report r{std::to_string(w.id), w.grant.lease_id, uuid, w.peer};
                r.move_seq = l->move_seq;
                // Another GPU of this server: the worker moves the session's device there.
                if (auto own = srv.gpu_index(l->move_to_uuid), from = srv.gpu_index(uuid);
                    own && from && to) {
                    VCUDA_LOG_INFO(
                        "session {}: the manager asks for a move to GPU {} of this server (its worker "
                        "moves it)",
                        w.id, l->move_to_uuid);
                    mobility.post([&srv, id = w.id, from = *from, gpu = *own, address = to->address,
                                   r = std::move(r), &moves]() mutable {
                        std::string note;
                        if (srv.relocate_worker_session(id, from, gpu, std::chrono::minutes(15), note) ==
                            CUDA_SUCCESS) {
                            r.note = note;
                            r.moved_to = address;
                        } else {
                            r.note = "not moved: " + note;
                        }
                        moves.add(std::move(r));
                    });
                    continue;
                }
                if (!to) {
                    r.note = "not moved: " + why;
                    VCUDA_LOG_WARN("session {}: the manager asked for a move to {}; {}", w.id,
                                   l->move_to_uuid, r.note);
                    moves.add(std::move(r));
                    continue;
                }
                VCUDA_LOG_INFO(
                    "session {}: the manager asks for a move to GPU {} at {} (its worker moves it)", w.id,
                    l->move_to_uuid, to->address);
                mobility.post([&srv, id = w.id, to = *to, r = std::move(r), &moves]() mutable {
                    std::string note;
                    if (srv.move_worker_session(id, to, std::chrono::minutes(15), note) == CUDA_SUCCESS) {
                        r.note = note;
                        r.moved_to = to.address;
                    } else {
                        r.note = "not moved: " + note;
                    }
                    moves.add(std::move(r));
                });
            }
            {
                // Moves no live session here takes up: say why, once (while the book keeps the answer).
                std::lock_guard lock(moves.mu);
                for (auto& e : moves.entries) move_asked.erase({e.first.lease_id, e.first.gpu_uuid});
            }
            for (const auto& asked : move_asked) {
                const std::string& lease_id = asked.first;
                const std::string& uuid = asked.second;
                auto l = std::find_if(alive.begin(), alive.end(),
                                      [&](auto& a) { return a.lease_id == lease_id && a.uuid == uuid; });
                vcuda::mgmt::session_report r{"", lease_id, uuid};
                r.move_seq = l->move_seq;
                r.note = "not moved: lease " + lease_id +
                         " has no session on this GPU here (it has not opened one, or it has ended)";
                moves.add(std::move(r));
            }
            {
                // Outcomes the manager has settled (it asks for that move no more) are forgotten.
                std::lock_guard lock(moves.mu);
                auto old = std::chrono::steady_clock::now() - std::chrono::minutes(15);
                std::erase_if(moves.entries, [&](auto& e) {
                    bool asked = std::any_of(alive.begin(), alive.end(), [&](auto& a) {
                        return a.lease_id == e.first.lease_id && a.uuid == e.first.gpu_uuid &&
                               a.move_seq == e.first.move_seq && !a.move_to_uuid.empty();
                    });
                    return !asked || e.second < old;
                });
            }
            std::set<uint64_t> workers_now;
            for (auto& w : srv.worker_sessions()) {
                workers_now.insert(w.id);
                // One that moved lives on elsewhere; its worker ends as its client follows it.
                if (w.grant.lease_id.empty() || !w.status.moved_to.empty()) continue;
                auto l = std::find_if(alive.begin(), alive.end(),
                                      [&](auto& a) { return a.lease_id == w.grant.lease_id; });
                if (l == alive.end()) {
                    srv.end_worker_session(w.id,
                                           "its lease " + w.grant.lease_id + " was released or expired");
                    continue;
                }
                // The manager's suspend and resume requests, each passed to the worker once; at the first
                // reply the session sees, as for a session here, only the last one asked for since it opened.
                std::lock_guard lock(worker_seqs.mu);
                auto& seen = worker_seqs.look(w.id, w.opened_at_ms, *l);
                if (l->suspend_seq > seen.suspend) {
                    seen.suspend = l->suspend_seq;
                    if (!srv.ask_worker(w.id, true))
                        VCUDA_LOG_WARN("session {}: the manager asked for a suspend; its worker is gone",
                                       w.id);
                }
                if (l->resume_seq > seen.resume) {
                    seen.resume = l->resume_seq;
                    if (!srv.ask_worker(w.id, false))
                        VCUDA_LOG_WARN("session {}: the manager asked for a resume; its worker is gone",
                                       w.id);
                }
            }
            {
                std::lock_guard lock(worker_seqs.mu);
                std::erase_if(worker_seqs.by_session, [&](auto& e) { return !workers_now.count(e.first); });
            }
        };
        agent = std::make_unique<vcuda::mgmt::server_agent>(std::move(cfg));
        VCUDA_LOG_INFO("attached to the manager at {}; sessions need a lease token", manager);
    }
    std::jthread suspender;
    if (suspend_every_ms > 0) {
        VCUDA_LOG_WARN(
            "--test-suspend-every {} ms: sessions are suspended and resumed again and again (tests)",
            suspend_every_ms);
        suspender = std::jthread(
            [&srv, every = std::chrono::milliseconds(suspend_every_ms)](const std::stop_token& st) {
                std::mutex mu;
                std::condition_variable_any cv;
                while (!st.stop_requested()) {
                    {
                        std::unique_lock lock(mu);
                        cv.wait_for(lock, st, every, [] { return false; });
                    }
                    for (auto& s : srv.sessions().snapshot()) {
                        std::string why;
                        CUresult rc = s->suspend(std::chrono::milliseconds(0),
                                                 why);  // only sessions with no call running
                        if (rc != CUDA_SUCCESS) VCUDA_LOG_DEBUG("session {} not suspended: {}", s->id(), why);
                    }
                }
            });
    }
    std::jthread mover;
    if (!move_to_text.empty()) {
        std::vector<vcuda::server::session::move_target> targets;
        for (auto& text : move_to_text) {
            auto ep = vcuda::endpoint::parse(text);
            if (!ep) {
                std::cerr << "vcuda-server: --test-move-to: " << ep.error() << "\n";
                return 2;
            }
            targets.push_back({*ep, text, ""});
        }
        VCUDA_LOG_WARN("--test-move-to {}: every session moves there {} ms after it opened (tests)",
                       move_to_text.front(), move_after_ms);
        mover = std::jthread([&srv, &opts, targets, after = std::chrono::milliseconds(move_after_ms),
                              move_when](const std::stop_token& st) mutable {
            std::set<uint64_t> tried;
            // Each session once, `after` its opening (and once the --test-move-when file exists).
            auto due = [&](uint64_t id, int64_t opened_at_ms) {
                std::error_code ec;
                if (tried.count(id) || (!move_when.empty() && !std::filesystem::exists(move_when, ec)) ||
                    std::chrono::system_clock::now() -
                            std::chrono::system_clock::time_point(std::chrono::milliseconds(opened_at_ms)) <
                        after)
                    return false;
                tried.insert(id);
                return true;
            };
            auto target_for = [&](bool local_client) {
                const auto kind =
                    local_client ? vcuda::endpoint::kind::unix_socket : vcuda::endpoint::kind::tcp;
                auto to = targets.front();
                for (auto& t : targets)
                    if (t.where.type == kind) {
                        to = t;
                        break;
                    }
                // A standalone server with a secret authorizes the move with a token of its own.
                if (!opts.secret.empty())
                    to.token = vcuda::mgmt::sign_token(
                        opts.secret, {"", std::string(vcuda::mgmt::any_gpu), 0,
                                      std::chrono::system_clock::now() + std::chrono::minutes(1)});
                return to;
            };
            while (!st.stop_requested()) {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
                for (auto& s : srv.sessions().snapshot()) {
                    if (s->moved() || !due(s->id(), s->opened_at_ms())) continue;
                    std::string why;
                    if (s->move_to(target_for(s->local_client), std::chrono::seconds(5), why) != CUDA_SUCCESS)
                        VCUDA_LOG_WARN("--test-move-to: session {} not moved: {}", s->id(), why);
                }
                for (auto& w : srv.worker_sessions()) {  // --isolation process
                    if (!due(w.id, w.opened_at_ms)) continue;
                    std::string note;
                    if (srv.move_worker_session(w.id, target_for(w.local_client), std::chrono::minutes(2),
                                                note) != CUDA_SUCCESS)
                        VCUDA_LOG_WARN("--test-move-to: session {} not moved: {}", w.id, note);
                }
            }
        });
    }
    for (auto& b : bound) {
        VCUDA_LOG_INFO(
            "serving {} GPU(s) on {}{}{}", drv.gpus().size(), b.l.local().to_string(), b.what,
            opts.memory_quota ? fmt::format(" (quota {} MiB per session)", opts.memory_quota >> 20) : "");
        srv.serve(std::move(b.l));
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGPIPE, SIG_IGN);
    while (!stop_requested) {
        std::unique_lock lock(stop_mu);
        stop_cv.wait_for(lock, std::chrono::milliseconds(200));
    }
    VCUDA_LOG_INFO("stopping: no new sessions; {} live session(s) end with their connections",
                   srv.sessions().size() + srv.worker_sessions().size());
    srv.stop();
    return 0;
}
