// vcuda-mgmt's Prometheus metrics (mgmt/daemon/metrics.hpp): the values a scrape gives for a known state (a
// fake clock; servers, GPUs, leases of two tenants, a suspended session, an operator's suspend), and the real
// binary with --metrics-listen answering scrapes and refusing a network address without --insecure.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mgmt/daemon/service.hpp"
#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/codec.hpp"
#include "tests/metrics_scrape.hpp"

using namespace vcuda;
using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string secret = "metrics-test-secret-0123456789";

struct fixture {
    fake_clock clock;
    service svc{service_config{{10s, 30s}, secret}, nullptr, [this] { return clock(); }};
    fixture() { REQUIRE(svc.start()); }
    json call(const std::string& method, const json& body, const std::string& credential = {}) {
        const std::string text = body.dump();
        auto auth = credential.empty()
                        ? sign_request(secret, method, text,
                                       std::chrono::system_clock::time_point(clock().time_since_epoch()))
                        : credential;
        auto r = svc.handle(method, text, auth);
        INFO(method << ": " << r.error);
        REQUIRE(r.ok);
        return json::parse(r.body);
    }
    std::string credential(const std::string& tenant) {
        return call("tokens.create", {{"tenant", tenant}}).at("credential").get<std::string>();
    }
};

double value(const std::string& text, const std::string& series) {
    INFO(series << " in\n" << text);
    auto v = vcuda::test::metric(text, series);
    REQUIRE(v);
    return *v;
}

}  // namespace

TEST_CASE("manager metrics: servers, GPUs, leases and sessions by state, memory per tenant, events",
          "[unit][mgmt]") {
    fixture f;
    const std::string server_id =
        f.call("server.register",
               json(server("gpu-a", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)})))
            .at("server_id");
    const std::string alice = f.credential("alice"), bob = f.credential("bob");
    const std::string alice_lease =
        f.call("lease.acquire", json(request("x", 4 * GiB)), alice).at("lease_id");
    const std::string bob_lease = f.call("lease.acquire", json(request("x", 2 * GiB)), bob).at("lease_id");
    // Alice's one session is suspended (3 GiB saved); bob's runs with 1 GiB.
    heartbeat hb;
    hb.server_id = server_id;
    hb.gpus = {{"GPU-a0", 50, 4 * GiB, 2}, {"GPU-a1", 0, 0, 0}};
    session_report a{"1", alice_lease, "GPU-a0", "client-a", 3 * GiB};
    a.suspended = true;
    hb.sessions = {a, session_report{"2", bob_lease, "GPU-a0", "client-b", 1 * GiB}};
    f.call("server.heartbeat", json(hb));
    f.call("lease.suspend", {{"lease_id", bob_lease}});  // an operator's request: one event
    f.call("gpu.cordon", {{"target", "GPU-a1"}});
    f.clock.advance(3s);

    const std::string text = f.svc.metrics();
    CHECK(value(text, R"(vcuda_mgmt_servers{state="up"})") == 1);
    CHECK(value(text,
                "vcuda_mgmt_server_heartbeat_age_seconds{server=\"" + server_id + "\",host=\"gpu-a\"}") == 3);
    // Both leases best-fit onto GPU-a0; GPU-a1, cordoned, holds none.
    CHECK(value(text, R"(vcuda_mgmt_gpus{state="up",leased="true"})") == 1);
    CHECK(value(text, R"(vcuda_mgmt_gpus{state="cordoned",leased="false"})") == 1);
    const std::string a0 = "{gpu=\"GPU-a0\",server=\"" + server_id + "\"}";
    CHECK(value(text, "vcuda_mgmt_gpu_leased_memory_bytes" + a0) == 6 * GiB);
    CHECK(value(text, "vcuda_mgmt_gpu_leases" + a0) == 2);
    CHECK(value(text, "vcuda_mgmt_gpu_sessions" + a0) == 2);
    CHECK(value(text, "vcuda_mgmt_gpu_utilization_percent" + a0) == 50);
    CHECK(value(text, R"(vcuda_mgmt_sessions{state="active"})") == 1);
    CHECK(value(text, R"(vcuda_mgmt_sessions{state="suspended"})") == 1);
    CHECK(value(text, R"(vcuda_mgmt_leases{state="active"})") == 1);
    CHECK(value(text, R"(vcuda_mgmt_leases{state="suspended"})") == 1);
    CHECK(value(text, R"(vcuda_mgmt_tenant_leases{tenant="alice"})") == 1);
    CHECK(value(text, R"(vcuda_mgmt_tenant_leased_memory_bytes{tenant="alice"})") == 4 * GiB);
    CHECK(value(text, R"(vcuda_mgmt_tenant_leased_memory_bytes{tenant="bob"})") == 2 * GiB);
    CHECK(value(text, R"(vcuda_mgmt_tenant_memory_used_bytes{tenant="alice"})") == 3 * GiB);
    CHECK(value(text, R"(vcuda_mgmt_tenant_memory_used_bytes{tenant="bob"})") == 1 * GiB);
    CHECK(value(text, R"(vcuda_mgmt_events_total{kind="suspend"})") == 1);
    CHECK(text.find("# TYPE vcuda_mgmt_events_total counter\n") != std::string::npos);

    // Releasing alice's lease: her leases and memory go, the GPU keeps bob's.
    f.call("lease.release", {{"lease_id", alice_lease}}, alice);
    const std::string after = f.svc.metrics();
    CHECK_FALSE(vcuda::test::metric(after, R"(vcuda_mgmt_tenant_leases{tenant="alice"})"));
    CHECK(value(after, "vcuda_mgmt_gpu_leased_memory_bytes" + a0) == 2 * GiB);
}

TEST_CASE("vcuda-mgmt --metrics-listen serves scrapes, and a network address needs --insecure",
          "[integration][mgmt]") {
    temp_dir dir;
    { std::ofstream(dir / "secret") << secret << "\n"; }
    ::chmod((dir / "secret").c_str(), 0600);
    const std::string bin = VCUDA_BIN_DIR "/vcuda-mgmt";
    auto args = [&](const std::string& metrics, std::vector<std::string> more = {}) {
        std::vector<std::string> a{
            bin,          "--listen",      "unix:" + dir / "m.sock", "--db",
            dir / "m.db", "--secret-file", dir / "secret",           "--metrics-listen",
            metrics};
        a.insert(a.end(), more.begin(), more.end());
        return a;
    };
    auto log = [&] {
        std::ifstream in(dir / "mgmt.log");
        return std::string(std::istreambuf_iterator<char>(in), {});
    };

    auto refused = child_process::spawn(args("0.0.0.0:0"), dir / "mgmt.log");
    const int status = refused.wait();
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 2));
    CHECK(log().find("refusing to serve metrics on a network address") != std::string::npos);

    auto mgr = child_process::spawn(args("127.0.0.1:0"), dir / "mgmt.log");
    uint16_t port = 0;
    REQUIRE(eventually([&] { return (port = vcuda::test::metrics_port(log())) != 0; }));
    const std::string answer = vcuda::test::scrape(port);
    INFO(answer);
    CHECK(answer.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(vcuda::test::metric(answer, R"(vcuda_mgmt_leases{state="active"})") == 0);
    CHECK(vcuda::test::http_exchange(port, "GET /debug HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
}
