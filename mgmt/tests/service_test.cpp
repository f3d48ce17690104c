// The manager's request handler with a fake clock: JSON in, JSON out, tokens signed, errors coded.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "mgmt/daemon/service.hpp"
#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/codec.hpp"

using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string secret = "test-secret-0123456789";

struct fixture {
    fake_clock clock;
    temp_dir dir;
    std::unique_ptr<service> svc;
    fixture() { open(); }
    void open() {
        auto store = sqlite_store::open(dir / "mgmt.db");
        REQUIRE(store);
        svc = std::make_unique<service>(service_config{{10s, 30s}, secret}, std::move(*store),
                                        [this] { return clock(); });
        REQUIRE(svc->start());
    }
    // Calls as the cluster itself (signed with the shared secret: servers' and operators' rights).
    std::string auth(const std::string& method, const std::string& body) {
        return sign_request(secret, method, body,
                            std::chrono::system_clock::time_point(clock().time_since_epoch()));
    }
    json call(const std::string& method, const json& body) {
        auto r = svc->handle(method, body.dump(), auth(method, body.dump()));
        INFO(method << ": " << r.error);
        REQUIRE(r.ok);
        return json::parse(r.body);
    }
    std::string code(const std::string& method, const std::string& body) {
        auto r = svc->handle(method, body, auth(method, body));
        REQUIRE_FALSE(r.ok);
        CHECK_FALSE(r.error.empty());
        return json::parse(r.body).at("code").get<std::string>();
    }
};

std::chrono::system_clock::time_point sys(time_ms t) {
    return std::chrono::system_clock::time_point(t.time_since_epoch());
}

}  // namespace

TEST_CASE("service: register, lease with signed tokens, renew, release", "[unit][mgmt]") {
    fixture f;
    auto reg = f.call(
        "server.register",
        json(server("gpu-a", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)}, "10.0.0.1:7300")));
    std::string sid = reg.at("server_id");
    CHECK(reg.at("heartbeat_interval_ms") == 3333);

    auto grant = decode<lease_grant>(f.call("lease.acquire", json(request("gpu-a", 4 * GiB, 2))).dump());
    REQUIRE(grant);
    CHECK(grant->expires_at == to_unix_ms(f.clock() + 30s));
    CHECK(grant->ttl_ms == 30000);
    REQUIRE(grant->devices.size() == 2);
    for (auto& d : grant->devices) {
        CHECK(d.server_endpoints == std::vector<std::string>{"10.0.0.1:7300"});
        CHECK(d.host == "gpu-a");
        CHECK(d.memory_quota == 4 * GiB);
        auto c = verify_token(secret, d.token, sys(f.clock()));
        REQUIRE(c);
        CHECK(c->lease_id == grant->lease_id);
        CHECK(c->gpu_uuid == d.uuid);
        CHECK(c->memory_quota == 4 * GiB);
        CHECK_FALSE(verify_token("another-secret-000000", d.token, sys(f.clock())));
        CHECK_FALSE(verify_token(secret, d.token, sys(f.clock() + 30s)));  // expires with the lease
    }
    CHECK(grant->devices[0].gpu_index != grant->devices[1].gpu_index);

    f.clock.advance(20s);
    auto renewed = decode<lease_grant>(f.call("lease.renew", {{"lease_id", grant->lease_id}}).dump());
    REQUIRE(renewed);
    CHECK(renewed->expires_at == to_unix_ms(f.clock() + 30s));
    CHECK(verify_token(secret, renewed->devices[0].token, sys(f.clock() + 29s)));

    auto hb = f.call(
        "server.heartbeat",
        {{"server_id", sid},
         {"gpus", {{{"uuid", "GPU-a0"}, {"utilization", 42}, {"memory_used", 1 << 30}, {"sessions", 1}}}},
         {"sessions",
          {{{"session_id", "s1"},
            {"lease_id", grant->lease_id},
            {"gpu_uuid", "GPU-a0"},
            {"client", "10.0.0.9:5555"},
            {"memory_used", 1 << 20}}}}});
    CHECK(hb.at("leases").size() == 2);

    auto gpus = f.call("gpus.list", json::object()).at("gpus");
    REQUIRE(gpus.size() == 2);
    CHECK(gpus[0].at("host") == "gpu-a");
    CHECK(gpus[0].at("leased_memory") == 4 * GiB);
    CHECK(gpus[0].at("utilization") == 42);
    CHECK(gpus[0].at("sessions") == 1);
    CHECK(gpus[0].at("state") == "up");
    CHECK_FALSE(gpus[1].contains("utilization"));  // not reported yet
    auto sessions = f.call("sessions.list", json::object()).at("sessions");
    REQUIRE(sessions.size() == 1);
    CHECK(sessions[0].at("host") == "gpu-a");
    CHECK(sessions[0].at("lease_id") == grant->lease_id);
    auto servers = f.call("servers.list", json::object()).at("servers");
    REQUIRE(servers.size() == 1);
    CHECK(servers[0].at("leases") == 1);
    CHECK(servers[0].at("gpus") == 2);
    auto leases = f.call("leases.list", json::object()).at("leases");
    REQUIRE(leases.size() == 1);
    CHECK(leases[0].at("devices").size() == 2);

    f.call("lease.release", {{"lease_id", grant->lease_id}});
    CHECK(f.call("leases.list", json::object()).at("leases").empty());
    CHECK(f.code("lease.release", json{{"lease_id", grant->lease_id}}.dump()) == "unknown_lease");
}

TEST_CASE("service: errors carry a code and a next step", "[unit][mgmt]") {
    fixture f;
    CHECK(f.code("no.such.method", "{}") == "unknown_method");
    CHECK(f.code("lease.acquire", "not json") == "bad_request");
    CHECK(f.code("lease.acquire", "[1,2]") == "bad_request");
    CHECK(f.code("lease.acquire", R"({"gpus":"two"})") == "bad_request");
    CHECK(f.code("lease.acquire", R"({"gpus":1})") == "no_capacity");
    CHECK(f.code("server.heartbeat", R"({"server_id":"srv-x"})") == "unknown_server");
    CHECK(f.code("lease.renew", R"({"lease_id":"lease-x"})") == "unknown_lease");
    CHECK(f.code("gpu.cordon", R"({"target":"nothing"})") == "not_found");
    CHECK(f.code("server.drain", R"({"host":"nothing"})") == "not_found");
    CHECK(f.code("server.register", R"({"host":"h"})") == "bad_request");  // no endpoints
}

TEST_CASE("service: expiry and heartbeat timeouts run on tick, and a reopened manager has the same leases",
          "[unit][mgmt]") {
    fixture f;
    std::string sid =
        f.call("server.register", json(server("gpu-a", {gpu(0, "GPU-a0", 16 * GiB)}))).at("server_id");
    auto kept = f.call("lease.acquire", json(request("x", 4 * GiB))).at("lease_id").get<std::string>();
    auto dropped = f.call("lease.acquire", json(request("x", 4 * GiB))).at("lease_id").get<std::string>();
    f.clock.advance(20s);
    f.call("lease.renew", {{"lease_id", kept}});
    f.call("server.heartbeat", {{"server_id", sid}});
    f.clock.advance(11s);
    f.svc->tick();
    auto leases = f.call("leases.list", json::object()).at("leases");
    REQUIRE(leases.size() == 1);
    CHECK(leases[0].at("lease_id") == kept);
    CHECK(f.call("servers.list", json::object()).at("servers")[0].at("state") == "down");
    f.call("gpu.cordon", {{"target", "GPU-a0"}});

    // A new manager process on the same database.
    f.svc.reset();
    f.open();
    leases = f.call("leases.list", json::object()).at("leases");
    REQUIRE(leases.size() == 1);
    CHECK(leases[0].at("lease_id") == kept);
    CHECK(f.call("gpus.list", json::object()).at("gpus")[0].at("cordoned") == true);
    f.call("lease.renew", {{"lease_id", kept}});
    f.call("server.heartbeat", {{"server_id", sid}});  // the server's id survived too
}
