// The attacks of issue 17 point 4 against a manager on a real socket: each one worked before the manager
// authenticated its callers (7c6105d) and is refused now. Also the credential life cycle (create, list,
// revoke) and who may see and change what.
#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mgmt/daemon/server.hpp"
#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/codec.hpp"
#include "mgmt/wire/lease.hpp"
#include "mgmt/wire/rpc.hpp"
#include "mgmt/wire/server_agent.hpp"

using namespace vcuda;
using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string secret = "auth-test-secret-0123456789";

// A manager on a Unix socket with one registered server (GPU-a0, 16 GiB).
struct cluster {
    temp_dir dir;
    std::unique_ptr<service> svc;
    std::unique_ptr<mgmt_server> server;
    endpoint manager;

    cluster() {
        auto store = sqlite_store::open(dir / "mgmt.db");
        REQUIRE(store);
        svc = std::make_unique<service>(service_config{{10s, 30s}, secret}, std::move(*store));
        REQUIRE(svc->start());
        server = std::make_unique<mgmt_server>(*svc, 50ms);
        REQUIRE(server->listen({*endpoint::parse("unix:" + dir / "mgmt.sock")}));
        server->start();
        manager = server->local_endpoints().at(0);
        auto body = json(test::server("gpu-a", {gpu(0, "GPU-a0", 16 * GiB)})).dump();
        REQUIRE(call_signed("server.register", body));
    }
    // A call as whoever holds the shared secret (a server, or an operator on the manager's host).
    result<std::string, rpc_error> call_signed(const std::string& method, const std::string& body) {
        return mgmt_call(manager, method, body, 5s, sign_request(secret, method, body));
    }
    result<std::string, rpc_error> call(const std::string& method, const json& body,
                                        const std::string& credential) {
        return mgmt_call(manager, method, body.dump(), 5s, credential);
    }
    // A fresh credential for `tenant`, made by the operator that holds the secret.
    std::string credential(const std::string& tenant, bool op = false) {
        auto r = call_signed("tokens.create", json{{"tenant", tenant}, {"operator", op}}.dump());
        REQUIRE(r);
        return json::parse(*r).at("credential").get<std::string>();
    }
    size_t leases(const std::string& credential) {
        auto r = call("leases.list", json::object(), credential);
        REQUIRE(r);
        return json::parse(*r).at("leases").size();
    }
};

std::string code_of(const result<std::string, rpc_error>& r) {
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == rpc_errc::remote);
    return r.error().code;
}

}  // namespace

TEST_CASE("attack: a client without a credential acquires a lease", "[integration][mgmt][security]") {
    cluster c;
    auto r = mgmt_call(c.manager, "lease.acquire", json(request("x", 1 * GiB)).dump(), 5s);
    CHECK(code_of(r) == "unauthenticated");
    CHECK(r.error().message.find("VCUDA_CREDENTIAL") != std::string::npos);
    // Nor with a made-up credential, nor with a real one altered.
    auto made_up = "vcc1.cred-0000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    CHECK(code_of(c.call("lease.acquire", json(request("x", 1 * GiB)), made_up)) == "unauthenticated");
    std::string alice = c.credential("alice");
    std::string altered = alice;
    altered.back() = altered.back() == 'A' ? 'B' : 'A';
    CHECK(code_of(c.call("lease.acquire", json(request("x", 1 * GiB)), altered)) == "unauthenticated");
    // Listings need a credential too.
    CHECK(code_of(mgmt_call(c.manager, "gpus.list", "{}", 5s)) == "unauthenticated");
    // With her credential, alice gets her lease.
    CHECK(c.call("lease.acquire", json(request("x", 1 * GiB)), alice));
}

TEST_CASE("attack: tenant A releases or renews tenant B's lease", "[integration][mgmt][security]") {
    cluster c;
    std::string alice = c.credential("alice"), bob = c.credential("bob"), op = c.credential("ops", true);
    auto grant = acquire_lease(c.manager, request("x", 1 * GiB), 5s, bob);
    REQUIRE(grant);
    json id{{"lease_id", grant->lease_id}};
    auto r = c.call("lease.release", id, alice);
    CHECK(code_of(r) == "forbidden");
    CHECK(r.error().message.find("bob") != std::string::npos);
    CHECK(code_of(c.call("lease.renew", id, alice)) == "forbidden");
    CHECK(code_of(mgmt_call(c.manager, "lease.release", id.dump(), 5s)) == "unauthenticated");
    // Alice does not even see it; bob and the operator do.
    CHECK(c.leases(alice) == 0);
    CHECK(c.leases(bob) == 1);
    CHECK(c.leases(op) == 1);
    // Its owner renews it; an operator may release it.
    CHECK(renew_lease(c.manager, grant->lease_id, 5s, bob));
    CHECK(c.call("lease.release", id, op));
    CHECK(c.leases(op) == 0);
}

TEST_CASE("attack: a rogue server registers without the shared secret", "[integration][mgmt][security]") {
    cluster c;
    auto rogue = json(test::server("evil", {gpu(0, "GPU-evil", 80 * GiB)}, "10.6.6.6:7300")).dump();
    auto r = mgmt_call(c.manager, "server.register", rogue, 5s);
    CHECK(code_of(r) == "unauthenticated");
    CHECK(r.error().message.find("--secret-file") != std::string::npos);
    // Signed with another secret, or with a tenant's credential: refused too.
    CHECK(code_of(mgmt_call(c.manager, "server.register", rogue, 5s,
                            sign_request("another-secret-0123456789", "server.register", rogue))) ==
          "unauthenticated");
    CHECK(code_of(c.call("server.register", json::parse(rogue), c.credential("alice"))) == "forbidden");
    // A real signature replayed, or moved onto another body, is refused.
    std::string heartbeat_body = json{{"server_id", "srv-x"}}.dump();
    std::string signed_auth = sign_request(secret, "server.register", rogue);
    CHECK(code_of(mgmt_call(c.manager, "server.register", heartbeat_body, 5s, signed_auth)) ==
          "unauthenticated");
    std::string good = json(test::server("gpu-b", {gpu(0, "GPU-b0", 16 * GiB)})).dump();
    std::string auth = sign_request(secret, "server.register", good);
    CHECK(mgmt_call(c.manager, "server.register", good, 5s, auth));
    CHECK(code_of(mgmt_call(c.manager, "server.register", good, 5s, auth)) == "unauthenticated");  // replay
    // A signature from too long ago is refused.
    auto old = sign_request(secret, "server.register", good, std::chrono::system_clock::now() - 5min);
    CHECK(code_of(mgmt_call(c.manager, "server.register", good, 5s, old)) == "unauthenticated");
    auto gpus = c.call("gpus.list", json::object(), c.credential("alice"));
    REQUIRE(gpus);
    CHECK(json::parse(*gpus).at("gpus").size() == 2);  // GPU-a0 and GPU-b0, no GPU-evil
}

TEST_CASE("attack: a tenant cordons the GPU, drains the server or mints credentials",
          "[integration][mgmt][security]") {
    cluster c;
    std::string alice = c.credential("alice"), op = c.credential("ops", true);
    for (auto [method, body] :
         {std::pair{"gpu.cordon", json{{"target", "GPU-a0"}}},
          std::pair{"gpu.uncordon", json{{"target", "GPU-a0"}}},
          std::pair{"server.drain", json{{"host", "gpu-a"}}},
          std::pair{"tokens.create", json{{"tenant", "mallory"}, {"operator", true}}},
          std::pair{"tokens.list", json::object()}, std::pair{"tokens.revoke", json{{"id", "cred-x"}}}}) {
        INFO(method);
        auto r = c.call(method, body, alice);
        CHECK(code_of(r) == "forbidden");
        CHECK(r.error().message.find("operator credential") != std::string::npos);
        CHECK(code_of(mgmt_call(c.manager, method, body.dump(), 5s)) == "unauthenticated");
    }
    // Alice's lease still lands on the GPU; an operator may cordon it.
    CHECK(c.call("lease.acquire", json(request("x", 1 * GiB)), alice));
    CHECK(c.call("gpu.cordon", {{"target", "GPU-a0"}}, op));
    CHECK(code_of(c.call("lease.acquire", json(request("x", 1 * GiB)), alice)) == "no_capacity");
}

TEST_CASE("a revoked or expired credential is refused, and its tenant's lease keeper stops",
          "[integration][mgmt][security]") {
    cluster c;
    std::string op = c.credential("ops", true);
    auto created = c.call("tokens.create", {{"tenant", "alice"}}, op);
    REQUIRE(created);
    json made = json::parse(*created);
    std::string alice = made.at("credential"), id = made.at("id");
    CHECK(made.at("tenant") == "alice");
    CHECK(alice.find(id) != std::string::npos);
    auto grant = acquire_lease(c.manager, request("x", 1 * GiB), 5s, alice);
    REQUIRE(grant);

    // The list shows ids and tenants, never the credential itself.
    auto listed = c.call("tokens.list", json::object(), op);
    REQUIRE(listed);
    CHECK(listed->find(alice) == std::string::npos);
    CHECK(listed->find(alice.substr(alice.rfind('.') + 1)) == std::string::npos);
    CHECK(json::parse(*listed).at("credentials").size() == 2);

    std::atomic<bool> lost{false};
    grant->ttl_ms = 300;  // renew every 100 ms
    lease_keeper keeper(
        c.manager, *grant, [&](const std::string&) { lost = true; }, {}, alice);
    REQUIRE(c.call("tokens.revoke", {{"id", id}}, op));
    CHECK(code_of(c.call("lease.acquire", json(request("x", 1 * GiB)), alice)) == "unauthenticated");
    CHECK(code_of(c.call("gpus.list", json::object(), alice)) == "unauthenticated");
    REQUIRE(eventually([&] { return lost.load(); }, 5s));
    CHECK(code_of(c.call("tokens.revoke", {{"id", "cred-nothing"}}, op)) == "not_found");

    // A credential made with --ttl stops working when it expires.
    auto brief = c.call("tokens.create", {{"tenant", "carol"}, {"ttl_ms", 1}}, op);
    REQUIRE(brief);
    std::this_thread::sleep_for(20ms);
    CHECK(code_of(c.call("gpus.list", json::object(), json::parse(*brief).at("credential"))) ==
          "unauthenticated");
}

TEST_CASE("credentials survive a manager restart, and only their hash is stored",
          "[integration][mgmt][security]") {
    temp_dir dir;
    std::string credential;
    {
        auto store = sqlite_store::open(dir / "mgmt.db");
        REQUIRE(store);
        service svc(service_config{{10s, 30s}, secret}, std::move(*store));
        REQUIRE(svc.start());
        std::string body = json{{"tenant", "alice"}}.dump();
        auto r = svc.handle("tokens.create", body, sign_request(secret, "tokens.create", body));
        REQUIRE(r.ok);
        credential = json::parse(r.body).at("credential");
    }
    {
        std::ifstream f(dir / "mgmt.db", std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        std::ifstream w(dir / "mgmt.db-wal", std::ios::binary);
        bytes.append((std::istreambuf_iterator<char>(w)), std::istreambuf_iterator<char>());
        CHECK(bytes.find(credential.substr(credential.rfind('.') + 1)) == std::string::npos);
    }
    auto store = sqlite_store::open(dir / "mgmt.db");
    REQUIRE(store);
    service svc(service_config{{10s, 30s}, secret}, std::move(*store));
    REQUIRE(svc.start());
    CHECK(svc.handle("gpus.list", "{}", credential).ok);
    CHECK_FALSE(svc.handle("gpus.list", "{}", "").ok);
}
