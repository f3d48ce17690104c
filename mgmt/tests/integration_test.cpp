// The manager over real sockets: one vcuda-mgmt (in this process), two servers reporting through
// server_agent, three clients leasing through acquire_lease/lease_keeper; each lands where the placement
// policy says, tokens verify only with the shared secret, renewals keep leases alive and expiry frees them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <set>

#include "mgmt/daemon/server.hpp"
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

const std::string secret = "integration-secret-0123456789";

// Calls signed with the shared secret (an operator on the manager's host).
result<std::string, rpc_error> signed_call(const endpoint& m, const std::string& method,
                                           const std::string& body) {
    return mgmt_call(m, method, body, 5s, sign_request(secret, method, body));
}

json list(const endpoint& m, const std::string& method) {
    auto r = signed_call(m, method, "{}");
    REQUIRE(r);
    return json::parse(*r);
}

std::set<std::string> lease_ids(const endpoint& m) {
    std::set<std::string> ids;
    json all = list(m, "leases.list");  // (a range-for over a temporary's member would dangle)
    for (auto& l : all.at("leases")) ids.insert(l.at("lease_id").get<std::string>());
    return ids;
}

struct fake_server {
    std::atomic<int> heartbeats{0};
    std::mutex mutex;
    std::vector<active_lease> leases;
    std::unique_ptr<server_agent> agent;

    fake_server(const endpoint& manager, server_registration reg) {
        server_agent_config cfg;
        cfg.manager = manager;
        cfg.sign = [](std::string_view method, std::string_view body) {
            return sign_request(secret, method, body);
        };
        auto uuids = reg.gpus;
        cfg.registration = std::move(reg);
        cfg.load = [this, uuids] {
            ++heartbeats;
            heartbeat hb;
            for (auto& g : uuids) hb.gpus.push_back({g.uuid, 10, 1ull << 30, 0});
            return hb;
        };
        cfg.on_leases = [this](const std::vector<active_lease>& l) {
            std::lock_guard lock(mutex);
            leases = l;
        };
        agent = std::make_unique<server_agent>(std::move(cfg));
    }
    std::set<std::string> lease_ids() {
        std::lock_guard lock(mutex);
        std::set<std::string> ids;
        for (auto& l : leases) ids.insert(l.lease_id);
        return ids;
    }
};

}  // namespace

TEST_CASE("one manager, two servers, three clients: each lands where the policy says",
          "[integration][mgmt]") {
    temp_dir dir;
    auto store = sqlite_store::open(dir / "mgmt.db");
    REQUIRE(store);
    service svc(service_config{{1500ms, 1500ms}, secret}, std::move(*store));
    REQUIRE(svc.start());
    mgmt_server server(svc, 50ms);
    REQUIRE(server.listen({*endpoint::parse("127.0.0.1:0"), *endpoint::parse("unix:" + dir / "mgmt.sock")}));
    server.start();
    endpoint manager = server.local_endpoints().at(0);
    endpoint manager_unix = server.local_endpoints().at(1);
    REQUIRE(manager.port != 0);

    fake_server a(manager, test::server("gpu-a", {gpu(0, "GPU-a0", 16 * GiB)}, "127.0.0.1:7301"));
    fake_server b(
        manager_unix,
        test::server("gpu-b", {gpu(0, "GPU-b0", 16 * GiB), gpu(1, "GPU-b1", 40 * GiB)}, "127.0.0.1:7302"));
    REQUIRE(a.agent->wait_registered(5s));
    REQUIRE(b.agent->wait_registered(5s));
    REQUIRE(eventually([&] { return a.heartbeats > 0 && b.heartbeats > 0; }));
    // The clients are one tenant; their credential comes from VCUDA_CREDENTIAL, as in a real client.
    auto made = signed_call(manager, "tokens.create", R"({"tenant":"team"})");
    REQUIRE(made);
    ::setenv("VCUDA_CREDENTIAL", json::parse(*made).at("credential").get<std::string>().c_str(), 1);
    CHECK(list(manager, "servers.list").at("servers").size() == 2);
    CHECK(list(manager, "gpus.list").at("gpus").size() == 3);

    // Client 1 runs on gpu-a: its own host first.
    auto c1 = acquire_lease(manager, request("gpu-a", 8 * GiB), 5s);
    REQUIRE(c1);
    REQUIRE(c1->devices.size() == 1);
    CHECK(c1->devices[0].uuid == "GPU-a0");
    CHECK(c1->devices[0].server_endpoints == std::vector<std::string>{"127.0.0.1:7301"});
    // Client 2 needs 30 GiB: only GPU-b1 has it.
    auto c2 = acquire_lease(manager_unix, request("laptop", 30 * GiB), 5s);
    REQUIRE(c2);
    CHECK(c2->devices[0].uuid == "GPU-b1");
    // Client 3 needs 6 GiB: a0 keeps 2 free, b1 4, b0 10: best fit is a0.
    auto c3 = acquire_lease(manager, request("laptop", 6 * GiB), 5s);
    REQUIRE(c3);
    CHECK(c3->devices[0].uuid == "GPU-a0");
    // Nobody gets more than there is.
    auto c4 = acquire_lease(manager, request("laptop", 17 * GiB), 5s);
    REQUIRE_FALSE(c4);
    CHECK(c4.error().find("cannot place") != std::string::npos);

    // Each device's token opens a session only on its own GPU, only with the shared secret, only until
    // expiry.
    auto now = std::chrono::system_clock::now();
    for (auto* g : {&*c1, &*c2, &*c3}) {
        auto claims = verify_token(secret, g->devices[0].token, now);
        REQUIRE(claims);
        CHECK(claims->lease_id == g->lease_id);
        CHECK(claims->gpu_uuid == g->devices[0].uuid);
        CHECK(claims->memory_quota == g->devices[0].memory_quota);
        CHECK_FALSE(verify_token("forged-secret-0123456789", g->devices[0].token, now));
        CHECK_FALSE(verify_token(secret, g->devices[0].token, now + 1h));
    }
    auto forged = sign_token("forged-secret-0123456789", {"lease-x", "GPU-a0", 80 * GiB, now + 1h});
    CHECK_FALSE(verify_token(secret, forged, now));

    // Servers learn which leases are alive on their GPUs.
    REQUIRE(eventually([&] { return a.lease_ids() == std::set<std::string>{c1->lease_id, c3->lease_id}; }));
    REQUIRE(eventually([&] { return b.lease_ids() == std::set<std::string>{c2->lease_id}; }));

    {
        // Clients 1 and 2 keep their leases alive past several TTLs; client 3 stops renewing (it "crashed").
        std::atomic<int> renewals{0};
        lease_keeper k1(manager, *c1, {}, [&](const lease_grant&) { ++renewals; });
        lease_keeper k2(manager_unix, *c2);
        std::this_thread::sleep_for(3500ms);
        CHECK(renewals >= 3);
        CHECK_FALSE(k1.lost());
        CHECK_FALSE(k2.lost());
        CHECK(k1.current().expires_at > c1->expires_at);
        CHECK(verify_token(secret, k1.current().devices[0].token, std::chrono::system_clock::now()));
        CHECK(lease_ids(manager) == std::set<std::string>{c1->lease_id, c2->lease_id});
        REQUIRE(eventually([&] { return a.lease_ids() == std::set<std::string>{c1->lease_id}; }));

        // The freed memory can be leased again.
        auto c5 = acquire_lease(manager, request("laptop", 6 * GiB), 5s);
        REQUIRE(c5);
        CHECK(c5->devices[0].uuid == "GPU-a0");
        REQUIRE(release_lease(manager, c5->lease_id, 5s));

        // An operator releases client 2's lease: its keeper notices and reports it.
        REQUIRE(signed_call(manager, "lease.release", json{{"lease_id", c2->lease_id}}.dump()));
        REQUIRE(eventually([&] { return k2.lost(); }, 3s));
    }
    // Keepers release when destroyed.
    CHECK(lease_ids(manager).empty());

    // A server that stops sending heartbeats is marked down; its GPUs take no new leases.
    b.agent->stop();
    REQUIRE(eventually(
        [&] {
            json all = list(manager, "servers.list");
            for (auto& s : all.at("servers"))
                if (s.at("host") == "gpu-b") return s.at("state") == "down";
            return false;
        },
        5s));
    auto c6 = acquire_lease(manager, request("gpu-b", 20 * GiB), 5s);
    REQUIRE_FALSE(c6);
    CHECK(c6.error().find("down, cordoned or draining") != std::string::npos);

    // Drain: no new leases on gpu-a.
    REQUIRE(signed_call(manager, "server.drain", R"({"host":"gpu-a"})"));
    CHECK_FALSE(acquire_lease(manager, request("gpu-a", 1 * GiB), 5s));
    REQUIRE(signed_call(manager, "gpu.uncordon", R"({"target":"gpu-a"})"));
    CHECK(acquire_lease(manager, request("gpu-a", 1 * GiB), 5s));
    ::unsetenv("VCUDA_CREDENTIAL");
    server.stop();
}

TEST_CASE("the manager refuses what is not a manager request", "[integration][mgmt]") {
    temp_dir dir;
    service svc(service_config{{1s, 1s}, secret}, nullptr);
    REQUIRE(svc.start());
    mgmt_server server(svc);
    REQUIRE(server.listen({*endpoint::parse("127.0.0.1:0")}));
    server.start();
    endpoint manager = server.local_endpoints().at(0);
    auto r = signed_call(manager, "nope", "{}");
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == rpc_errc::remote);
    CHECK(r.error().code == "unknown_method");
    // Nothing listens: a clear message that says what to start.
    auto gone = mgmt_call(*endpoint::parse("127.0.0.1:1"), "gpus.list", "{}", 2s);
    REQUIRE_FALSE(gone);
    CHECK(gone.error().kind == rpc_errc::unreachable);
    CHECK(describe(gone.error(), *endpoint::parse("127.0.0.1:1")).find("is vcuda-mgmt running") !=
          std::string::npos);
    // A client asking for a lease gets the same advice.
    auto lease = acquire_lease(*endpoint::parse("127.0.0.1:1"), request("x", 1), 2s);
    REQUIRE_FALSE(lease);
    CHECK(lease.error().find("vcuda-mgmt") != std::string::npos);
    server.stop();
}
