// The real vcuda-mgmt binary killed with SIGKILL while leases are out: started again on the same database, it
// has the same leases, the client's lease_keeper and the server's agent carry on without an error. Also
// drives the `vcuda` command line against it.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/lease.hpp"
#include "mgmt/wire/rpc.hpp"
#include "mgmt/wire/server_agent.hpp"

using namespace vcuda;
using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string bin = VCUDA_BIN_DIR;
const std::string secret = "restart-test-secret-0123456789";

// A call signed with the shared secret (an operator on the manager's host).
result<std::string, rpc_error> signed_call(const endpoint& m, const std::string& method,
                                           const std::string& body, std::chrono::milliseconds timeout = 5s) {
    return mgmt_call(m, method, body, timeout, sign_request(secret, method, body));
}

struct manager_process {
    temp_dir& dir;
    std::string db;
    std::string socket;
    child_process child;

    manager_process(temp_dir& d, std::string db_name) : dir(d), db(d / db_name), socket(d / "mgmt.sock") {}
    void start() {
        child = child_process::spawn(
            {bin + "/vcuda-mgmt", "--listen", "unix:" + socket, "--db", db, "--secret-file", dir / "secret",
             "--heartbeat-timeout", "2s", "--lease-ttl", "2s", "--log-level", "debug"},
            dir / "mgmt.log");
        REQUIRE(eventually([&] { return signed_call(address(), "servers.list", "{}", 500ms).has_value(); }));
    }
    endpoint address() const { return *endpoint::parse("unix:" + socket); }
};

std::set<std::string> lease_ids(const endpoint& m) {
    auto r = signed_call(m, "leases.list", "{}");
    REQUIRE(r);
    json all = json::parse(*r);
    std::set<std::string> ids;
    for (auto& l : all.at("leases")) ids.insert(l.at("lease_id").get<std::string>());
    return ids;
}

std::string log_of(temp_dir& dir) {
    std::ifstream f(dir / "mgmt.log");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("a manager killed with SIGKILL comes back with the same leases", "[integration][mgmt]") {
    temp_dir dir;
    { std::ofstream(dir / "secret") << secret << "\n"; }
    ::chmod((dir / "secret").c_str(), 0600);
    manager_process mgr(dir, "mgmt.db");
    mgr.start();
    INFO(log_of(dir));

    server_agent_config cfg;
    cfg.manager = mgr.address();
    cfg.sign = [](std::string_view method, std::string_view body) {
        return sign_request(secret, method, body);
    };
    cfg.registration = server("gpu-a", {gpu(0, "GPU-a0", 80 * GiB)}, "127.0.0.1:7301");
    std::atomic<int> heartbeats{0};
    cfg.load = [&] {
        ++heartbeats;
        heartbeat hb;
        hb.gpus.push_back({"GPU-a0", 37, 3 * GiB, 1});
        return hb;
    };
    server_agent agent(cfg);
    REQUIRE(agent.wait_registered(5s));
    std::string server_id = agent.server_id();

    // The first operator credential, made with the secret file on the manager's host; with it, a tenant's.
    std::string cli = bin + "/vcuda";
    std::string m = " --manager unix:" + mgr.socket;
    auto [made, made_rc] = run_command(cli + " tokens create --tenant admin --operator --secret-file " +
                                       dir / "secret" + " -o " + dir / "admin.cred" + m);
    REQUIRE(made_rc == 0);
    CHECK(made.find("written to") != std::string::npos);
    struct stat st {};
    REQUIRE(::stat((dir / "admin.cred").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto [tenant_cred, tenant_rc] = run_command(cli + " tokens create --tenant laptop --credential " +
                                                dir / "admin.cred" + m + " 2>/dev/null");
    REQUIRE(tenant_rc == 0);
    std::string laptop = tenant_cred.substr(0, tenant_cred.find('\n'));
    m += " --credential " + dir / "admin.cred";
    auto [tokens, tokens_rc] = run_command(cli + " tokens list" + m);
    CHECK(tokens_rc == 0);
    CHECK(tokens.find("operator") != std::string::npos);
    CHECK(tokens.find("laptop") != std::string::npos);
    CHECK(tokens.find(laptop.substr(laptop.rfind('.') + 1)) == std::string::npos);

    auto g1 = acquire_lease(mgr.address(), request("laptop", 8 * GiB), 5s, laptop);
    auto g2 = acquire_lease(mgr.address(), request("laptop", 16 * GiB), 5s, laptop);
    REQUIRE(g1);
    REQUIRE(g2);
    std::atomic<bool> lost{false};
    auto keeper1 = std::make_unique<lease_keeper>(
        mgr.address(), *g1, [&](const std::string&) { lost = true; }, nullptr, laptop);
    lease_keeper keeper2(
        mgr.address(), *g2, [&](const std::string&) { lost = true; }, nullptr, laptop);
    std::set<std::string> before = lease_ids(mgr.address());
    REQUIRE(before == std::set<std::string>{g1->lease_id, g2->lease_id});

    // The operator's view, through the real command line.
    REQUIRE(
        eventually([&] { return run_command(cli + " gpus" + m).first.find("37%") != std::string::npos; }));
    auto [gpus, gpus_rc] = run_command(cli + " gpus" + m);
    CHECK(gpus_rc == 0);
    CHECK(gpus.find("gpu-a") != std::string::npos);
    CHECK(gpus.find("24.0 GiB / 80.0 GiB") != std::string::npos);
    CHECK(gpus.find("GPU-a0") != std::string::npos);
    auto [leases_json, leases_rc] = run_command(cli + " leases --json" + m);
    CHECK(leases_rc == 0);
    CHECK(json::parse(leases_json).at("leases").size() == 2);
    auto [servers, servers_rc] = run_command(cli + " servers" + m);
    CHECK(servers.find(server_id) != std::string::npos);

    // SIGKILL: no chance to flush or say goodbye.
    mgr.child.signal(SIGKILL);
    mgr.child.wait();
    std::this_thread::sleep_for(1500ms);  // clients and the server try to renew and fail meanwhile
    auto [down, down_rc] = run_command(cli + " gpus" + m + " 2>&1");
    CHECK(down_rc == 3);
    CHECK(down.find("is vcuda-mgmt running") != std::string::npos);
    mgr.start();

    CHECK(lease_ids(mgr.address()) == before);
    // Renewals and heartbeats resume; several TTLs later nothing was lost and the server kept its id.
    int hb_before = heartbeats;
    std::this_thread::sleep_for(5s);
    CHECK_FALSE(lost);
    CHECK_FALSE(keeper2.lost());
    CHECK(lease_ids(mgr.address()) == before);
    CHECK(heartbeats > hb_before + 3);
    CHECK(agent.server_id() == server_id);
    CHECK(agent.connected());
    auto [servers_json, _] = run_command(cli + " servers --json" + m);
    auto all = json::parse(servers_json).at("servers");
    REQUIRE(all.size() == 1);
    CHECK(all[0].at("state") == "up");

    // The client goes away: its keeper releases the lease.
    keeper1.reset();
    CHECK(lease_ids(mgr.address()) == std::set<std::string>{g2->lease_id});
    auto [rel, rel_rc] = run_command(cli + " release " + g2->lease_id + m);
    CHECK(rel_rc == 0);
    REQUIRE(eventually([&] { return keeper2.lost(); }, 5s));
    CHECK(lease_ids(mgr.address()).empty());

    // The credentials survived the restart; a tenant cannot cordon, and is told what it needs.
    auto [denied, denied_rc] = run_command("VCUDA_CREDENTIAL=" + laptop + " " + cli +
                                           " cordon gpu-a --manager unix:" + mgr.socket + " 2>&1");
    CHECK(denied_rc == 1);
    CHECK(denied.find("needs an operator credential") != std::string::npos);
    auto [anon, anon_rc] = run_command(cli + " gpus --manager unix:" + mgr.socket + " 2>&1");
    CHECK(anon_rc == 1);
    CHECK(anon.find("VCUDA_CREDENTIAL") != std::string::npos);

    // A manager on a fresh database does not know the server: the agent registers again by itself.
    mgr.child.signal(SIGTERM);
    CHECK(WIFEXITED(mgr.child.wait()));
    manager_process fresh(dir, "fresh.db");
    fresh.start();
    REQUIRE(eventually([&] {
        auto r = signed_call(fresh.address(), "gpus.list", "{}", 1s);
        return r && json::parse(*r).at("gpus").size() == 1;
    }));
    // ... and knows no credential.
    CHECK_FALSE(acquire_lease(fresh.address(), request("laptop", 1 * GiB), 5s, laptop));
    auto fresh_cred = signed_call(fresh.address(), "tokens.create", R"({"tenant":"laptop"})");
    REQUIRE(fresh_cred);
    CHECK(acquire_lease(fresh.address(), request("laptop", 1 * GiB), 5s,
                        json::parse(*fresh_cred).at("credential").get<std::string>()));
}
