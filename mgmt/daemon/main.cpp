// vcuda-mgmt: the manager. Servers register their GPUs with it and send heartbeats; clients lease GPUs from
// it; operators ask it with `vcuda gpus|servers|leases|sessions|cordon|uncordon|drain|release|migrate`.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/crash_report.hpp"
#include "common/log.hpp"
#include "common/metrics_http.hpp"
#include "common/tls.hpp"
#include "mgmt/daemon/server.hpp"
#include "mgmt/daemon/service.hpp"
#include "mgmt/store/store.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/units.hpp"

namespace {

int fail(const std::string& message) {
    std::fprintf(stderr, "vcuda-mgmt: %s\n", message.c_str());
    return 2;
}

}  // namespace

// An exception that escapes main ends the program, as it should.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
    using namespace vcuda;
    using namespace vcuda::mgmt;
    install_crash_report("vcuda-mgmt");

    CLI::App app{
        "vcuda-mgmt: the vcuda manager. vcuda-servers register their GPUs here; clients lease GPUs from it; "
        "operators use `vcuda gpus`, `vcuda leases`, `vcuda drain` ... against it.",
        "vcuda-mgmt"};
    std::vector<std::string> listen;
    std::string db, secret_file, heartbeat_text = "10s", ttl_text = "30s", level;
    app.add_option("--listen,-l", listen, "address to serve on, HOST:PORT or unix:/path (repeat for several)")
        ->required();
    app.add_option("--db", db, "SQLite database that keeps servers, GPUs, leases and cordons across restarts")
        ->required();
    app.add_option(
           "--secret-file", secret_file,
           "file holding the secret shared with every vcuda-server (signs lease tokens); create it with "
           "`head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`")
        ->required();
    app.add_option("--heartbeat-timeout", heartbeat_text, "a server silent this long is marked down")
        ->capture_default_str();
    app.add_option("--lease-ttl", ttl_text, "a lease not renewed for this long expires")
        ->capture_default_str();
    std::string idle_text;
    app.add_option(
        "--idle-suspend-after", idle_text,
        "suspend a lease whose sessions had no call for this long (e.g. 10m): its servers save its "
        "GPU state to host memory and give the GPU back; its next call resumes it. Default: off");
    bool rebalance = false;
    std::string rebalance_interval = "5s", rebalance_cooldown = "10m", move_timeout = "10m";
    uint32_t rebalance_threshold = 25, rebalance_after = 3, rebalance_max_moves = 1;
    app.add_flag(
           "--rebalance", rebalance,
           "move sessions live from the hottest GPU to the coolest when GPU pressure (the larger of "
           "utilization and memory in use, from the servers' heartbeats) stays uneven: more than "
           "--rebalance-threshold points apart for --rebalance-after samples in a row, one sample every "
           "--rebalance-interval. One lease per decision (the busiest, then the smallest, of the hottest "
           "GPU's), at most --rebalance-max-moves a minute, never a lease that moved within "
           "--rebalance-cooldown. Every decision is logged and is a `vcuda events` entry. Default: off")
        ->group("Rebalancing");
    app.add_option(
           "--rebalance-threshold", rebalance_threshold,
           "percentage points of pressure between the hottest and the coolest GPU that count as uneven")
        ->group("Rebalancing")
        ->capture_default_str()
        ->check(CLI::Range(1, 100));
    app.add_option("--rebalance-interval", rebalance_interval,
                   "time between two samples of the GPUs' pressure (give servers time for a heartbeat)")
        ->group("Rebalancing")
        ->capture_default_str();
    app.add_option("--rebalance-after", rebalance_after,
                   "samples in a row above the threshold before a move (hysteresis; counted again after "
                   "every decision)")
        ->group("Rebalancing")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    app.add_option("--rebalance-max-moves", rebalance_max_moves, "most moves the policy asks for in a minute")
        ->group("Rebalancing")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    app.add_option(
           "--rebalance-cooldown", rebalance_cooldown,
           "a lease that moved (for any reason) is not moved by the policy for this long, so it never "
           "goes back and forth")
        ->group("Rebalancing")
        ->capture_default_str();
    app.add_option(
           "--move-timeout", move_timeout,
           "a move (`vcuda migrate`, a drain, rebalancing) whose outcome no server reported this long "
           "after it was asked for is given up; the lease stays where it was")
        ->capture_default_str();
    tls_files tls_files;
    app.add_option(
           "--tls-cert", tls_files.cert,
           "PEM certificate (with its chain) for TCP addresses: they then speak TLS only, and servers, "
           "clients and `vcuda` need VCUDA_TLS_CA=FILE (the CA that signed it) to connect; Unix sockets "
           "stay plain. Needs --tls-key")
        ->check(CLI::ExistingFile);
    app.add_option("--tls-key", tls_files.key, "PEM private key of --tls-cert (keep it mode 600)")
        ->check(CLI::ExistingFile);
    app.add_option(
           "--tls-client-ca", tls_files.ca,
           "mutual TLS: admit only TCP peers whose certificate (VCUDA_TLS_CERT/VCUDA_TLS_KEY) this CA "
           "signed. Needs --tls-cert")
        ->check(CLI::ExistingFile);
    std::string metrics_listen;
    app.add_option(
        "--metrics-listen", metrics_listen,
        "serve Prometheus metrics at http://ADDR:PORT/metrics (servers, GPUs, leases and sessions by "
        "state, memory per tenant, events; README, Metrics). Off by default. Plain HTTP without "
        "authentication, and the page names tenants: an address other than loopback needs --insecure");
    bool insecure = false;
    app.add_flag("--insecure", insecure,
                 "let --metrics-listen serve an address other than loopback (anyone who reaches it reads the "
                 "metrics). The manager's own --listen addresses always require credentials");
    app.add_option("--log-level", level, "trace|debug|info|warn|error (default: $VCUDA_LOG_LEVEL or info)");
    app.footer(
        "Example:\n  vcuda-mgmt --listen 0.0.0.0:7400 --db /var/lib/vcuda/mgmt.db --secret-file "
        "/etc/vcuda/secret\n"
        "then start each GPU host's server with `vcuda-server --listen HOST:7300 --manager MGMT:7400 "
        "--secret-file /etc/vcuda/secret`\nand run programs with `vcuda run --manager MGMT:7400 -- ./app`.");
    CLI11_PARSE(app, argc, argv);

    spdlog::level::level_enum lvl;
    if (!level.empty() && !log::parse_level(level, lvl))
        return fail("--log-level '" + level +
                    "' is not one of trace, debug, info, warn, error, critical, off");
    log::init("vcuda-mgmt", level);

    service_config cfg;
    auto hb = parse_duration(heartbeat_text);
    auto ttl = parse_duration(ttl_text);
    if (!hb || hb->count() <= 0)
        return fail("--heartbeat-timeout '" + heartbeat_text + "' is not a duration like 10s");
    if (!ttl || ttl->count() <= 0) return fail("--lease-ttl '" + ttl_text + "' is not a duration like 30s");
    cfg.state.heartbeat_timeout = *hb;
    cfg.state.lease_ttl = *ttl;
    if (!idle_text.empty()) {
        auto idle = parse_duration(idle_text);
        if (!idle || idle->count() <= 0)
            return fail("--idle-suspend-after '" + idle_text + "' is not a duration like 10m");
        cfg.idle_suspend_after = *idle;
    }
    auto timeout = parse_duration(move_timeout);
    if (!timeout || timeout->count() <= 0)
        return fail("--move-timeout '" + move_timeout + "' is not a duration like 10m");
    cfg.state.move_timeout = *timeout;
    if (rebalance) {
        rebalance_config rc;
        auto interval = parse_duration(rebalance_interval);
        auto cooldown = parse_duration(rebalance_cooldown);
        if (!interval || interval->count() <= 0)
            return fail("--rebalance-interval '" + rebalance_interval + "' is not a duration like 5s");
        if (!cooldown || cooldown->count() < 0)
            return fail("--rebalance-cooldown '" + rebalance_cooldown + "' is not a duration like 10m");
        rc.threshold = rebalance_threshold;
        rc.sustain = rebalance_after;
        rc.interval = *interval;
        rc.max_moves_per_minute = rebalance_max_moves;
        rc.cooldown = *cooldown;
        cfg.rebalance = rc;
    }
    auto secret = read_secret_file(secret_file);
    if (!secret) return fail(secret.error());
    cfg.secret = *secret;

    std::shared_ptr<const tls_context> tls;
    if (!tls_files.cert.empty() || !tls_files.key.empty() || !tls_files.ca.empty()) {
        if (tls_files.cert.empty() || tls_files.key.empty())
            return fail("TLS needs both --tls-cert FILE and --tls-key FILE");
        auto ctx = tls_context::server(tls_files);
        if (!ctx) return fail("TLS: " + ctx.error());
        tls = *ctx;
    }

    std::vector<endpoint> endpoints;
    for (auto& text : listen) {
        auto ep = endpoint::parse(text);
        if (!ep) return fail("--listen '" + text + "': " + ep.error());
        endpoints.push_back(*ep);
    }

    std::optional<endpoint> metrics_at;
    if (!metrics_listen.empty()) {
        auto ep = metrics::parse_listen_address(metrics_listen, insecure);
        if (!ep) return fail("--metrics-listen " + metrics_listen + ": " + ep.error());
        metrics_at = *ep;
    }

    auto store = sqlite_store::open(db);
    if (!store) return fail(store.error());
    service svc(cfg, std::move(*store));
    if (auto r = svc.start(); !r) return fail(r.error());

    // Signals are taken synchronously by this thread; every other thread inherits the blocked mask.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    mgmt_server server(svc);
    if (auto r = server.listen(endpoints, tls); !r) return fail(r.error());
    server.start();
    std::string addrs;
    for (auto& ep : server.local_endpoints())
        addrs += (addrs.empty() ? "" : ", ") + ep.to_string() +
                 (ep.type == endpoint::kind::unix_socket ? " (Unix socket)"
                  : !tls                                 ? " (TCP without TLS: not encrypted)"
                  : tls->requires_client_certificate()   ? " (TLS; client certificates required)"
                                                         : " (TLS)");
    VCUDA_LOG_INFO("listening on {} (heartbeat timeout {} ms, lease ttl {} ms, db {})", addrs, hb->count(),
                   ttl->count(), db);
    if (cfg.rebalance)
        VCUDA_LOG_INFO(
            "rebalancing: a move when GPU pressure is more than {} points apart for {} samples {} ms apart; "
            "at "
            "most {} a minute; a lease that moved stays {} s",
            cfg.rebalance->threshold, cfg.rebalance->sustain, cfg.rebalance->interval.count(),
            cfg.rebalance->max_moves_per_minute, cfg.rebalance->cooldown.count() / 1000);
    std::unique_ptr<metrics::http_listener>
        metrics_server;  // declared after `svc` and `server`: stops before them
    if (metrics_at) {
        auto m = metrics::http_listener::start(*metrics_at, [&svc] { return svc.metrics(); });
        if (!m) {
            server.stop();
            return fail("--metrics-listen " + metrics_listen + ": " + m.error());
        }
        metrics_server = std::move(*m);
        VCUDA_LOG_INFO("metrics at http://{}/metrics", metrics_server->local().to_string());
    }

    int sig = 0;
    sigwait(&sigs, &sig);
    VCUDA_LOG_INFO("signal {}: stopping", sig);
    server.stop();
    return 0;
}
